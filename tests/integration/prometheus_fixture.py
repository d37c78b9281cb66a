"""pytest plugin: a real Prometheus (Debian's package) fed by a real OpenTelemetry Collector,
both started by the project's own code (:mod:`peerwatch.local.prometheus`,
:mod:`peerwatch.local.collector`) on free loopback ports, scraping every second with
peerwatch's rules loaded. Never skips: a missing binary or a failed start fails the test."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from peerwatch.errors import ServiceError
from peerwatch.local.collector import LocalCollector
from peerwatch.local.prometheus import RULES_FILE, LocalPrometheus
from tests.integration.collector_fixture import collector_binary


@dataclass(frozen=True)
class PrometheusStack:
    collector: LocalCollector
    prometheus: LocalPrometheus


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="session")
def prometheus_stack() -> Iterator[PrometheusStack]:
    binary = collector_binary()
    state = Path(tempfile.mkdtemp(prefix="peerwatch-prometheus-"))
    errors: list[str] = []
    for _attempt in range(3):  # a probed free port can be taken before it is bound
        grpc_port, http_port, metrics_port, prom_port = _free_ports(4)
        collector = LocalCollector(binary, state, grpc_port, http_port, metrics_port)
        prometheus = LocalPrometheus(
            state_dir=state, targets=(collector.metrics_target,), port=prom_port,
            scrape_interval_s=1.0, rule_files=(RULES_FILE,),
        )  # fmt: skip
        try:
            collector.start()
            prometheus.start()
            break
        except ServiceError as exc:
            errors.append(str(exc))
            prometheus.stop()
            collector.stop()
    else:
        pytest.fail("Prometheus and the collector did not start:\n" + "\n---\n".join(errors))
    try:
        yield PrometheusStack(collector, prometheus)
    finally:
        prometheus.stop()
        collector.stop()
