"""Metric dynamics: healthy ranges, each fault on the right fields of the right GPU only during its
window, confounders as documented, cumulative counters monotonic."""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from peerwatch.producers.sim import Fleet, parse_scenario
from peerwatch.producers.sim import dynamics as dyn
from peerwatch.producers.sim.scenario import FleetSpec

START_MS = 1_767_225_600_000
COUNTERS = (
    "energy_mj",
    "throttle_sw_power_cap_ns",
    "throttle_hw_slowdown_ns",
    "throttle_sw_thermal_ns",
    "throttle_hw_thermal_ns",
    "throttle_hw_power_brake_ns",
    "ecc_volatile_corrected",
    "ecc_volatile_uncorrected",
    "ecc_aggregate_corrected",
    "ecc_aggregate_uncorrected",
    "pcie_replay_count",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_errors",
)
THROTTLE_BITS = dyn.SW_POWER_CAP | dyn.HW_SLOWDOWN | dyn.SW_THERMAL | dyn.HW_THERMAL | 0x80


def run(faults: list[dict[str, Any]] = (), confounders: list[dict[str, Any]] = (),  # type: ignore[assignment]
        nodes: int = 4, duration_s: int = 600, **job: Any) -> list[tuple[int, dict[str, Any]]]:  # fmt: skip
    """(t_s, {node: sample}) per tick for one 32-GPU job on 4 nodes, sampled every 5 s."""
    doc = {
        "fleet": {"nodes": nodes, "interval_s": 5, "duration_s": duration_s, "seed": 11},
        "jobs": [{"job_id": "7", "gpus": 32, "first_node": 0, "warmup_s": 0, **job}],
        "faults": list(faults),
        "confounders": list(confounders),
    }
    out = []
    for t_ms, records in Fleet(parse_scenario(doc)).timed_ticks():
        samples = {r.key: r.value for r in records if r.stream == "samples"}
        if samples:
            out.append(((t_ms - START_MS) // 1000, samples))
    return out


def gpu(samples: dict[str, Any], node: str, index: int) -> dict[str, Any]:
    return samples[node]["gpus"][index]


def all_gpus(samples: dict[str, Any]) -> list[dict[str, Any]]:
    return [g for s in samples.values() for g in s["gpus"]]


def clk(g: dict[str, Any]) -> float:
    return g["sm_clock_mhz"] / g["sm_clock_max_mhz"]


def test_healthy_training_ranges_and_peer_agreement() -> None:
    for _, samples in run()[1:]:
        gs = all_gpus(samples)
        clocks = [clk(g) for g in gs]
        assert max(clocks) <= 1.0 and (max(clocks) - min(clocks)) / max(clocks) <= 0.015
        powers = [g["power_mw"] / 1000 for g in gs]
        assert all(540 <= p <= 700 for p in powers)
        assert 0.05 <= (max(powers) - min(powers)) / statistics.median(powers) <= 0.2
        assert all(55 <= g["temperature_c"] <= 80 for g in gs)
        assert all(85 <= g["sm_active_pct"] <= 98 for g in gs)
        assert all(g["clocks_event_reasons"] == 0 and g["state"] == "OK" for g in gs)
        assert all(g["power_limit_mw"] == 700_000 for g in gs)


def test_idle_gpus_are_low_and_flagged_idle() -> None:
    ticks = run(nodes=5)  # gpu00004 has no job
    for _, samples in ticks:
        for g in samples["gpu00004"]["gpus"]:
            assert g["power_mw"] < 100_000 and g["sm_clock_mhz"] < 500
            assert g["sm_active_pct"] == 0 and g["clocks_event_reasons"] == dyn.GPU_IDLE
            assert g["temperature_c"] < 45


def test_cumulative_counters_are_monotonic_everywhere() -> None:
    faults = [
        {"name": "thermal_throttle", "node": 0, "gpu_index": 0, "start_s": 100, "end_s": 300},
        {"name": "power_brake", "node": 0, "gpu_index": 1, "start_s": 100, "end_s": 300},
        {"name": "nvlink_error_storm", "node": 1, "gpu_index": 0, "start_s": 100},
        {"name": "xid", "node": 1, "gpu_index": 1, "start_s": 50, "params": {"xid": 94}},
        {"name": "gpu_lost", "node": 2, "gpu_index": 2, "start_s": 100, "end_s": 200},
    ]
    confounders = [{"name": "cluster_power_cap", "start_s": 200, "end_s": 400}]
    ticks = run(faults, confounders)
    last: dict[tuple[str, int, str], int] = {}
    for _, samples in ticks:
        for node, s in samples.items():
            for g in s["gpus"]:
                for name in COUNTERS:
                    if g[name] is None:
                        continue
                    key = (node, g["index"], name)
                    assert g[name] >= last.get(key, 0), key
                    last[key] = g[name]


@pytest.mark.parametrize("pct", [5, 8, 15])
def test_sm_clock_drop_lowers_one_gpu_by_k_percent_without_reasons(pct: int) -> None:
    fault = {"name": "sm_clock_drop", "node": "gpu00001", "gpu_index": 3, "start_s": 100,
             "end_s": 400, "params": {"pct": pct}}  # fmt: skip
    for t, samples in run([fault]):
        bad = gpu(samples, "gpu00001", 3)
        peers = [clk(g) for g in all_gpus(samples) if g is not bad]
        med = statistics.median(peers)
        assert (max(peers) - min(peers)) / med <= 0.015
        ratio = clk(bad) / med
        if 100 <= t < 400:
            assert ratio == pytest.approx(1 - pct / 100, abs=0.012)
        else:
            assert ratio > 0.985
        assert bad["clocks_event_reasons"] == 0


def test_thermal_throttle_heats_flags_and_slows_one_gpu() -> None:
    fault = {"name": "thermal_throttle", "node": "gpu00002", "gpu_index": 6, "start_s": 100,
             "end_s": 400}  # fmt: skip
    ticks = run([fault])
    prev = None
    for t, samples in ticks:
        bad = gpu(samples, "gpu00002", 6)
        others = [g for g in all_gpus(samples) if g is not bad]
        med = statistics.median(clk(g) for g in others)
        assert all(g["clocks_event_reasons"] & dyn.HW_THERMAL == 0 for g in others)
        counter = bad["throttle_hw_thermal_ns"]
        if 100 <= t < 400:
            assert bad["clocks_event_reasons"] & dyn.HW_THERMAL
            assert 0.8 <= clk(bad) / med <= 0.9
            if prev is not None and t > 100:
                assert counter - prev == 5 * 10**9  # one 5 s interval per tick
        else:
            assert not bad["clocks_event_reasons"] & dyn.HW_THERMAL
            if prev is not None:
                assert counter == prev
        if 250 <= t < 400:  # the temperature follows with a lag
            assert bad["temperature_c"] >= max(g["temperature_c"] for g in others) + 8
        prev = counter


def test_power_brake_sets_its_bit_and_counter() -> None:
    fault = {"name": "power_brake", "node": 0, "gpu_index": 0, "start_s": 100, "end_s": 200}
    ticks = run([fault])
    inside = [gpu(s, "gpu00000", 0) for t, s in ticks if 100 <= t < 200]
    after = [gpu(s, "gpu00000", 0) for t, s in ticks if t >= 200]
    assert all(g["clocks_event_reasons"] & 0x80 and g["clocks_event_reasons"] & 0x8 for g in inside)
    assert inside[-1]["throttle_hw_power_brake_ns"] > inside[0]["throttle_hw_power_brake_ns"]
    assert all(clk(g) < 0.8 for g in inside)
    assert all(g["clocks_event_reasons"] == 0 for g in after)
    assert after[-1]["throttle_hw_power_brake_ns"] == after[0]["throttle_hw_power_brake_ns"]


def test_xid_79_is_reported_once_and_the_gpu_is_lost_afterwards() -> None:
    fault = {"name": "xid", "node": "gpu00003", "gpu_index": 2, "start_s": 102,
             "params": {"xid": 79}}  # fmt: skip
    ticks = run([fault])
    xids = [(t, x) for t, s in ticks for n in s.values() for x in n["xids"]]
    assert len(xids) == 1
    t, x = xids[0]
    assert t == 105 and x["xid"] == 79 and x["gpu_index"] == 2
    assert x["ts_ms"] == START_MS + 102_000
    for t, samples in ticks:
        g = gpu(samples, "gpu00003", 2)
        if t >= 105:
            assert g["state"] == "LOST" and g["error"]
            assert g["sm_clock_mhz"] is None and g["power_mw"] is None and g["energy_mj"] is None
            assert g["uuid"].startswith("GPU-") and g["index"] == 2
        else:
            assert g["state"] == "OK"
        assert all(o["state"] == "OK" for o in all_gpus(samples) if o is not g)


def test_hardware_xids_leave_counter_traces() -> None:
    faults = [
        {"name": "xid", "node": 0, "gpu_index": 0, "start_s": 100, "params": {"xid": 48}},
        {"name": "xid", "node": 0, "gpu_index": 1, "start_s": 100, "params": {"xid": 13}},
    ]
    ticks = run(faults)
    before, after = ticks[0][1], ticks[-1][1]
    g0b, g0a = gpu(before, "gpu00000", 0), gpu(after, "gpu00000", 0)
    assert g0a["ecc_volatile_uncorrected"] == g0b["ecc_volatile_uncorrected"] + 1
    assert g0a["remap_pending"] is True and g0a["recovery_action"] == 1
    g1b, g1a = gpu(before, "gpu00000", 1), gpu(after, "gpu00000", 1)
    for name in ("ecc_volatile_uncorrected", "remap_pending", "recovery_action"):
        assert g1a[name] == g1b[name]  # an application XID leaves no hardware trace


def test_nvlink_storm_and_pcie_downtrain_touch_only_their_gpu() -> None:
    faults = [
        {"name": "nvlink_error_storm", "node": 1, "gpu_index": 4, "start_s": 100, "end_s": 300},
        {"name": "pcie_downtrain", "node": 2, "gpu_index": 5, "start_s": 100, "end_s": 300},
    ]
    ticks = run(faults)
    first, mid, last = ticks[0][1], dict(ticks)[295], ticks[-1][1]
    storm = [gpu(s, "gpu00001", 4)["nvlink_replay_errors"] for s in (first, mid, last)]
    assert storm[0] < storm[1] == storm[2]  # rose during the storm, flat after
    assert gpu(mid, "gpu00001", 4)["nvlink_crc_errors"] > 0
    for _, samples in ticks:
        for node, s in samples.items():
            for g in s["gpus"]:
                if (node, g["index"]) != ("gpu00001", 4):
                    assert g["nvlink_replay_errors"] == 0
    for t, samples in ticks:
        for node, s in samples.items():
            for g in s["gpus"]:
                downtrained = (node, g["index"]) == ("gpu00002", 5) and 100 <= t < 300
                assert g["pcie_link_width"] == (8 if downtrained else 16)
                assert g["pcie_link_width_max"] == 16


def test_gpu_lost_nulls_quantities_for_its_window() -> None:
    fault = {"name": "gpu_lost", "node": 0, "gpu_index": 7, "start_s": 100, "end_s": 200}
    for t, samples in run([fault]):
        g = gpu(samples, "gpu00000", 7)
        assert (g["state"] == "LOST") == (100 <= t < 200)
        if g["state"] == "LOST":
            assert all(g[k] is None for k in ("sm_clock_mhz", "temperature_c", "sm_active_pct"))


def test_checkpoint_lowers_the_whole_job() -> None:
    conf = [{"name": "checkpoint", "node": 0, "start_s": 100, "end_s": 160}]
    for t, samples in run(confounders=conf):
        sms = [g["sm_active_pct"] for g in all_gpus(samples)]
        if 100 <= t < 160:
            assert max(sms) < 10 and all(g["power_mw"] < 250_000 for g in all_gpus(samples))
        else:
            assert min(sms) > 80


def test_periodic_checkpoint_and_eval_phases() -> None:
    ticks = run(checkpoint_every_s=200, checkpoint_s=20, eval_every_s=300, eval_s=30)
    sm = {t: statistics.median(g["sm_active_pct"] for g in all_gpus(s)) for t, s in ticks}
    assert sm[185] < 10 and sm[395] < 10 and sm[100] > 85
    assert 30 < sm[285] < 60


def test_dataloader_stall_lowers_one_rank_without_throttle_bits() -> None:
    conf = [{"name": "dataloader_stall", "node": 2, "gpu_index": 1, "start_s": 100,
             "end_s": 300}]  # fmt: skip
    for t, samples in run(confounders=conf):
        stalled = gpu(samples, "gpu00002", 1)
        peers = [g for g in all_gpus(samples) if g is not stalled]
        med_sm = statistics.median(g["sm_active_pct"] for g in peers)
        if 100 <= t < 300:
            assert stalled["sm_active_pct"] < med_sm - 40
        assert stalled["clocks_event_reasons"] == 0
        assert clk(stalled) / statistics.median(clk(g) for g in peers) > 0.985


def test_network_slowdown_and_pipeline_stages_are_job_wide_patterns() -> None:
    conf = [
        {"name": "network_slowdown", "node": 0, "start_s": 100, "end_s": 200},
        {"name": "pipeline_stages", "node": 0, "start_s": 300,
         "params": {"sm_factors": [1.0, 0.9, 0.8, 0.7]}},
    ]  # fmt: skip
    for t, samples in run(confounders=conf):
        gs = all_gpus(samples)
        assert all(g["clocks_event_reasons"] == 0 for g in gs)
        if 100 <= t < 200:
            assert all(50 <= g["sm_active_pct"] <= 66 for g in gs)
        if t >= 300:  # 32 ranks in 4 stages of 8 ranks = one node each
            per_node = [statistics.median(g["sm_active_pct"] for g in samples[f"gpu0000{n}"]["gpus"])
                        for n in range(4)]  # fmt: skip
            assert per_node == sorted(per_node, reverse=True)
            assert per_node[0] - per_node[3] > 20


def test_cluster_power_cap_flags_every_busy_gpu_and_lowers_clocks() -> None:
    conf = [{"name": "cluster_power_cap", "start_s": 100, "end_s": 300,
             "params": {"limit_w": 450}}]  # fmt: skip
    for t, samples in run(confounders=conf, nodes=5):
        busy = [g for n, s in samples.items() if n != "gpu00004" for g in s["gpus"]]
        if 100 <= t < 300:
            assert all(g["clocks_event_reasons"] & dyn.SW_POWER_CAP for g in busy)
            assert all(g["power_mw"] <= 450_000 and g["power_limit_mw"] == 450_000 for g in busy)
            clocks = [clk(g) for g in busy]
            assert max(clocks) < 0.93 and (max(clocks) - min(clocks)) / max(clocks) <= 0.015
        else:
            assert all(g["clocks_event_reasons"] & THROTTLE_BITS == 0 for g in busy)


def test_cluster_cooling_puts_every_busy_gpu_in_thermal_slowdown_and_lowers_clocks() -> None:
    conf = [{"name": "cluster_cooling", "start_s": 100, "end_s": 300,
             "params": {"clock_drop_pct": 6}}]  # fmt: skip
    before: list[float] = []
    for t, samples in run(confounders=conf, nodes=5):
        busy = [g for n, s in samples.items() if n != "gpu00004" for g in s["gpus"]]
        idle = samples["gpu00004"]["gpus"]
        assert all(g["clocks_event_reasons"] & THROTTLE_BITS == 0 for g in idle)
        if t < 100:
            before = [clk(g) for g in busy]
        elif 100 <= t < 300:
            assert all(g["clocks_event_reasons"] & dyn.SW_THERMAL for g in busy)
            during = [clk(g) for g in busy]
            drop = statistics.median(during) / statistics.median(before)
            assert 0.93 <= drop <= 0.95
            if t >= 200:  # the temperature has settled at the slowdown point
                assert all(g["temperature_c"] >= 85 for g in busy)
        else:
            assert all(g["clocks_event_reasons"] & THROTTLE_BITS == 0 for g in busy)


def test_gpu_constants_do_not_depend_on_construction_order() -> None:
    spec = FleetSpec(nodes=4, seed=5)
    a, b = dyn.Dynamics(spec), dyn.Dynamics(spec)
    forward = [a.new_gpu(n, g) for n in range(4) for g in range(8)]
    backward = [b.new_gpu(n, g) for n in reversed(range(4)) for g in reversed(range(8))][::-1]
    for x, y in zip(forward, backward, strict=True):
        assert x.tmpl == y.tmpl and x.clk_base == y.clk_base and x.train_w == y.train_w
        assert a.read(x, 3, dyn.TRAIN, 1.0, None) == b.read(y, 3, dyn.TRAIN, 1.0, None)
