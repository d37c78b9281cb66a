"""The hot path: attribution at event time, window alignment, every aggregate, lateness."""

from __future__ import annotations

from typing import Any

import pytest

from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.windows import JobWindowBatch, WindowAggregator

T0 = 1_767_225_600_000  # a multiple of 30 s
S = 1000


def reading(index: int = 0, **fields: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"index": index, "uuid": f"GPU-{index}", "state": "OK"}
    r.update(fields)
    return r


def sample(ts_ms: int, *gpus: dict[str, Any], node: str = "n1", xids: Any = ()) -> dict[str, Any]:
    return {"node": node, "ts_ms": ts_ms, "gpus": list(gpus), "xids": list(xids)}


def table(*jobs: tuple[str, int, int | None, dict[str, list[int]]]) -> AllocationTable:
    """Jobs as (job_id, start_ms, end_ms or None, {node: gpus})."""
    t = AllocationTable()
    for job_id, start, end, alloc in jobs:
        allocs = [{"node": n, "gpu_indices": g} for n, g in alloc.items()]
        t.apply_event({"job_id": job_id, "kind": "STARTED", "ts_ms": start, "start_ms": start,
                       "user": "u", "partition": "p", "account": "a", "allocations": allocs})  # fmt: skip
        if end is not None:
            t.apply_event({"job_id": job_id, "kind": "ENDED", "ts_ms": end, "allocations": allocs})
    return t


def windows(batches: list[JobWindowBatch]) -> list[dict[str, Any]]:
    return [w for b in batches for w in b.windows]


def one(batches: list[JobWindowBatch]) -> dict[str, Any]:
    ws = windows(batches)
    assert len(ws) == 1
    return ws[0]


def agg(lateness_s: float = 10, **alloc: list[int]) -> WindowAggregator:
    return WindowAggregator(table(("J", T0 - 600 * S, None, alloc or {"n1": [0]})), 30, lateness_s)


def test_windows_are_aligned_to_the_epoch_and_half_open() -> None:
    a = agg()
    a.add_batch([sample(T0 + 29_999, reading(sm_clock_mhz=100, sm_clock_max_mhz=200))])
    a.add_batch([sample(T0 + 30_000, reading(sm_clock_mhz=200, sm_clock_max_mhz=200))])
    out = windows(a.flush())
    assert [(w["window_start_ms"], w["window_end_ms"]) for w in out] == [
        (T0, T0 + 30_000),
        (T0 + 30_000, T0 + 60_000),
    ]
    assert [w["clk_ratio"] for w in out] == [0.5, 1.0]
    assert out[0]["job_id"] == "J" and (out[0]["user"], out[0]["partition"]) == ("u", "p")


def test_means_maxima_and_flags_from_hand_made_samples() -> None:
    a = agg()
    a.add_batch(
        [
            sample(T0 + 1 * S, reading(sm_clock_mhz=1800, sm_clock_max_mhz=2000, sm_active_pct=80.0,
                   gpu_util_pct=100, power_mw=500_000, power_limit_mw=700_000, temperature_c=60,
                   pcie_link_width=16, pcie_link_width_max=16, remap_pending=False)),
            sample(T0 + 2 * S, reading(sm_clock_mhz=2000, sm_clock_max_mhz=2000, sm_active_pct=90.0,
                   power_mw=600_000, power_limit_mw=600_000, temperature_c=71, pcie_link_width=8,
                   pcie_link_width_max=16, remap_pending=True, remap_failed=False)),
        ]
    )  # fmt: skip
    w = one(a.flush())
    assert w["samples"] == 2
    assert w["clk_ratio"] == pytest.approx(0.95)
    assert w["sm_frac"] == pytest.approx(0.85)  # GPM SM activity wins over GPU utilisation
    assert w["power_w"] == pytest.approx(550.0)
    assert w["power_ratio"] == pytest.approx((5 / 7 + 1.0) / 2)
    assert w["temperature_c_max"] == 71
    assert (w["pcie_link_width_min"], w["pcie_link_width_max"]) == (8, 16)
    assert w["remap_pending"] is True and w["remap_failed"] is False and w["lost"] is False


def test_sm_falls_back_to_gpu_utilisation() -> None:
    a = agg()
    a.add_batch([sample(T0 + S, reading(sm_active_pct=None, gpu_util_pct=40))])
    assert one(a.flush())["sm_frac"] == pytest.approx(0.4)


def test_missing_fields_give_nulls_and_zero_deltas() -> None:
    a = agg()
    a.add_batch([sample(T0 + S, reading()), sample(T0 + 2 * S, reading())])
    w = one(a.flush())
    assert w["samples"] == 2
    for name in ("clk_ratio", "throttle_frac", "power_cap_frac", "sm_frac", "power_ratio",
                 "power_w", "temperature_c_max", "energy_j", "pcie_link_width_min",
                 "thermal_frac", "power_brake_frac"):  # fmt: skip
        assert w[name] is None, name
    assert (w["ecc_uncorrected_delta"], w["nvlink_errors_delta"], w["pcie_replay_delta"]) == (
        0,
        0,
        0,
    )
    assert w["xids"] == []


def test_throttle_from_counter_deltas_with_power_cap_kept_apart() -> None:
    a = agg()
    ns = 1_000_000
    a.add_batch(
        [
            sample(T0, reading(throttle_hw_thermal_ns=0, throttle_hw_slowdown_ns=0,
                               throttle_sw_power_cap_ns=5 * ns, clocks_event_reasons=0x40)),
            # 2 s later: 0.5 s thermal + 0.5 s slowdown (-> 1 s of 2), 2 s of power cap.
            sample(T0 + 2 * S, reading(throttle_hw_thermal_ns=500 * ns, throttle_hw_slowdown_ns=500 * ns,
                                       throttle_sw_power_cap_ns=2005 * ns, clocks_event_reasons=0)),
        ]
    )  # fmt: skip
    w = one(a.flush())
    assert w["throttle_frac"] == pytest.approx(0.5)  # counters win over the sampled bits
    assert w["power_cap_frac"] == pytest.approx(1.0)


def test_thermal_and_power_brake_shares_are_kept_apart_for_the_cause() -> None:
    a = agg()
    ns = 1_000_000
    a.add_batch(
        [
            sample(T0, reading(throttle_hw_thermal_ns=0, throttle_sw_thermal_ns=0,
                               throttle_hw_power_brake_ns=0, clocks_event_reasons=0)),
            # 2 s later: 0.4 s HW + 0.2 s SW thermal (0.3 of the time), 1 s of power brake.
            sample(T0 + 2 * S, reading(throttle_hw_thermal_ns=400 * ns, throttle_sw_thermal_ns=200 * ns,
                                       throttle_hw_power_brake_ns=1000 * ns, clocks_event_reasons=0)),
        ]
    )  # fmt: skip
    w = one(a.flush())
    assert w["thermal_frac"] == pytest.approx(0.3)
    assert w["power_brake_frac"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("bits", "thermal", "brake"),
    [([0x0, 0x0], 0.0, 0.0), ([0x40, 0x0], 0.5, 0.0), ([0x20, 0x88], 0.5, 0.5),
     ([0x8, 0x8], 0.0, 0.0)],
)  # fmt: skip
def test_thermal_and_brake_shares_from_sampled_bits(
    bits: list[int], thermal: float, brake: float
) -> None:
    a = agg()
    a.add_batch(
        [sample(T0 + (i + 1) * S, reading(clocks_event_reasons=b)) for i, b in enumerate(bits)]
    )
    w = one(a.flush())
    assert (w["thermal_frac"], w["power_brake_frac"]) == (
        pytest.approx(thermal),
        pytest.approx(brake),
    )


def test_overlapping_throttle_counters_never_exceed_the_elapsed_time() -> None:
    a = agg()
    ns = 1_000_000
    a.add_batch(
        [
            sample(T0, reading(throttle_hw_power_brake_ns=0, throttle_hw_slowdown_ns=0)),
            sample(T0 + S, reading(throttle_hw_power_brake_ns=1000 * ns, throttle_hw_slowdown_ns=1000 * ns)),
        ]
    )  # fmt: skip
    assert one(a.flush())["throttle_frac"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("bits", "thr", "cap"),
    [([0x0, 0x0], 0.0, 0.0), ([0x8, 0x0], 0.5, 0.0), ([0x20, 0x80], 1.0, 0.0),
     ([0x4, 0x4], 0.0, 1.0), ([0x44, 0x1], 0.5, 0.5), ([0x1, 0x2], 0.0, 0.0)],
)  # fmt: skip
def test_throttle_from_sampled_bits_when_counters_are_missing(
    bits: list[int], thr: float, cap: float
) -> None:
    a = agg()
    a.add_batch(
        [sample(T0 + (i + 1) * S, reading(clocks_event_reasons=b)) for i, b in enumerate(bits)]
    )
    w = one(a.flush())
    assert (w["throttle_frac"], w["power_cap_frac"]) == (pytest.approx(thr), pytest.approx(cap))


def test_counter_deltas_span_windows_and_survive_resets() -> None:
    a = agg()
    counters = [  # (ts s, energy mJ, ecc, nvlink replay, crc, pcie replay)
        (25, 1_000, 0, 10, 0, 3),
        (29, 5_000, 0, 10, 0, 3),
        (31, 9_000, 1, 12, 1, 3),  # delta vs the 29 s sample lands in the second window
        (33, 2_000, 0, 0, 0, 4),  # a driver reload reset energy, ECC and NVLink counters
    ]
    a.add_batch(
        [
            sample(T0 + t * S, reading(energy_mj=e, ecc_volatile_uncorrected=ecc, nvlink_replay_errors=rep,
                                       nvlink_crc_errors=crc, pcie_replay_count=pcie))
            for t, e, ecc, rep, crc, pcie in counters
        ]
    )  # fmt: skip
    first, second = windows(a.flush())
    assert first["energy_j"] == pytest.approx(4.0)
    assert first["ecc_uncorrected_delta"] == 0 and first["nvlink_errors_delta"] == 0
    assert second["energy_j"] == pytest.approx(4.0 + 2.0)  # +4 J, then 2 J since the reset
    assert second["ecc_uncorrected_delta"] == 1 and second["nvlink_errors_delta"] == 3
    assert second["pcie_replay_delta"] == 1


def test_energy_read_every_few_samples_sums_to_the_same_energy() -> None:
    """An agent that reads energy less often (``agent.energy_interval_s``): the samples between
    carry none, each delta spans the gap and lands in the window of the reading that closes it,
    and the windows' total is the counter's rise, as when every sample carries it."""
    totals = []
    for every in (1, 4):
        a = agg()
        a.add_batch([
            sample(T0 + t * S, reading(energy_mj=1_000 * t if t % every == 0 else None))
            for t in range(0, 61)
        ])  # fmt: skip
        got = windows(a.flush())
        totals.append(sum(w["energy_j"] or 0.0 for w in got))
    assert totals == [pytest.approx(60.0), pytest.approx(60.0)]


def test_lost_gpu_and_xids() -> None:
    a = agg()
    xid = {"gpu_index": 0, "xid": 79, "ts_ms": T0 + 1500, "event_data": None}
    a.add_batch([sample(T0 + S, reading()), sample(T0 + 2 * S, reading(state="LOST"), xids=[xid])])
    w = one(a.flush())
    assert w["lost"] is True and w["xids"] == [79] and w["samples"] == 2


def test_attribution_follows_the_owner_at_the_sample_time() -> None:
    t = table(("A", T0, T0 + 40 * S, {"n1": [0]}), ("B", T0 + 40 * S, None, {"n1": [0]}))
    a = WindowAggregator(t, 30, 10)
    # The sample at 45 s arrives first; the one at 35 s still belongs to A (a late sample in an
    # open window).
    a.add_batch([sample(T0 + 45 * S, reading(sm_clock_mhz=2, sm_clock_max_mhz=2))])
    a.add_batch([sample(T0 + 35 * S, reading(sm_clock_mhz=1, sm_clock_max_mhz=2))])
    out = {w["job_id"]: w for w in windows(a.flush())}
    assert out["A"]["clk_ratio"] == 0.5 and out["B"]["clk_ratio"] == 1.0
    assert out["A"]["window_start_ms"] == out["B"]["window_start_ms"] == T0 + 30 * S


def test_unowned_gpus_are_counted_not_emitted() -> None:
    a = agg()
    a.add_batch([sample(T0 + S, reading(0), reading(1))])
    out = windows(a.flush())
    assert [w["gpu_index"] for w in out] == [0]
    assert a.counters()["unattributed"] == 1 and a.counters()["readings"] == 2


def test_watermark_lateness_and_late_samples() -> None:
    a = agg(lateness_s=10)
    a.add_batch([sample(T0 + 5 * S, reading())])
    a.add_batch([sample(T0 + 39 * S, reading())])
    assert a.watermark_ms == T0 + 29 * S
    assert a.close_ready() == []  # the first window needs watermark >= its end
    a.add_batch([sample(T0 + 29 * S, reading())])  # 10 s behind: still on time
    a.add_batch([sample(T0 + 40 * S, reading())])
    closed = a.close_ready()
    assert [(b.job_id, b.window_start_ms) for b in closed] == [("J", T0)]
    assert closed[0].windows[0]["samples"] == 2
    late = a.add_batch([sample(T0 + 20 * S, reading()), sample(T0 + 41 * S, reading())])
    assert [s["ts_ms"] for s in late] == [T0 + 20 * S]
    assert a.counters()["late_samples"] == 1
    assert windows(a.flush())[0]["samples"] == 3  # 39, 40, 41 s


def test_batches_are_grouped_per_job_and_window_across_nodes() -> None:
    t = table(
        ("J", T0 - 60 * S, None, {"n1": [0, 1], "n2": [0]}), ("K", T0 - 60 * S, None, {"n3": [0]})
    )
    a = WindowAggregator(t, 30, 0)
    a.add_batch([sample(T0 + S, reading(0), reading(1), node="n1"), sample(T0 + S, reading(0), node="n2"),
                 sample(T0 + S, reading(0), node="n3")])  # fmt: skip
    a.add_batch([sample(T0 + 30 * S, reading(0), node="n3")])
    batches = a.close_ready()
    assert [(b.job_id, [(w["node"], w["gpu_index"]) for w in b.windows]) for b in batches] == [
        ("J", [("n1", 0), ("n1", 1), ("n2", 0)]),
        ("K", [("n3", 0)]),
    ]


@pytest.mark.parametrize("cut", [1, 2, 7, 13, 29])
def test_windows_do_not_depend_on_the_batching(cut: int) -> None:
    # Float sums are taken in arrival order whatever the batches: the same bits either way.
    samples = [sample(T0 + i * 3 * S, reading(sm_clock_mhz=1900 + i, sm_clock_max_mhz=1979,
                                              power_mw=311_111 + 7 * i, power_limit_mw=700_000,
                                              sm_active_pct=33.3 + i / 7, energy_mj=1000 * i,
                                              clocks_event_reasons=8 * (i % 2)))
               for i in range(30)]  # fmt: skip
    whole = agg()
    whole.add_batch(samples)
    expected = windows(whole.flush())
    cut_up = agg()
    for i in range(0, len(samples), cut):
        cut_up.add_batch(samples[i : i + cut])
    assert windows(cut_up.flush()) == expected


def test_a_sample_time_outside_the_range_is_refused_and_counted() -> None:
    a = agg()
    good = sample(T0 + S, reading(sm_clock_mhz=1900, sm_clock_max_mhz=2000))
    bad = [sample(-5, reading()), sample(1 << 62, reading())]
    assert a.add_batch([bad[0], good, bad[1]]) == bad
    assert a.counters()["invalid_samples"] == 2 and a.counters()["readings"] == 1
    assert one(a.flush())["samples"] == 1


def test_counter_values_out_of_range_count_as_missing() -> None:
    a = agg()
    a.add_batch([sample(T0 + i * S, reading(energy_mj=v, pcie_replay_count=w))
                 for i, (v, w) in enumerate([(1000, 1), (-1, 1 << 62), (3000, 5)])])  # fmt: skip
    w = one(a.flush())
    # the out-of-range middle values read as null, as a missing value does: no delta across them,
    # but for energy (an agent may read it less often than each sample): 1000 -> 3000 mJ
    assert w["energy_j"] == 2.0 and w["pcie_replay_delta"] == 0 and w["samples"] == 3
    assert a.counters()["bad_values"] == 2


def test_fields_most_windows_share_are_right_in_the_windows_that_differ() -> None:
    """Window dicts start from a template holding the value most windows share (per job: its
    id, user, partition, account); the windows with another value get theirs."""
    gpus = list(range(8))
    a = WindowAggregator(
        table(("J", T0 - 600 * S, None, {"n1": gpus[:4]}), ("K", T0 - 600 * S, None,
                                                             {"n1": gpus[4:]})),
        30, 10,
    )  # fmt: skip
    normal = {"pcie_link_width": 16, "pcie_link_width_max": 16, "ecc_volatile_uncorrected": 0}
    for k in range(3):
        readings = [reading(i, **normal) for i in gpus]
        readings[2] = reading(2, pcie_link_width=8, pcie_link_width_max=16,
                              ecc_volatile_uncorrected=k)  # fmt: skip
        readings[5] = reading(5)  # no link width, no ECC counter
        readings[6] = reading(6, state="LOST")
        if k == 2:
            readings[7] = reading(7, **normal, remap_pending=1)
        a.add_batch([sample(T0 + k * S, *readings)])
    a.add_batch([sample(T0 + 3 * S, reading(0, **normal))])  # one more sample for GPU 0
    by_gpu = {(w["job_id"], w["gpu_index"]): w for w in windows(a.flush())}
    assert by_gpu[("J", 0)]["samples"] == 4 and by_gpu[("J", 1)]["samples"] == 3
    assert (
        by_gpu[("J", 2)]["pcie_link_width_min"] == 8
        and by_gpu[("J", 2)]["ecc_uncorrected_delta"] == 2
    )
    assert (
        by_gpu[("J", 1)]["pcie_link_width_min"] == 16
        and by_gpu[("J", 1)]["ecc_uncorrected_delta"] == 0
    )
    assert (
        by_gpu[("K", 5)]["pcie_link_width_min"] is None
        and by_gpu[("K", 5)]["pcie_link_width_max"] is None
    )
    assert by_gpu[("K", 6)]["lost"] is True and by_gpu[("K", 4)]["lost"] is False
    assert by_gpu[("K", 7)]["remap_pending"] is True and by_gpu[("K", 4)]["remap_pending"] is False
    assert {(w["job_id"], w["user"], w["partition"], w["account"]) for w in by_gpu.values()} == {
        ("J", "u", "p", "a"),
        ("K", "u", "p", "a"),
    }
    assert all(w["xids"] == [] for w in by_gpu.values())
    assert len({id(w["xids"]) for w in by_gpu.values()}) == len(by_gpu)  # a list of its own each
    assert list(by_gpu[("J", 0)]) == list(by_gpu[("K", 6)])  # every field, in one order


def test_a_window_makes_room_for_as_many_slots_as_the_last_closed_one() -> None:
    # A fleet keeps its size from one window to the next: the next window's accumulators are
    # made that size at once instead of growing by doubling (a copy of every slot each time).
    gpus = list(range(8))
    a = WindowAggregator(table(("J", T0 - 60 * S, None, {f"n{k}": gpus for k in range(40)})), 30, 0)
    for k in range(40):  # a node a batch
        a.add_batch([sample(T0 + S, *(reading(g) for g in gpus), node=f"n{k}")])
    first = a._buckets[T0]
    assert first.accs.size == 320 and first.accs.cap == 512  # grown by doubling
    a.add_batch([sample(T0 + 30 * S, reading(0), node="n0")])  # closes the first window
    assert len(windows(a.close_ready())) == 320
    assert a._buckets[T0 + 30 * S].accs.cap == 320  # made that size at once
