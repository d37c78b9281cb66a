"""``peerwatch prometheus start|stop|status`` — a local Prometheus fed by a local collector.

Starts the OpenTelemetry Collector built by ``scripts/build-collector.sh`` (OTLP on
127.0.0.1:4317/4318, a Prometheus endpoint on 127.0.0.1:8889) and Debian's Prometheus 2.x
(127.0.0.1:9090) scraping it with peerwatch's rules loaded. Then ``peerwatch export otlp`` and
every peerwatch process with ``telemetry.endpoint`` set show up in Prometheus.
"""

from __future__ import annotations

import argparse
from typing import Any

from peerwatch.commands import settings_of


def register(sub: Any) -> None:
    p = sub.add_parser("prometheus",
                       help="run a local Prometheus and OpenTelemetry Collector on 127.0.0.1")  # fmt: skip
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--port", type=int, default=9090, help="Prometheus port (default 9090)")
    p.add_argument("--otlp-grpc-port", type=int, default=4317, help="collector OTLP/gRPC port")
    p.add_argument("--otlp-http-port", type=int, default=4318, help="collector OTLP/HTTP port")
    p.add_argument("--metrics-port", type=int, default=8889,
                   help="collector's Prometheus endpoint, scraped by Prometheus")  # fmt: skip
    p.add_argument("--scrape-interval-s", type=float, default=5.0, help="scrape interval (s)")
    p.add_argument("--collector-bin", help="collector binary (default: build or reuse it)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from peerwatch.local.collector import LocalCollector, find_binary
    from peerwatch.local.prometheus import RULES_FILE, LocalPrometheus
    from peerwatch.settings import expand

    settings = settings_of(args)
    state = expand(settings.state_dir)
    prometheus = LocalPrometheus(
        state_dir=state, port=args.port, targets=(f"127.0.0.1:{args.metrics_port}",),
        scrape_interval_s=args.scrape_interval_s,
        rule_files=(RULES_FILE,) if RULES_FILE.is_file() else (),
    )  # fmt: skip

    def collector(binary: Path) -> LocalCollector:
        return LocalCollector(binary, state, args.otlp_grpc_port, args.otlp_http_port,
                              args.metrics_port)  # fmt: skip

    # stop and status need no binary: the pid file is under the state folder.
    idle = collector(Path(args.collector_bin or "peerwatch-otelcol"))
    if args.action == "start":
        otelcol = collector(find_binary(expand(settings.cache_dir), args.collector_bin))
        print(f"collector {otelcol.start(timeout_s=args.timeout)}: OTLP {otelcol.grpc_endpoint} "
              f"(gRPC), {otelcol.http_endpoint} (HTTP) (log: {otelcol.log_file})")  # fmt: skip
        outcome = prometheus.start(timeout_s=args.timeout)
        print(f"prometheus {outcome}: {prometheus.url} (log: {prometheus.log_file})")
    elif args.action == "stop":
        print(f"prometheus {prometheus.stop()}")
        print(f"collector {idle.stop()}")
    else:
        status = prometheus.status()
        print(f"prometheus {status}\ncollector {idle.status()}")
        return 0 if status.startswith("running") else 1
    return 0
