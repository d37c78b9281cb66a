"""Per-port NIC metrics: spans folded with the NIC counter arithmetic, bounded, and read back
through the SDK's InMemoryMetricReader."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import FakeClock
from hypothesis import example, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from peerwatch.exporters.base import ExportError
from peerwatch.exporters.otlp_nic import NIC_METRICS, series_per_port, span_points
from peerwatch.exporters.otlp_sdk import OtlpSink
from peerwatch.producers.nic.counters import downtime
from peerwatch.producers.nic.spans import PortSpans
from peerwatch.producers.nic.window import port_window
from peerwatch.settings import ExportSettings
from peerwatch.streams.core.settings import NetworkSettings

T0 = 1_795_000_000_000
PORT = "mlx5_0/1"


def port(
    up: bool | None = True, rate: float | None = 400.0, name: str = PORT, **counters: int | None
) -> dict[str, Any]:
    hw = {k: counters.pop(k) for k in list(counters) if k in ("local_ack_timeout_err",
                                                              "np_cnp_sent")}  # fmt: skip
    return {
        "name": name, "kind": "IB", "device": name.split("/")[0], "port": 1,
        "link_layer": "InfiniBand", "state": "ACTIVE" if up else "DOWN",
        "phys_state": "LinkUp" if up else "Polling", "up": up, "rate_gbps": rate,
        "pci_address": None, "numa_node": None, "gpu_indices": [0, 1],
        "counters": counters, "hw_counters": hw, "read_errors": 0,
    }  # fmt: skip


def sample(node: str, ts_ms: int, *ports: dict[str, Any], interval_ms: int = 1000) -> dict:
    return {"node": node, "ts_ms": ts_ms, "seq": ts_ms // 1000, "agent_run_id": "r",
            "interval_ms": interval_ms, "ports": list(ports), "read_errors": 0}  # fmt: skip


def fold(spans: PortSpans, samples: list[dict[str, Any]]) -> list[Any]:
    return [c for s in samples for c in spans.add_sample(s)]


def test_a_span_reads_rates_with_the_counter_arithmetic() -> None:
    # 2 s spans of 1 s ticks: symbol errors +10/s, data words +1e9/s (x4: 4e9 bytes/s).
    spans = PortSpans(span_s=2.0)
    closed = fold(spans, [
        sample("n1", T0 + i * 1000, port(symbol_error=10 * i, port_xmit_data=10**9 * i,
                                         port_rcv_data=2 * 10**9 * i))
        for i in range(3)
    ])  # fmt: skip
    [span] = closed
    assert (span.window.start_ms, span.window.end_ms, span.window.readings) == (T0, T0 + 2000, 2)
    got = {(p.name, p.attributes.get("network.io.direction")): p.value
           for p in span_points(span, NetworkSettings())}  # fmt: skip
    assert got[("peerwatch.nic.errors.rate", None)] == 10.0
    assert got[("peerwatch.nic.io.rate", "transmit")] == 4e9
    assert got[("peerwatch.nic.io.rate", "receive")] == 8e9
    assert got[("peerwatch.nic.link.up", None)] == 1.0
    assert got[("peerwatch.nic.link.speed", None)] == 400.0
    assert got[("peerwatch.nic.link.down_time", None)] == 0.0


def test_a_reset_restarts_the_baseline_and_never_gives_a_negative_rate() -> None:
    spans = PortSpans(span_s=3.0)
    values = [1000, 1010, 5, 15]  # reset between the second and third reading
    [span] = fold(spans, [sample("n1", T0 + i * 1000, port(port_rcv_errors=v))
                          for i, v in enumerate(values)])  # fmt: skip
    # Two good pairs of +10 over 2 s; the reset's pair gives nothing.
    assert span.window.rates_per_s["port_rcv_errors"] == 10.0
    assert spans.stats.counter_resets == 1


def test_a_saturated_counter_gives_no_rate_and_is_counted() -> None:
    spans = PortSpans(span_s=2.0)
    top = 2**16 - 1
    [span] = fold(spans, [sample("n1", T0 + i * 1000, port(symbol_error=v))
                          for i, v in enumerate([top - 5, top, top])])  # fmt: skip
    assert "symbol_error" not in span.window.rates_per_s
    assert not [p for p in span_points(span, NetworkSettings())
                if p.name == "peerwatch.nic.errors.rate"]  # fmt: skip
    assert spans.stats.counter_saturations == 1  # once per span


@settings(max_examples=150, deadline=None)
# a 64-bit data counter reset to exactly the 32-bit top: saturated, no rate (found by hypothesis)
@example(steps=[(1, None, None, 0), (1, None, None, 2**32), (1, None, None, 2**32 - 1)])
@given(
    st.lists(
        st.tuples(
            st.integers(1, 3000),  # ms since the previous reading
            st.one_of(st.none(), st.booleans()),  # up
            st.one_of(st.none(), st.integers(0, 5000)),  # symbol_error (resets: it goes down)
            st.one_of(st.none(), st.integers(0, 10**12)),  # port_rcv_data (64-bit extended)
        ),
        min_size=2,
        max_size=40,
    )
)
def test_one_span_over_every_reading_is_port_window_over_them(
    steps: list[tuple[int, bool | None, int | None, int | None]],
) -> None:
    """The incremental fold gives port_window's rates, down time and flaps (its time line is
    shifted by 1 ms: each reading's state holds from 1 ms after it)."""
    readings, ts = [], T0
    for gap_ms, up, errors, data in steps:
        ts += gap_ms
        readings.append((ts, port(up=up, symbol_error=errors, port_rcv_data=data)))
    spans = PortSpans(span_s=86_400.0)
    for t, reading in readings:
        spans.add_sample(sample("n1", t, reading))
    closed = spans.close_all()
    whole = port_window(PORT, readings, readings[0][0], readings[-1][0] + 1, 2000)
    if not closed:  # a single reading: nothing to compare
        assert len(readings) == 1
        return
    [span] = closed
    assert span.window.rates_per_s.keys() == whole.rates_per_s.keys()
    for name, rate in whole.rates_per_s.items():
        assert math.isclose(span.window.rates_per_s[name], rate, rel_tol=1e-9), name
    assert abs(span.window.down_s - whole.down_s) <= 0.002
    assert span.window.flaps == whole.flaps


def test_down_time_over_spans_is_the_downtime_of_every_reading() -> None:
    states = [True, True, False, False, False, True, False, True, True, None, True]
    spans = PortSpans(span_s=2.0)
    closed = fold(spans, [sample("n1", T0 + i * 1000, port(up=up)) for i, up in enumerate(states)])
    whole = downtime([(T0 + i * 1000, up) for i, up in enumerate(states)], T0 + 1,
                     T0 + (len(states) - 1) * 1000 + 1, 2000)  # fmt: skip
    assert math.isclose(sum(c.window.down_s for c in closed), whole.down_s)
    assert sum(c.window.flaps for c in closed) == whole.flaps == 2
    # The counter of the exported series adds the spans up.
    assert whole.down_s == 4.0


def test_rated_speed_is_the_setting_else_the_highest_the_port_showed() -> None:
    rates = [400.0, 400.0, 200.0, 200.0, 200.0]
    samples = [sample("n1", T0 + i * 1000, port(rate=r)) for i, r in enumerate(rates)]
    seen = fold(PortSpans(span_s=2.0), samples)[-1]
    assert (seen.rate_gbps, seen.rated_gbps) == (200.0, 400.0)
    set_ = fold(PortSpans(span_s=2.0, network=NetworkSettings(rated_gbps=800.0)), samples)[-1]
    assert set_.rated_gbps == 800.0


def test_the_xmit_wait_share_is_the_peer_comparisons() -> None:
    # 400 Gb/s = 5e10 bytes/s; 8 bytes per tick: 6.25e9 ticks/s is the whole span waiting.
    spans = PortSpans(span_s=1.0)
    [span] = fold(spans, [sample("n1", T0 + i * 1000, port(port_xmit_wait=int(1.5625e9) * i))
                          for i in range(2)])  # fmt: skip
    [share] = [p.value for p in span_points(span, NetworkSettings())
               if p.name == "peerwatch.nic.xmit_wait.ratio"]  # fmt: skip
    assert math.isclose(share, 0.25)


def test_ports_are_capped_and_stale_ports_go() -> None:
    clock = FakeClock(1_000_000)
    spans = PortSpans(span_s=1.0, max_ports=2, stale_after_s=60.0, clock=clock)
    spans.add_sample(sample("n1", T0, port(name="mlx5_0/1"), port(name="mlx5_1/1")))
    spans.add_sample(sample("n2", T0, port(name="mlx5_0/1")))
    assert len(spans) == 2 and spans.stats.ports_dropped_cap == 1
    clock.ms += 61_000
    spans.add_sample(sample("n3", T0, port()))
    assert len(spans) == 1 and spans.stats.ports_evicted_stale == 2


def test_a_redelivered_reading_is_not_folded_twice() -> None:
    spans = PortSpans(span_s=5.0)
    fold(spans, [sample("n1", T0, port(symbol_error=0)), sample("n1", T0 + 1000,
                 port(symbol_error=10))])  # fmt: skip
    spans.add_sample(sample("n1", T0 + 1000, port(symbol_error=10)))
    assert spans.stats.readings_out_of_order == 1


# --- the SDK wiring ---------------------------------------------------------------------------


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def sink(reader: InMemoryMetricReader) -> Iterator[OtlpSink]:
    config = ExportSettings(max_series=3, stale_after_s=600.0, interval_s=2.0)
    s = OtlpSink(config, metric_exporter=None, log_exporter=InMemoryLogRecordExporter(),  # type: ignore[no-untyped-call]
                 metric_readers=[reader], clock=FakeClock(1_000_000))  # fmt: skip
    yield s
    s.close()


def collected(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics}  # fmt: skip


def test_the_sink_exports_one_series_per_node_port_with_its_identity(
    sink: OtlpSink, reader: InMemoryMetricReader
) -> None:
    for i in range(3):
        sink.write("NodeNicSample", sample(
            "n1", T0 + i * 1000,
            port(symbol_error=3 * i, port_xmit_data=i, port_rcv_data=i, port_xmit_wait=i,
                 local_ack_timeout_err=i, np_cnp_sent=i),
            port(name="mlx5_1/1", up=i < 2),
        ))  # fmt: skip
    metrics = collected(reader)
    assert {m.name for m in NIC_METRICS} <= set(metrics)
    up = {p.attributes["hw.id"]: p.value for p in metrics["peerwatch.nic.link.up"].data.data_points}
    assert up == {"n1/mlx5_0/1": 1, "n1/mlx5_1/1": 0}
    [errors] = [p for p in metrics["peerwatch.nic.errors.rate"].data.data_points
                if p.attributes["network.interface.name"] == PORT]  # fmt: skip
    assert errors.value == 3.0
    assert dict(errors.attributes) == {
        "host.name": "n1", "hw.id": "n1/mlx5_0/1", "hw.type": "network",
        "network.interface.name": PORT, "peerwatch.nic.device": "mlx5_0",
        "peerwatch.nic.kind": "IB", "peerwatch.nic.link_layer": "InfiniBand",
    }  # fmt: skip
    io = {p.attributes["network.io.direction"]: p.value
          for p in metrics["peerwatch.nic.io.rate"].data.data_points}  # fmt: skip
    assert io == {"transmit": 4.0, "receive": 4.0}  # one 4-byte word per second
    down = {p.attributes["hw.id"]: p.value
            for p in metrics["peerwatch.nic.link.down_time"].data.data_points}  # fmt: skip
    assert down == {"n1/mlx5_0/1": 0.0, "n1/mlx5_1/1": pytest.approx(0.001)}
    assert sink.stats()["port_series_active"] == 2


def test_the_sink_caps_port_series_and_counts_what_it_dropped(
    sink: OtlpSink, reader: InMemoryMetricReader
) -> None:
    ports = [port(name=f"mlx5_{k}/1") for k in range(3)]
    for i in range(3):
        sink.write("NodeNicSample", sample("n1", T0 + i * 1000, *ports))
    for i in range(3):
        sink.write("NodeNicSample", sample("n2", T0 + i * 1000, port()))
    assert len(sink.port_store) == 3
    assert sink.discarded()["port_series_cap"] == 1 and sink.discarded()["port_state_cap"] == 1
    up = collected(reader)["peerwatch.nic.link.up"].data.data_points
    assert len(up) == 3 and "n2/mlx5_0/1" in {p.attributes["hw.id"] for p in up}


def test_a_sample_without_a_node_is_an_export_error(sink: OtlpSink) -> None:
    with pytest.raises(ExportError, match="NodeNicSample"):
        sink.write("NodeNicSample", {"ts_ms": T0, "ports": [port()]})


def test_series_per_port_counts_both_io_directions() -> None:
    assert series_per_port() == len(NIC_METRICS) + 1


def test_close_all_ends_every_open_span_at_its_latest_reading() -> None:
    spans = PortSpans(span_s=3600.0)
    fold(spans, [sample("n1", T0 + i * 1000, port(up=i != 2, symbol_error=5 * i),
                        port(name="eth0")) for i in range(5)])  # fmt: skip
    spans.add_sample(sample("n2", T0, port()))  # one reading: no span to close
    closed = {c.key: c for c in spans.close_all()}
    assert set(closed) == {("n1", PORT), ("n1", "eth0")}
    w = closed[("n1", PORT)].window
    assert (w.start_ms, w.end_ms, w.readings, w.down_s) == (T0, T0 + 4000, 4, 1.0)
    assert w.rates_per_s["symbol_error"] == 5.0
    assert spans.close_all() == []  # nothing new since
