"""``peerwatch replay [--from T --to T] (--kafka | --archive DIR)`` — run a time range (with
``--archive`` and no range: the whole archive) through the same stages as the live stream,
offline and deterministically, with the settings tree's ``[stream]``, ``[detector]`` and
``[policy]`` tables (``--config``, ``PEERWATCH_*``; see :mod:`peerwatch.streams.offline.replay`). ``--findings`` writes findings and recommendations as
JSON lines; ``--report`` an incident report (HTML). Prints a JSON summary on stdout."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.errors import ConfigError, ServiceError
from peerwatch.output_paths import check_output_file, write_output
from peerwatch.settings import Settings, with_overrides


def parse_time_ms(text: str) -> int:
    """Epoch ms, or an ISO 8601 time (UTC when no zone is given). Raises ConfigError."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError("time", f"{text!r} is neither epoch ms nor ISO 8601") from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def register(sub: Any) -> None:
    p = sub.add_parser("replay", help="replay a time range offline through the detector")
    p.add_argument("--from", dest="from_",
                   help="start (epoch ms or ISO 8601); default with --archive: the archive's "
                        "first hour")  # fmt: skip
    p.add_argument("--to", help="end, exclusive (epoch ms or ISO 8601); default with --archive: "
                                "the end of the archive's last hour")  # fmt: skip
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--kafka", action="store_true", help="read the range from Kafka")
    src.add_argument("--archive", metavar="DIR", help="read archive files (archive/simulate)")
    p.add_argument("--job", help="keep only outputs of this job (the detector sees all GPUs)")
    p.add_argument("--node", help="keep only outputs of this node")
    p.add_argument("--findings", metavar="FILE", help="write findings + recommendations (JSONL)")
    p.add_argument("--report", metavar="FILE", help="write an incident report (HTML)")
    p.add_argument("--window-s", type=int, help="overrides detector.window_s (as `stream`)")
    p.add_argument("--lateness-s", type=float, help="overrides stream.lateness_s")
    p.add_argument("--job-grace-s", type=float, help="overrides stream.job_grace_s")
    p.add_argument("--settings-from", choices=["live", "config"],
                   help="live: the [stream]/[detector]/[policy] settings the stream worker "
                        "published for the start of the range (topic peerwatch.stream.settings); "
                        "config: the settings tree. Default: live with --kafka, config with "
                        "--archive. Flags such as --window-s override either")  # fmt: skip
    p.add_argument("--lookback-s", type=float, default=86400.0,
                   help="read job events this far before --from (jobs that started earlier)")  # fmt: skip
    p.add_argument("--workers", type=int, default=1,
                   help="processes decoding archive files")  # fmt: skip
    p.add_argument("--reorder-s", type=float, default=30.0,
                   help="how far samples of an archive may be out of event-time order for it "
                        "to be read as a stream, the span of samples held (default 30; an "
                        "archive out of order by more is read again with a window twice its lag)")  # fmt: skip
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (there is none unless stderr is a terminal)",
    )
    p.set_defaults(func=run)


def time_range(args: argparse.Namespace) -> Any:
    """The replay's TimeRange: ``--from``/``--to``, where one is missing with ``--archive`` the
    archive's own start or end (its first and last hour of samples). Raises ConfigError."""
    from peerwatch.streams.offline.job_records import archive_span_ms
    from peerwatch.streams.offline.replay import TimeRange

    if args.kafka and (args.from_ is None or args.to is None):
        raise ConfigError("--from", "--from and --to are required with --kafka")
    if not args.kafka and not Path(args.archive).is_dir():
        raise ConfigError("--archive", f"{args.archive} is not a directory")
    if not args.kafka:
        from peerwatch.streams.offline.job_records import check_archive_prefix

        check_archive_prefix(Path(args.archive), settings_of(args).topic_prefix)
    whole = (0, 0)
    if args.from_ is None or args.to is None:
        found = archive_span_ms(Path(args.archive), settings_of(args).topic_prefix)
        if found is None:
            raise ConfigError("--archive", f"{args.archive} holds no sample files")
        whole = found
    from_ms = parse_time_ms(args.from_) if args.from_ is not None else whole[0]
    to_ms = parse_time_ms(args.to) if args.to is not None else whole[1]
    if to_ms <= from_ms:
        raise ConfigError("--to", "must be after --from")
    return TimeRange(from_ms, to_ms, int(args.lookback_s * 1000))


def run(args: argparse.Namespace) -> int:
    from peerwatch import gc_tuning
    from peerwatch.streams.offline.replay import output_lines

    gc_tuning.tune()
    # Checked before the replay: a path that cannot be written fails now, not after the work.
    findings = check_output_file(args.findings, "--findings") if args.findings else None
    report = check_output_file(args.report, "--report") if args.report else None
    result, span, extra = replay_from_args(args)
    if findings is not None:
        write_output(findings, "".join(output_lines(result)), "--findings")
    if report is not None:
        from peerwatch.exporters.report import render_report

        page = render_report(result.windows, result.findings, result.recommendations,
                             result.events, from_ms=span.from_ms, to_ms=span.to_ms)  # fmt: skip
        write_output(report, page, "--report")
    print(json.dumps({**result.summary(), **extra}))
    return 0


def replay_from_args(args: argparse.Namespace, keep_windows: bool | None = None) -> Any:
    """Run the replay the options ``args`` describe; returns (ReplayResult, TimeRange, extra
    facts for the summary). ``keep_windows``: default, only with ``--report``. Raises
    ConfigError for bad options and ServiceError when Kafka cannot be read."""
    from peerwatch.console import EventTimeProgress
    from peerwatch.streams.offline.replay import live_equivalent_settings

    if keep_windows is not None:
        args.keep_windows = keep_windows
    span = time_range(args)
    if args.reorder_s < 0:
        raise ConfigError("--reorder-s", "must be >= 0")
    extra: dict[str, Any] = {}
    tree = with_overrides(_replay_settings(args, span, extra), _overrides(args))
    pipeline = live_equivalent_settings(tree)
    keep = _scope(args, span, extra)
    progress = EventTimeProgress(span.from_ms, span.to_ms, sys.stderr,
                                 enabled=not args.no_progress)  # fmt: skip
    result = None
    if not args.kafka and args.workers <= 1:
        result = _column_replay(args, span, pipeline, keep, progress, extra)
    if result is None:
        extra["path"] = "decoded"
        result = _replay(args, span, pipeline, keep, progress, extra)
    return result, span, extra


def _keep_windows(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "keep_windows", False) or args.report)


def _replay_settings(args: argparse.Namespace, span: Any, extra: dict[str, Any]) -> Settings:
    """The tree, with the live worker's published tables where ``--settings-from live`` (the
    default with ``--kafka``) finds a record for the start of the range; else the config's.
    Raises ServiceError when the settings topic cannot be read."""
    tree = settings_of(args)
    extra["settings_from"] = "config"
    if (args.settings_from or ("live" if args.kafka else "config")) != "live":
        return tree
    from confluent_kafka import KafkaException

    from peerwatch.streams.live.published_settings import live_settings, read_published
    from peerwatch.topics import STREAM_SETTINGS

    try:
        records = read_published(tree.kafka, tree.topic_prefix + STREAM_SETTINGS.name)
    except KafkaException as exc:
        raise ServiceError(f"cannot read the published stream settings: {exc}") from exc
    settings, source = live_settings(tree, records, span.from_ms)
    if source is None:
        logging.getLogger(__name__).warning(
            "replay: no settings published by %s before the range; using the config's",
            tree.stream.app_id,
        )
        return tree
    extra["settings_from"] = source
    return settings


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The tree settings this command's flags override (None: flag not given)."""
    return {
        "detector.window_s": args.window_s,
        "stream.lateness_s": args.lateness_s,
        "stream.job_grace_s": args.job_grace_s,
    }


def _scope(args: argparse.Namespace, span: Any, extra: dict[str, Any]) -> frozenset[str] | None:
    """The nodes whose samples a ``--job``/``--node`` replay reads (None: all)."""
    from peerwatch.streams.offline.replay import archive_job_events, scope_nodes

    if not (args.job or args.node):
        return None
    settings = settings_of(args)
    if args.kafka:
        from peerwatch.streams.offline.replay_kafka import kafka_records

        job_events, _ = kafka_records(
            settings.kafka, span, settings.topic_prefix, streams=("job-events",)
        )
        events = [v for _, _, v in job_events]
    else:
        events = archive_job_events(Path(args.archive), span, settings.topic_prefix)
    keep = scope_nodes(events, args.job, args.node)
    extra["nodes_in_scope"] = len(keep or ())
    return keep


def _replay(
    args: argparse.Namespace, span: Any, pipeline: Any, keep: Any, progress: Any,
    extra: dict[str, Any],
) -> Any:  # fmt: skip
    """The replay through decoded records (any schema version, ``--workers`` decoders)."""
    from peerwatch.streams.offline.replay import archive_records, replay

    settings = settings_of(args)
    read_s = 0.0
    records: Any
    if args.kafka:
        from peerwatch.streams.offline.replay_kafka import kafka_records

        t0 = time.perf_counter()
        records, extra["undecodable"] = kafka_records(
            settings.kafka, span, settings.topic_prefix, keep_nodes=keep
        )
        # Fetching and decoding are part of the replay's cost: the rate covers them.
        read_s = time.perf_counter() - t0
    else:
        from peerwatch.io.archive.layout import ReadStats

        stats = ReadStats()
        records = archive_records(Path(args.archive), span, settings.topic_prefix, args.workers,
                                  keep_nodes=keep, stats=stats)  # fmt: skip
    result = replay(records, pipeline, job=args.job, node=args.node,
                    keep_windows=_keep_windows(args), progress=progress)  # fmt: skip
    if not args.kafka:
        extra.update(stats.as_dict())
    result.wall_s += read_s
    return result


def _column_replay(
    args: argparse.Namespace, span: Any, settings: Any, keep: Any, progress: Any,
    extra: dict[str, Any],
) -> Any:  # fmt: skip
    """An archive replay with the samples read as columns by the C decoder, block by block
    (the same outputs as the decoded path, several times faster); None where it cannot run
    (no C module, sample files of another schema version): then the decoded path runs. An
    archive out of order by more than ``--reorder-s`` is replayed again with a window wide enough
    (:func:`~peerwatch.streams.offline.sample_runs.wider_window_ms`), at most whole hours."""
    from peerwatch.io.archive.layout import ReadStats
    from peerwatch.schemas.compiled import Unsupported
    from peerwatch.streams.core.pipeline import Pipeline
    from peerwatch.streams.offline.replay import column_archive_records, replay
    from peerwatch.streams.offline.sample_runs import ArchiveUnordered, wider_window_ms

    prefix = settings_of(args).topic_prefix
    kept = {"job": args.job, "node": args.node, "keep_windows": _keep_windows(args)}
    reorder: int | None = int(args.reorder_s * 1000)
    while True:
        pipeline = Pipeline(settings, kept["keep_windows"])
        stats = ReadStats()
        try:
            records = column_archive_records(
                Path(args.archive),
                span,
                pipeline.aggregator.strings,
                prefix,
                keep,
                reorder,
                stats,
            )
            result = replay(records, settings, progress=progress, pipeline=pipeline, **kept)
        except ArchiveUnordered as exc:
            if reorder is None:
                raise
            # Memory follows the window: widen it as far as this archive needs, not to an hour
            # at once (an hour of a 100,000-GPU fleet is far more than any machine holds).
            reorder = wider_window_ms(reorder, exc.needed_ms)
            held = "whole hours sorted" if reorder is None else f"--reorder-s {reorder / 1000:g}"
            logging.getLogger(__name__).warning("replay: %s; replaying again with %s", exc, held)
            continue
        except Unsupported as exc:
            logging.getLogger(__name__).warning("replay: columns not used (%s)", exc)
            return None
        extra["path"] = "columns"
        extra["reorder_s"] = None if reorder is None else reorder / 1000
        extra.update(stats.as_dict())
        return result
