"""Per-port NIC metrics through the real OpenTelemetry Collector into a real Prometheus.

Simulated NodeNicSample records (4 nodes x 2 ports, one port down for 30 s, one with a
symbol-error burst) -> :class:`~peerwatch.exporters.otlp_sdk.OtlpSink` (the SDK's OTLP/HTTP
exporter) -> the collector's prometheus exporter -> Prometheus, scraping every second. Expected
values are read off the raw records (the last pair of readings of each port: the simulator ticks
every 2 s, the sink closes a span every second), never from constants. The Kafka path (the export
loop subscribing to ``peerwatch.nic.samples``) is in test_prometheus.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from peerwatch.exporters.otlp_nic import series_per_port
from peerwatch.exporters.otlp_sdk import OtlpSink, otlp_sink
from peerwatch.producers.nic.counters import downtime
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.settings import ExportSettings
from tests.integration.prometheus_fixture import PrometheusStack

pytestmark = pytest.mark.timeout(300)

INTERVAL_S, DURATION_S = 2.0, 120
DOWN, BURST = ("gpu00001", "mlx5_0/1"), ("gpu00002", "mlx5_1/1")


def nic_samples() -> list[dict[str, Any]]:
    now_ms = int(time.time() * 1000) - (DURATION_S + 10) * 1000
    doc = {
        "fleet": {"nodes": 4, "gpus_per_node": 8, "interval_s": INTERVAL_S,
                  "duration_s": DURATION_S, "seed": 5, "start_ms": now_ms, "nics_per_node": 2},
        "jobs": [{"job_id": "6001", "gpus": 32, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "faults": [
            {"name": "nic_port_down", "node": DOWN[0], "start_s": 30, "end_s": 60,
             "params": {"port": 0}},
            {"name": "nic_symbol_errors", "node": BURST[0], "start_s": 20,
             "params": {"port": 1, "errors_per_s": 40}},
        ],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    return [r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "nic-samples"]


def wait_query(
    stack: PrometheusStack, promql: str, ready: Callable[[list[Any]], bool]
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:
        result = stack.prometheus.query(promql)
        if ready(result) or time.monotonic() > deadline:
            return result
        time.sleep(1.0)


@contextmanager
def exported(
    stack: PrometheusStack, samples: list[dict[str, Any]], **export: Any
) -> Iterator[tuple[OtlpSink, str]]:
    """An OTLP sink to the collector with ``samples`` written and flushed, and the job label of
    its series: a service namespace of its own (the collector makes it ``<ns>/peerwatch``), so
    only this test's series are selected, whatever else the collector holds."""
    run = f"nic{time.time_ns()}"
    sink = otlp_sink(
        ExportSettings(endpoint=stack.collector.http_endpoint, protocol="http", interval_s=1.0,
                       **export),
        resource_attributes={"service.namespace": run},
    )  # fmt: skip
    try:
        for s in samples:
            sink.write("NodeNicSample", s)
        assert sink.flush(), sink.stats()
        yield sink, f"{run}/peerwatch"
    finally:
        sink.close()


def by_port(result: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(s["metric"]["host_name"], s["metric"]["network_interface_name"]): float(s["value"][1])
            for s in result}  # fmt: skip


def test_per_port_metrics_reach_prometheus_with_their_names_labels_and_values(
    prometheus_stack: PrometheusStack,
) -> None:
    samples = nic_samples()
    readings: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
    for s in samples:
        for r in s["ports"]:
            readings.setdefault((s["node"], r["name"]), []).append((s["ts_ms"], r))
    assert len(readings) == 8
    with exported(prometheus_stack, samples) as (_sink, job):
        sel = f'job="{job}"'
        up = wait_query(prometheus_stack, f"peerwatch_nic_link_up_ratio{{{sel}}}",
                        lambda r: len(r) == len(readings))  # fmt: skip
        assert by_port(up) == {k: float(v[-1][1]["up"]) for k, v in readings.items()}
        labels = next(s["metric"] for s in up if s["metric"]["host_name"] == DOWN[0])
        assert labels["hw_type"] == "network" and labels["peerwatch_nic_device"] in (
            "mlx5_0",
            "mlx5_1",
        )

        def last(key: tuple[str, str], counter: str, scale: int = 1) -> float:
            (t0, r0), (t1, r1) = readings[key][-2:]
            return (r1["counters"][counter] - r0["counters"][counter]) * scale / ((t1 - t0) / 1e3)

        rx = by_port(prometheus_stack.prometheus.query(
            f'peerwatch_nic_io_rate_bytes_per_second{{{sel}, network_io_direction="receive"}}'))  # fmt: skip
        assert set(rx) == set(readings)
        for key in readings:
            assert math.isclose(rx[key], last(key, "port_rcv_data", 4), rel_tol=1e-9), key
        errors = by_port(prometheus_stack.prometheus.query(
            f"peerwatch_nic_errors_rate_per_second{{{sel}}}"))  # fmt: skip
        assert errors[BURST] >= 40 > max(v for k, v in errors.items() if k != BURST)
        speed = by_port(prometheus_stack.prometheus.query(
            f"peerwatch_nic_link_speed_Gbit_per_second{{{sel}}}"))  # fmt: skip
        rated = by_port(prometheus_stack.prometheus.query(
            f"peerwatch_nic_link_rated_speed_Gbit_per_second{{{sel}}}"))  # fmt: skip
        assert speed == rated == {k: v[-1][1]["rate_gbps"] for k, v in readings.items()}
        # The down port's seconds: the counter arithmetic's downtime over every reading.
        down = by_port(prometheus_stack.prometheus.query(
            f"peerwatch_nic_link_down_time_seconds_total{{{sel}}}"))  # fmt: skip
        states = [(t, r["up"]) for t, r in readings[DOWN]]
        expected = downtime(states, states[0][0] + 1, states[-1][0] + 1, int(2 * INTERVAL_S * 1e3))
        assert math.isclose(down[DOWN], expected.down_s) and down[DOWN] >= 28
        flaps = by_port(prometheus_stack.prometheus.query(
            f"peerwatch_nic_link_flaps_total{{{sel}}}"))  # fmt: skip
        assert flaps[DOWN] == expected.flaps == 1
        wait = by_port(prometheus_stack.prometheus.query(
            f"peerwatch_nic_xmit_wait_ratio{{{sel}}}"))  # fmt: skip
        assert set(wait) == set(readings) and all(0 <= v <= 1 for v in wait.values())
        # Bounded: at most one series per port and metric (io twice).
        names = prometheus_stack.prometheus.query(
            f'count by (__name__) ({{__name__=~"peerwatch_nic_.*", {sel}}})'
        )
        assert 0 < sum(int(s["value"][1]) for s in names) <= series_per_port() * len(readings)


def test_the_port_series_cap_holds_on_prometheus(prometheus_stack: PrometheusStack) -> None:
    # Node by node, a cap of 3 ports: the first node's two ports are exported, then the second
    # node's evict the least recently read of them (spans and series both count it).
    samples = sorted(nic_samples(), key=lambda s: (s["node"], s["ts_ms"]))
    samples = [s for s in samples if s["node"] in ("gpu00000", "gpu00001")]
    with exported(prometheus_stack, samples, max_series=3) as (sink, job):
        assert sink.discarded()["port_state_cap"] > 0
        up = wait_query(prometheus_stack, f'peerwatch_nic_link_up_ratio{{job="{job}"}}',
                        lambda r: bool(r))  # fmt: skip
        assert len(up) == 3 and sink.discarded()["port_series_cap"] == 1
        dropped = wait_query(
            prometheus_stack,
            f'peerwatch_exporter_discarded_total{{job="{job}", reason="port_state_cap"}}',
            lambda r: bool(r),
        )
        assert [float(s["value"][1]) for s in dropped] == [sink.discarded()["port_state_cap"]]
