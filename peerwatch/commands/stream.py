"""``peerwatch stream`` — run one stream-processor worker (faust). Start more for more partitions.

Every detector and policy number comes from the settings tree (``--config``, ``PEERWATCH_*``);
the flags below override the tree's ``[stream]`` and ``detector.window_s`` values."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from peerwatch.commands import settings_of

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("stream", help="run a stream worker: attribution, detection, drain policy")
    p.add_argument("--window-s", type=int, help="event-time window (detector.window_s)")
    p.add_argument(
        "--lateness-s", type=float, help="allowed lateness of samples (stream.lateness_s)"
    )
    p.add_argument("--job-grace-s", type=float,
                   help="how long past a window's end a job waits for nodes still missing "
                        "(stream.job_grace_s)")  # fmt: skip
    p.add_argument(
        "--batch-max", type=int, help="most node records per hot-stage batch (stream.batch_max)"
    )
    p.add_argument("--app-id", help="consumer group / app id (stream.app_id)")
    p.add_argument("--loglevel", default="info")
    p.add_argument("--counters-file", metavar="FILE",
                   help="write the worker's counters as JSON to FILE (stream.counters_path)")  # fmt: skip
    p.add_argument("--counters-interval-s", type=float,
                   help="how often --counters-file is rewritten (stream.counters_interval_s)")  # fmt: skip
    p.set_defaults(func=run)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The tree settings this command's flags override (None: flag not given)."""
    return {
        "detector.window_s": args.window_s,
        "stream.lateness_s": args.lateness_s,
        "stream.job_grace_s": args.job_grace_s,
        "stream.batch_max": args.batch_max,
        "stream.app_id": args.app_id,
        "stream.counters_path": args.counters_file,
        "stream.counters_interval_s": args.counters_interval_s,
    }


def run(args: argparse.Namespace) -> int:
    import faust

    from peerwatch import gc_tuning
    from peerwatch.streams.live.app import build_app, internal_topics
    from peerwatch.streams.live.published_settings import publish_settings
    from peerwatch.topic_admin import ensure_topics
    from peerwatch.topics import catalogue

    gc_tuning.tune()
    settings = settings_of(args, overrides(args))
    ensure_topics(
        settings.kafka,
        [
            *catalogue(settings.topic_prefix, settings.stream.node_partitions),
            *internal_topics(settings),
        ],
    )
    # What this worker runs with, for replays of its time (peerwatch replay --settings-from live).
    publish_settings(settings, int(time.time() * 1000))
    app = build_app(settings)
    worker = _quiet_worker(faust.Worker)(app, loglevel=args.loglevel, redirect_stdouts=False)
    watch = watch_recovery(app, settings.stream.recovery_timeout_s)
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if not watch.fired:  # else faust's own status (0) would hide why it stopped
            raise
    finally:
        watch.stop()
    return EXIT_RECOVERY_STUCK if watch.fired else 0


#: Exit status of a worker whose table recovery got stuck (the service manager restarts it).
EXIT_RECOVERY_STUCK = 3
#: After asking faust to stop (SIGTERM), how long before the process is ended regardless (s):
#: a worker stuck in recovery may not stop cleanly either.
STOP_GRACE_S = 30.0


def watch_recovery(app: Any, timeout_s: float) -> Any:
    """Start the recovery watchdog (:mod:`peerwatch.streams.live.recovery_watchdog`) of ``app``:
    a recovery without progress for ``timeout_s`` is logged as an error, the worker asked to
    stop (SIGTERM, as a service manager would) and, failing that, ended after
    :data:`STOP_GRACE_S`, with exit status :data:`EXIT_RECOVERY_STUCK`."""
    import os
    import signal
    import threading

    from peerwatch.streams.live.recovery_watchdog import (
        RecoveryWatch,
        RecoveryWatchdog,
        faust_recovery_state,
    )

    counters = app.peerwatch_counters

    def on_stuck(stalled_s: float, remaining: int | None) -> None:
        left = "an unknown number of" if remaining is None else str(remaining)
        log.error(
            "stream: faust's table recovery made no progress for %.0f s (%s changelog records "
            "left to read); the worker exits with status %d to be restarted "
            "(stream.recovery_timeout_s = %g)",
            stalled_s, left, EXIT_RECOVERY_STUCK, timeout_s,
        )  # fmt: skip
        ender = threading.Timer(STOP_GRACE_S, os._exit, args=(EXIT_RECOVERY_STUCK,))
        ender.daemon = True
        ender.start()
        os.kill(os.getpid(), signal.SIGTERM)

    def report(stalled_s: float) -> None:
        counters.recovery_stalled_s = stalled_s

    return RecoveryWatch(
        RecoveryWatchdog(timeout_s),
        lambda: faust_recovery_state(app),
        on_stuck,
        interval_s=min(5.0, timeout_s / 4),
        report=report,
    ).start()


def _quiet_worker(base: Any) -> Any:
    """faust's Worker without its terminal spinner. At ``--loglevel warning`` or above faust
    adds a spinner handler and sets the ROOT logger to DEBUG, so every ``log.debug`` in
    aiokafka and faust (one per message produced) builds and handles a log record: a tenth of a
    busy worker's time, measured with py-spy. Without the spinner the root logger keeps the
    level asked for."""

    class QuietWorker(base):  # type: ignore[misc]
        def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
            self.spinner = None

    return QuietWorker
