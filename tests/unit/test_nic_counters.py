"""Counter arithmetic of NIC counters: deltas, resets, saturation, 4-byte words, downtime."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerwatch.producers.nic.counters import (
    IB_COUNTER_BITS,
    CounterTracker,
    counter_delta,
    downtime,
    saturation_value,
)
from peerwatch.producers.nic.window import _counter_rate, port_window


def test_a_rising_counter_gives_its_delta_and_rate_per_second() -> None:
    d = counter_delta("symbol_error", 10, 40, 2.0)
    assert (d.delta, d.rate_per_s, d.reset, d.saturated) == (30, 15.0, False, False)


def test_data_counters_count_four_byte_words() -> None:
    d = counter_delta("port_xmit_data", 1_000, 1_250, 1.0)
    assert d.delta == 1_000 and d.rate_per_s == 1_000.0
    # Packets are not words.
    assert counter_delta("port_xmit_packets", 1_000, 1_250, 1.0).delta == 250


def test_a_counter_that_goes_down_is_a_reset_never_a_negative_rate() -> None:
    d = counter_delta("port_rcv_errors", 500, 3, 1.0)
    assert d.reset and d.delta is None and d.rate_per_s is None


@pytest.mark.parametrize(
    ("name", "bits"),
    [("symbol_error", 16), ("link_error_recovery", 8), ("link_downed", 8),
     ("port_rcv_errors", 16), ("local_link_integrity_errors", 4),
     ("excessive_buffer_overrun_errors", 4), ("port_xmit_data", 32)],
)  # fmt: skip
def test_a_counter_at_its_width_maximum_is_saturated_with_no_rate(name: str, bits: int) -> None:
    top = (1 << bits) - 1
    assert IB_COUNTER_BITS[name] == bits and saturation_value(name) == top
    d = counter_delta(name, top - 5, top, 1.0)
    assert d.saturated and d.delta is None and d.rate_per_s is None
    # Still stuck at the top on the next reading: saturated, not "zero errors".
    stuck = counter_delta(name, top, top, 1.0)
    assert stuck.saturated and stuck.delta is None


@pytest.mark.parametrize("name", ["port_xmit_data", "port_rcv_data", "port_xmit_wait"])
def test_a_64_bit_extended_counter_past_the_32_bit_top_keeps_its_rate(name: str) -> None:
    # HCAs with extended counters show these as 64 bits: past 2**32 - 1 they count on (only a
    # reading exactly at the top is taken as saturated).
    before = (1 << 32) + 1_000
    d = counter_delta(name, before, before + 500, 1.0)
    assert not d.saturated and d.delta == 500 * (4 if name.endswith("_data") else 1)


def test_netdev_and_hw_counters_never_saturate() -> None:
    assert saturation_value("rx_crc_errors") is None
    assert saturation_value("local_ack_timeout_err") is None
    d = counter_delta("rnr_nak_retry_err", 0, (1 << 16) - 1, 1.0)
    assert not d.saturated and d.delta == 65535


def test_a_missing_value_or_no_elapsed_time_gives_no_rate() -> None:
    assert counter_delta("symbol_error", None, 5, 1.0).delta is None
    assert counter_delta("symbol_error", 5, None, 1.0).delta is None
    d = counter_delta("symbol_error", 5, 7, 0.0)
    assert d.delta == 2 and d.rate_per_s is None


def test_tracker_spans_a_missing_tick_and_counts_resets_and_saturation() -> None:
    t = CounterTracker()
    assert t.update("mlx5_0/1", 0, {"symbol_error": 10, "link_downed": 254}) == {}
    # Tick at 1 s lost (read failed: null): the baseline stays, the 2 s reading spans both.
    assert t.update("mlx5_0/1", 1000, {"symbol_error": None, "link_downed": 254}) == {
        "link_downed": counter_delta("link_downed", 254, 254, 1.0)
    }
    out = t.update("mlx5_0/1", 2000, {"symbol_error": 30, "link_downed": 255})
    assert out["symbol_error"].delta == 20 and out["symbol_error"].rate_per_s == 10.0
    assert out["link_downed"].saturated and t.saturations == 1
    out = t.update("mlx5_0/1", 3000, {"symbol_error": 0, "link_downed": 0})
    assert out["symbol_error"].reset and out["link_downed"].reset and t.resets == 2
    # After the reset the new value is the baseline.
    out = t.update("mlx5_0/1", 4000, {"symbol_error": 4, "link_downed": 0})
    assert out["symbol_error"].delta == 4 and out["link_downed"].delta == 0


def test_tracker_keeps_ports_apart() -> None:
    t = CounterTracker()
    t.update("a", 0, {"symbol_error": 100})
    t.update("b", 0, {"symbol_error": 0})
    assert t.update("b", 1000, {"symbol_error": 5})["symbol_error"].delta == 5


def test_downtime_counts_seconds_not_up_and_flaps() -> None:
    readings = [(0, True), (1000, True), (2000, False), (3000, False), (4000, True),
                (5000, False), (6000, True)]  # fmt: skip
    d = downtime(readings, 0, 7000, max_gap_ms=2000)
    assert d.down_s == 3.0 and d.unknown_s == 0.0 and d.flaps == 2


def test_downtime_a_missing_tick_is_unknown_not_down() -> None:
    # Readings at 0 s (down) and 10 s (up): the state holds for max_gap only.
    d = downtime([(0, False), (10_000, True)], 0, 12_000, max_gap_ms=2000)
    assert d.down_s == 2.0 and d.unknown_s == 8.0 and d.flaps == 0


def test_downtime_unreadable_state_is_unknown_and_a_reading_before_the_window_counts() -> None:
    d = downtime([(-500, True), (500, None), (1500, False)], 0, 3000, max_gap_ms=2000)
    # -500..500 up (500 ms in the window), 500..1500 unknown, 1500..3000 down; one flap at 1.5 s.
    assert d.down_s == 1.5 and d.unknown_s == 1.0 and d.flaps == 1


def test_downtime_of_a_window_without_readings_is_all_unknown() -> None:
    assert downtime([], 0, 5000, 2000).unknown_s == 5.0
    with pytest.raises(ValueError):
        downtime([], 5000, 0, 2000)


# -- one port over a window -------------------------------------------------------------------


def reading(up: bool | None = True, rate: float | None = 400.0, **counters: int | None) -> dict:
    return {"up": up, "rate_gbps": rate, "counters": counters, "hw_counters": {}}


def test_port_window_rates_span_a_missing_tick_and_count_bytes() -> None:
    readings = [
        (0, reading(symbol_error=10, port_xmit_data=1_000)),
        (1000, reading(symbol_error=None, port_xmit_data=None)),  # a tick whose reads failed
        (2000, reading(symbol_error=30, port_xmit_data=3_000)),
        (3000, reading(symbol_error=40, port_xmit_data=3_500)),
    ]
    w = port_window("mlx5_0/1", readings, 0, 4000, max_gap_ms=2000)
    assert w.readings == 4 and w.rates_per_s["symbol_error"] == 10.0
    assert w.rates_per_s["port_xmit_data"] == 2_500 * 4 / 3  # words -> bytes
    assert (w.down_s, w.flaps, w.resets, w.saturated, w.min_rate_gbps) == (0.0, 0, (), (), 400.0)


def test_port_window_reset_and_saturation_inside_the_window() -> None:
    readings = [
        (0, reading(port_rcv_errors=100, link_downed=250)),
        (1000, reading(port_rcv_errors=120, link_downed=255)),
        (2000, reading(port_rcv_errors=5, link_downed=255)),  # perfquery -x on rcv errors
        (3000, reading(port_rcv_errors=15, link_downed=255)),
    ]
    w = port_window("p", readings, 0, 4000, max_gap_ms=2000)
    # 20 before the reset, 10 after, over the 2 s of usable intervals.
    assert w.rates_per_s["port_rcv_errors"] == 15.0 and w.resets == ("port_rcv_errors",)
    assert "link_downed" not in w.rates_per_s and w.saturated == ("link_downed",)


def test_port_window_downtime_and_a_lower_link_rate() -> None:
    readings = [(-1000, reading()), (0, reading(up=False, rate=None)),
                (1000, reading(up=False, rate=None)), (2000, reading(rate=200.0)),
                (3000, reading(rate=200.0))]  # fmt: skip
    w = port_window("p", readings, 0, 4000, max_gap_ms=2000)
    assert (w.down_s, w.flaps, w.min_rate_gbps, w.readings) == (2.0, 1, 200.0, 4)
    assert w.unknown_s == 0.0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 2**17)), min_size=0, max_size=8),
    st.sampled_from(["symbol_error", "port_xmit_data", "port_rcv_errors", "out_of_sequence"]),
)
def test_a_window_s_counter_rate_is_the_sum_of_its_pairs(
    points: list[tuple[int, int]], name: str
) -> None:
    """The fast path (no reset: one delta over the span) gives what adding the pairs gives."""
    total = span = 0
    reset = saturated = False
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        d = counter_delta(name, v0, v1, (t1 - t0) / 1000)
        reset |= d.reset
        saturated |= d.saturated
        if d.delta is not None:
            total += d.delta
            span += t1 - t0
    want = (None if saturated or span <= 0 else total / (span / 1000), reset, saturated)
    assert _counter_rate(name, points) == want


_VALUE = st.one_of(st.integers(0, 300), st.sampled_from([65535, 65536, None, True, 1.5]))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(-2000, 6000), min_size=0, max_size=7),
    st.lists(st.tuples(_VALUE, _VALUE, _VALUE, _VALUE), min_size=7, max_size=7),
    st.sampled_from([None, frozenset({"symbol_error", "out_of_sequence"}), frozenset()]),
)
def test_port_window_a_column_at_a_time_gives_what_a_reading_at_a_time_gives(
    times: list[int], values: list[tuple[Any, ...]], only: frozenset[str] | None
) -> None:
    """Readings naming the same counters in the same order (what one agent sends) are summed a
    column at a time; readings that differ go a reading at a time: the same window either way
    (nulls, bools, floats, resets, saturation, equal times), and ``counters`` keeps only those
    named."""
    times.sort()

    def one(ts: int, v: tuple[Any, ...], flip: bool) -> tuple[int, dict[str, Any]]:
        ib = {"symbol_error": v[0], "link_downed": v[1], "port_xmit_data": v[2]}
        if flip:  # the same counters in another order: not one agent's columns
            ib = dict(reversed(ib.items()))
        return ts, {"up": True, "rate_gbps": 400.0, "counters": ib,
                    "hw_counters": {"out_of_sequence": v[3]}}  # fmt: skip

    same = [one(t, v, False) for t, v in zip(times, values, strict=False)]
    mixed = [one(t, v, i % 2 == 1) for i, (t, v) in enumerate(zip(times, values, strict=False))]
    whole = port_window("p", same, 0, 4000, 2000)
    assert port_window("p", mixed, 0, 4000, 2000) == whole
    # each counter's rate is its own points' (the pairs' sum)
    for name in ("symbol_error", "link_downed", "port_xmit_data", "out_of_sequence"):
        group = "hw_counters" if name == "out_of_sequence" else "counters"
        points = [(t, r[group][name]) for t, r in same if 0 <= t < 4000
                  and type(r[group][name]) is int]  # fmt: skip
        rate, reset, sat = _counter_rate(name, points) if points else (None, False, False)
        assert whole.rates_per_s.get(name) == rate
        assert (name in whole.resets, name in whole.saturated) == (reset, sat)
    some = port_window("p", same, 0, 4000, 2000, only)
    assert port_window("p", mixed, 0, 4000, 2000, only) == some
    if only is not None:
        assert some.rates_per_s == {k: v for k, v in whole.rates_per_s.items() if k in only}
        assert some.resets == tuple(c for c in whole.resets if c in only)
        assert some.saturated == tuple(c for c in whole.saturated if c in only)
        assert (some.down_s, some.flaps, some.readings) == (
            whole.down_s,
            whole.flaps,
            whole.readings,
        )
