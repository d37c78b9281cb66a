"""``peerwatch stream`` — run one stream-processor worker (faust). Start more for more partitions."""

from __future__ import annotations

import argparse
from typing import Any

from peerwatch.commands import settings_of


def register(sub: Any) -> None:
    p = sub.add_parser("stream", help="run a stream worker: attribution, detection, drain policy")
    p.add_argument("--window-s", type=int, default=30, help="event-time window (default 30)")
    p.add_argument("--lateness-s", type=float, default=5.0, help="allowed lateness of samples")
    p.add_argument("--job-grace-s", type=float, default=30.0,
                   help="how long past a window's end a job waits for nodes still missing")  # fmt: skip
    p.add_argument("--batch-max", type=int, default=2000, help="samples per hot-path batch")
    p.add_argument("--app-id", default="peerwatch-stream", help="consumer group / app id")
    p.add_argument("--loglevel", default="info")
    p.add_argument("--counters-file", metavar="FILE",
                   help="write the worker's counters as JSON to FILE (benchmarks, tests)")  # fmt: skip
    p.add_argument("--counters-interval-s", type=float, default=5.0,
                   help="how often --counters-file is rewritten (default 5)")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import faust

    from peerwatch.streams.core.settings import DetectorSettings
    from peerwatch.streams.live.app import StreamSettings, build_app, internal_topics
    from peerwatch.topic_admin import ensure_topics
    from peerwatch.topics import catalogue

    settings = settings_of(args)
    stream = StreamSettings(
        app_id=args.app_id,
        window_s=args.window_s,
        lateness_s=args.lateness_s,
        job_grace_s=args.job_grace_s,
        batch_max=args.batch_max,
        counters_path=args.counters_file,
        counters_interval_s=args.counters_interval_s,
        detector=DetectorSettings(window_s=args.window_s),
    )
    ensure_topics(
        settings.kafka, [*catalogue(settings.topic_prefix), *internal_topics(settings, stream)]
    )
    app = build_app(settings, stream)
    worker = faust.Worker(app, loglevel=args.loglevel, redirect_stdouts=False)
    worker.execute_from_commandline()
    return 0
