"""peerwatch's own metrics: the pure tables and their SDK wiring, read back in memory."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum

from peerwatch.commands.agent import agent_snapshot
from peerwatch.exporters.self_metrics import (
    AGENT,
    ARCHIVER,
    COMPONENTS,
    DRAIN,
    STREAM,
    observations,
)
from peerwatch.exporters.self_telemetry import SelfTelemetry
from peerwatch.exporters.telemetry_start import start_self_telemetry
from peerwatch.producers.agent import AgentStats
from peerwatch.settings import TelemetrySettings
from peerwatch.streams.live.counters import StreamCounters


def collected(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics}  # fmt: skip


def exported_stream(counters: StreamCounters) -> dict[str, Any]:
    """The stream worker's metrics from ``counters``, collected once in memory."""
    reader = InMemoryMetricReader()
    telemetry = SelfTelemetry(TelemetrySettings(), "stream", counters.scalars,
                              metric_exporter=None, metric_readers=[reader])  # fmt: skip
    try:
        return collected(reader)
    finally:
        telemetry.close()


def test_every_stream_metric_reads_a_stream_counter() -> None:
    names = set(StreamCounters().scalars())
    assert {m.key for m in STREAM} <= names
    assert len({m.name for m in STREAM}) == len(STREAM)


def test_observations_skip_missing_none_and_non_finite_and_take_bools_as_numbers() -> None:
    got = observations(AGENT, {"records": 5, "spool_depth": None, "breaker_open": True,
                               "cpu_s": float("nan"), "dropped": "x"})  # fmt: skip
    assert got == {"peerwatch.agent.records": 5.0, "peerwatch.agent.breaker.open": 1.0}


def test_stream_counters_are_exported_as_counters_and_gauges() -> None:
    counters = StreamCounters()
    counters.batch_done(10, 80, start_wall_s=0.0, start_cpu_s=0.0)  # a long batch: wall time now
    counters.late, counters.windows, counters.consumer_lag = 3, 16, 42
    metrics = exported_stream(counters)
    late = metrics["peerwatch.stream.late"]
    assert isinstance(late.data, Sum) and late.data.is_monotonic
    assert late.data.data_points[0].value == 3
    assert metrics["peerwatch.stream.samples"].data.data_points[0].value == 10
    assert metrics["peerwatch.stream.gpu_readings"].data.data_points[0].value == 80
    lag = metrics["peerwatch.stream.consumer.lag"]
    assert isinstance(lag.data, Gauge) and lag.data.data_points[0].value == 42
    assert metrics["peerwatch.stream.batch.time"].unit == "s"
    assert metrics["peerwatch.stream.batch.time"].data.data_points[0].value > 0


def test_a_failing_snapshot_is_counted_and_exports_nothing() -> None:
    def broken() -> dict[str, Any]:
        raise RuntimeError("boom")

    reader = InMemoryMetricReader()
    telemetry = SelfTelemetry(TelemetrySettings(), "agent", broken,
                              metric_exporter=None, metric_readers=[reader])  # fmt: skip
    data = reader.get_metrics_data()
    telemetry.close()
    names = [] if data is None else [m.name for rm in data.resource_metrics
                                     for sm in rm.scope_metrics for m in sm.metrics]  # fmt: skip
    assert names == [] and telemetry.snapshot_errors >= 1


def test_agent_snapshot_names_every_agent_key() -> None:
    class Agent:
        stats = AgentStats(records=7, ticks=8, cpu_ms_total=1500.0, nic_records=5, nic_errors=1,
                           nic_read_errors=3, nic_cpu_ms_total=250.0)  # fmt: skip

    class Delivery:
        from peerwatch.producers.delivery import DeliveryStats

        stats = DeliveryStats(delivered=6, spooled=2)
        spooled_records = 2
        spooling = True

    snap = agent_snapshot(Agent(), Delivery())  # type: ignore[arg-type]
    assert {m.key for m in AGENT} <= set(snap)
    got = observations(AGENT, snap)
    assert got["peerwatch.agent.cpu.time"] == 1.5 and got["peerwatch.agent.breaker.open"] == 1.0
    assert got["peerwatch.agent.spool.depth"] == 2 and got["peerwatch.agent.records"] == 7
    assert (got["peerwatch.agent.nic.records"], got["peerwatch.agent.nic.errors"],
            got["peerwatch.agent.nic.read_errors"], got["peerwatch.agent.nic.cpu.time"]) == (
        5, 1, 3, 0.25)  # fmt: skip


def test_telemetry_is_off_without_an_endpoint() -> None:
    assert start_self_telemetry(TelemetrySettings(), "stream", dict) is None
    assert set(COMPONENTS) == {"stream", "agent", "archiver", "drain-controller"}


def test_archiver_and_drain_metrics_read_their_stats() -> None:
    import dataclasses

    from peerwatch.exporters.archive_loop import ArchiveStats
    from peerwatch.exporters.drain.controller import DrainStats

    for specs, stats in ((ARCHIVER, ArchiveStats()), (DRAIN, DrainStats())):
        keys = set(dataclasses.asdict(stats))
        assert {m.key for m in specs} <= keys, {m.key for m in specs} - keys
    # A gauge not yet known (no decision yet) exports nothing rather than a zero.
    assert "peerwatch.drain.breaker.open" not in observations(
        DRAIN, dataclasses.asdict(DrainStats())
    )


def test_node_clock_offsets_are_one_gauge_series_per_node_in_seconds() -> None:
    counters = StreamCounters()
    counters.clock_offsets_ms = {"gpu00002": -1500, "gpu00001": 2500, "gpu00003": 0}
    counters.clock_skewed_nodes = 2
    metrics = exported_stream(counters)
    offset = metrics["peerwatch.node.clock_offset"]
    assert isinstance(offset.data, Gauge) and offset.unit == "s"
    got = {p.attributes["node"]: p.value for p in offset.data.data_points}
    assert got == {"gpu00001": 2.5, "gpu00002": -1.5, "gpu00003": 0.0}
    assert metrics["peerwatch.stream.clock_skewed_nodes"].data.data_points[0].value == 2


def test_labelled_observations_leave_out_odd_entries() -> None:
    from peerwatch.exporters.self_metrics import labelled_observations

    snapshot = {"clock_offsets_ms": {"a": 1000, "b": float("nan"), "c": True, 7: 5, "d": "x"}}
    got = labelled_observations(STREAM, snapshot)
    assert got == {"peerwatch.node.clock_offset": [("a", 1.0)]}
    assert labelled_observations(STREAM, {"clock_offsets_ms": None}) == {}
    # a labelled metric is never an unlabelled observation
    assert "peerwatch.node.clock_offset" not in observations(STREAM, snapshot)
