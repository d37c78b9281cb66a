"""``peerwatch export otlp|stdout|alertmanager`` — publish the output topics as OTLP, JSON
lines or Alertmanager alerts.

``otlp``: GpuWindows and the NIC samples (per port) become OTLP metrics, findings/recommendations/health results/drain actions
OTLP events, sent to a collector over gRPC (default ``http://127.0.0.1:4317``) or HTTP/protobuf
(e.g. ``--protocol http --endpoint http://127.0.0.1:4318``). ``stdout``: the same mapping as JSON
lines, for local debugging. ``alertmanager``: findings and drain recommendations as alerts
through Alertmanager's v2 API (``[alertmanager]`` settings; :mod:`peerwatch.exporters.alertmanager`).
Runs until SIGTERM/SIGINT, then flushes.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.settings import Settings

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("export", help="export windows and findings as OTLP or JSON lines")
    targets = p.add_subparsers(dest="target", metavar="TARGET", required=True)

    otlp = targets.add_parser("otlp", help="OTLP metrics and events to a collector")
    # Each flag overrides the [export] setting of the same name (settings tree, --config).
    otlp.add_argument("--endpoint", help="collector URL (HTTP usually :4318)")
    otlp.add_argument("--protocol", choices=["grpc", "http"])
    otlp.add_argument("--interval-s", type=float, help="metric export interval")
    otlp.add_argument("--timeout-s", type=float, help="per-export deadline, retries included")
    otlp.add_argument("--max-series", type=int, help="cap on exported GPU-in-job series")
    otlp.add_argument("--stale-after-s", type=float, help="drop a series after this long idle")
    otlp.add_argument(
        "--max-queued-events", type=int, help="events held while the collector is down"
    )
    otlp.add_argument("--group-id", default="peerwatch-export-otlp")
    otlp.set_defaults(func=run)

    stdout = targets.add_parser("stdout", help="JSON lines on stdout, for debugging")
    stdout.add_argument("--group-id", default="peerwatch-export-stdout")
    stdout.set_defaults(func=run)

    am = targets.add_parser("alertmanager", help="findings and recommendations as alerts")
    am.add_argument("--url", help="Alertmanager base URL (overrides alertmanager.url)")
    am.add_argument("--resend-s", type=float, help="re-send active alerts this often")
    am.add_argument("--group-id", default="peerwatch-export-alertmanager")
    am.set_defaults(func=run_alertmanager)


def _sink(args: argparse.Namespace, settings: Settings) -> Any:
    if args.target == "stdout":
        from peerwatch.exporters.stdout import StdoutSink

        return StdoutSink()
    from peerwatch.exporters.otlp_sdk import otlp_sink

    return otlp_sink(settings.export, network=settings.network)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The ``[export]`` settings the otlp flags override (None: flag not given)."""
    if args.target != "otlp":
        return {}
    names = ("endpoint", "protocol", "interval_s", "timeout_s", "max_series", "stale_after_s",
             "max_queued_events")  # fmt: skip
    return {f"export.{name}": getattr(args, name) for name in names}


def run(args: argparse.Namespace) -> int:
    from peerwatch.exporters.consume import kafka_export_loop

    settings = settings_of(args, _overrides(args))
    sink = _sink(args, settings)
    loop, consumer, deadletter = kafka_export_loop(
        settings.kafka,
        sink,
        group_id=args.group_id,
        topic_prefix=settings.topic_prefix,
        nic=args.target == "otlp",
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("export %s: reading the output topics (prefix %r)", args.target, settings.topic_prefix)
    try:
        stats = loop.run(stop)
    finally:
        sink.close()
        consumer.close()
        undelivered = deadletter.flush()
    if undelivered:
        log.error("%d dead-letter records were not delivered", undelivered)
    extra = sink.stats() if hasattr(sink, "stats") else {}
    log.info("export %s stopped: %s %s", args.target, stats, extra)
    return 0


def run_alertmanager(args: argparse.Namespace) -> int:
    from peerwatch.exporters.alertmanager import kafka_alert_export, run_alert_export

    overrides = {"alertmanager.url": args.url, "alertmanager.resend_s": args.resend_s}
    settings = settings_of(args, overrides)
    loop, consumer, progress, sender, deadletter = kafka_alert_export(
        settings.kafka,
        settings.alertmanager,
        group_id=args.group_id,
        topic_prefix=settings.topic_prefix,
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info(
        "export alertmanager: %s, replaying %d partitions with records (prefix %r)",
        sender.client.url,
        len(progress.ends),
        settings.topic_prefix,
    )
    try:
        run_alert_export(loop, consumer, progress, sender, stop)
    finally:
        consumer.close()
        undelivered = deadletter.flush()
    if undelivered:
        log.error("%d dead-letter records were not delivered", undelivered)
    log.info("export alertmanager stopped: %s %s %s", loop.stats, sender.book.stats, sender.stats)
    return 0
