"""``peerwatch replay --from T --to T (--kafka | --archive DIR)`` — run a time range through the
same stages as the live stream, offline and deterministically, with the live stream's settings
(see :mod:`peerwatch.exporters.replay`). ``--findings`` writes findings and recommendations as
JSON lines; ``--report`` an incident report (HTML). Prints a JSON summary on stdout."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.errors import ConfigError


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
    p.add_argument("--from", dest="from_", required=True, help="start (epoch ms or ISO 8601)")
    p.add_argument("--to", required=True, help="end, exclusive (epoch ms or ISO 8601)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--kafka", action="store_true", help="read the range from Kafka")
    src.add_argument("--archive", metavar="DIR", help="read archive files (archive/simulate)")
    p.add_argument("--job", help="keep only outputs of this job (the detector sees all GPUs)")
    p.add_argument("--node", help="keep only outputs of this node")
    p.add_argument("--findings", metavar="FILE", help="write findings + recommendations (JSONL)")
    p.add_argument("--report", metavar="FILE", help="write an incident report (HTML)")
    p.add_argument("--window-s", type=int, default=30, help="as the live stream's --window-s")
    p.add_argument("--lateness-s", type=float, default=5.0, help="as the live stream's")
    p.add_argument("--job-grace-s", type=float, default=30.0, help="as the live stream's")
    p.add_argument("--lookback-s", type=float, default=86400.0,
                   help="read job events this far before --from (jobs that started earlier)")  # fmt: skip
    p.add_argument("--workers", type=int, default=1, help="processes decoding archive files")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peerwatch.exporters.replay import (
        Progress,
        TimeRange,
        archive_job_events,
        archive_records,
        live_equivalent_settings,
        output_lines,
        replay,
        scope_nodes,
    )

    settings = settings_of(args)
    span = TimeRange(parse_time_ms(args.from_), parse_time_ms(args.to), int(args.lookback_s * 1000))
    if span.to_ms <= span.from_ms:
        raise ConfigError("--to", "must be after --from")
    pipeline = live_equivalent_settings(args.window_s, args.lateness_s, args.job_grace_s)
    extra: dict[str, Any] = {}
    read_s = 0.0
    if args.kafka:
        import time

        from peerwatch.exporters.replay_kafka import kafka_records

        t0 = time.perf_counter()
        records: Any
        keep = None
        if args.job or args.node:
            job_events, _ = kafka_records(
                settings.kafka, span, settings.topic_prefix, streams=("job-events",)
            )
            keep = scope_nodes((v for _, _, v in job_events), args.job, args.node)
            extra["nodes_in_scope"] = len(keep or ())
        records, extra["undecodable"] = kafka_records(
            settings.kafka, span, settings.topic_prefix, keep_nodes=keep
        )
        # Fetching and decoding are part of the replay's cost: the rate covers them.
        read_s = time.perf_counter() - t0
    else:
        if not Path(args.archive).is_dir():
            raise ConfigError("--archive", f"{args.archive} is not a directory")
        keep = None
        if args.job or args.node:
            keep = scope_nodes(
                archive_job_events(Path(args.archive), span, settings.topic_prefix),
                args.job,
                args.node,
            )
            extra["nodes_in_scope"] = len(keep or ())
        records = archive_records(
            Path(args.archive), span, settings.topic_prefix, args.workers, keep_nodes=keep
        )
    progress = None if args.no_progress else Progress(span, sys.stderr)
    result = None
    if not args.kafka and args.workers <= 1:
        result = _native_archive_replay(args, span, pipeline, keep, progress)
        extra["path"] = "native" if result is not None else "python"
    if result is None:
        result = replay(records, pipeline, job=args.job, node=args.node,
                        keep_windows=bool(args.report), progress=progress)  # fmt: skip
    result.wall_s += read_s
    if args.findings:
        with open(args.findings, "w") as fh:
            fh.writelines(output_lines(result))
    if args.report:
        from peerwatch.exporters.report import render_report

        page = render_report(result.windows, result.findings, result.recommendations,
                             result.events, from_ms=span.from_ms, to_ms=span.to_ms)  # fmt: skip
        Path(args.report).write_text(page)
    print(json.dumps({**result.summary(), **extra}))
    return 0


def _native_archive_replay(
    args: argparse.Namespace, span: Any, settings: Any, keep: Any, progress: Any
) -> Any:
    """The archive replay through the C sample path (same outputs, several times faster), or
    None where it is not built or cannot take this archive (the Python path then runs)."""
    import logging

    from peerwatch.exporters.replay import replay
    from peerwatch.exporters.replay_native import native_archive_records
    from peerwatch.streams import windows_native

    if not windows_native.available():
        return None
    node_ids: dict[str, int] = {}
    records = native_archive_records(
        Path(args.archive), span, node_ids, settings_of(args).topic_prefix, keep
    )
    try:
        return replay(records, settings, job=args.job, node=args.node,
                      keep_windows=bool(args.report), progress=progress,
                      pipeline=windows_native.NativePipeline(settings, node_ids))  # fmt: skip
    except windows_native.NativeUnsupported as exc:
        logging.getLogger(__name__).warning("replay: native path not used (%s)", exc)
        return None
