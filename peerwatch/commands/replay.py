"""``peerwatch replay --from T --to T (--kafka | --archive DIR)`` — run a time range through the
same stages as the live stream, offline and deterministically, with the live stream's settings
(see :mod:`peerwatch.streams.offline.replay`). ``--findings`` writes findings and recommendations as
JSON lines; ``--report`` an incident report (HTML). Prints a JSON summary on stdout."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
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
    p.add_argument("--workers", type=int, default=1,
                   help="processes decoding archive files")  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peerwatch.streams.offline.replay import (
        Progress,
        TimeRange,
        live_equivalent_settings,
        output_lines,
    )

    span = TimeRange(parse_time_ms(args.from_), parse_time_ms(args.to), int(args.lookback_s * 1000))
    if span.to_ms <= span.from_ms:
        raise ConfigError("--to", "must be after --from")
    if not args.kafka and not Path(args.archive).is_dir():
        raise ConfigError("--archive", f"{args.archive} is not a directory")
    pipeline = live_equivalent_settings(args.window_s, args.lateness_s, args.job_grace_s)
    extra: dict[str, Any] = {}
    keep = _scope(args, span, extra)
    progress = None if args.no_progress else Progress(span, sys.stderr)
    extra["path"] = "columns"
    result = _replay(args, span, pipeline, keep, progress, extra)
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
        records = archive_records(
            Path(args.archive), span, settings.topic_prefix, args.workers, keep_nodes=keep
        )
    result = replay(records, pipeline, job=args.job, node=args.node,
                    keep_windows=bool(args.report), progress=progress)  # fmt: skip
    result.wall_s += read_s
    return result
