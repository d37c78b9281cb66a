"""Fleet context: a power cap over a whole partition is one FLEET_WIDE finding (cause POWER, no
GPU blamed) with its evidence, closed by one CLEARED; anything smaller, idle GPUs, or another
partition's cap changes nothing; the same episode gives the same finding id."""

from __future__ import annotations

from typing import Any

import pytest

from peerwatch.streams.core.fleet import FLEET_JOB, FleetWatch, census
from peerwatch.streams.core.settings import DetectorSettings

W_MS = 5_000
SETTINGS = DetectorSettings(fleet_min_gpus=16, clear_after_s=30)


def windows(n: int, capped: int, clk: float = 1.0, *, job: str = "7", part: str = "gpu",
            capped_clk: float | None = None) -> list[dict[str, Any]]:  # fmt: skip
    out = []
    for i in range(n):
        cap = i < capped
        out.append({
            "job_id": job, "node": f"n{i // 8}", "gpu_index": i % 8, "partition": part,
            "samples": 5, "lost": False, "power_cap_frac": 1.0 if cap else 0.0,
            "clk_ratio": capped_clk if cap and capped_clk is not None else clk,
        })  # fmt: skip
    return out


def run(watch: FleetWatch, per_window: list[list[dict[str, Any]]], first: int = 0) -> list[Any]:
    found = []
    for k, ws in enumerate(per_window, start=first):
        found += watch.observe(k * W_MS, (k + 1) * W_MS, ws)
    return found


def test_a_partition_wide_cap_is_one_finding_with_evidence_then_one_cleared() -> None:
    watch = FleetWatch(SETTINGS)
    normal = [windows(64, 0, clk=0.99)] * 10
    capped = [windows(64, 60, clk=0.99, capped_clk=0.90)] * 20
    after = [windows(64, 0, clk=0.99)] * 10
    found = run(watch, normal + capped + after)
    assert [f["status"] for f in found] == ["FLEET_WIDE", "CLEARED"]
    shift, cleared = found
    assert shift["job_id"] == FLEET_JOB and shift["node"] is None and shift["gpu_index"] is None
    assert shift["cause"] == "POWER" and cleared["cause"] == "POWER"
    assert shift["window_start_ms"] == 10 * W_MS and shift["detected_ms"] == 11 * W_MS
    assert (shift["windows_flagged"], shift["windows_considered"]) == (60, 64)
    assert shift["reason"].startswith("fleet-wide: 60 of 64 busy GPUs in partition gpu")
    assert "median clk -9.1% against before" in shift["reason"]
    assert shift["features"] == [{"feature": "clk", "value": 0.9, "peer_median": 0.99,
                                  "mad": 0.0, "z": 0.0}]  # fmt: skip
    # closed clear_after_s (30 s = 6 windows) after the cap ended
    assert cleared["window_end_ms"] == (30 + 6) * W_MS
    assert cleared["finding_id"] != shift["finding_id"]


def test_the_same_episode_has_the_same_id_in_another_watch() -> None:
    a, b = FleetWatch(SETTINGS), FleetWatch(SETTINGS)
    ws = [windows(64, 0)] * 3 + [windows(64, 64)] * 3
    assert [f["finding_id"] for f in run(a, ws)] == [f["finding_id"] for f in run(b, ws[1:], 1)]


@pytest.mark.parametrize(
    ("n", "capped"),
    [(64, 31), (15, 15)],  # under half the GPUs capped; too few GPUs to judge a fleet
)
def test_a_partial_or_small_cap_is_no_fleet_event(n: int, capped: int) -> None:
    assert run(FleetWatch(SETTINGS), [windows(n, capped)] * 10) == []


def test_idle_lost_and_silent_gpus_do_not_count() -> None:
    ws = windows(20, 20, job="idle:n0")
    ws += [{**w, "lost": True} for w in windows(20, 20)]
    ws += [{**w, "samples": 0} for w in windows(20, 20)]
    ws += windows(10, 10)  # 10 busy GPUs: under fleet_min_gpus
    assert census(ws, 0.5)["gpu"].gpus == 10
    assert run(FleetWatch(SETTINGS), [ws] * 5) == []


def test_partitions_are_judged_apart() -> None:
    ws = windows(32, 32, part="a") + windows(32, 0, part="b")
    found = run(FleetWatch(SETTINGS), [ws] * 3)
    assert len(found) == 1 and "partition a" in found[0]["reason"]


def test_an_old_or_repeated_window_start_changes_nothing() -> None:
    watch = FleetWatch(SETTINGS)
    assert len(watch.observe(10 * W_MS, 11 * W_MS, windows(64, 64))) == 1
    assert watch.observe(10 * W_MS, 11 * W_MS, windows(64, 64)) == []
    assert watch.observe(9 * W_MS, 10 * W_MS, windows(64, 0)) == []


def test_bad_settings_name_the_field() -> None:
    from peerwatch.errors import ConfigError

    with pytest.raises(ConfigError, match=r"detector\.fleet_cap_share"):
        DetectorSettings(fleet_cap_share=1.5)


def hot_windows(n: int, hot: int, clk: float, hot_clk: float) -> list[dict[str, Any]]:
    out = windows(n, 0, clk=clk)
    for w in out[:hot]:
        w.update(thermal_frac=1.0, clk_ratio=hot_clk)
    return out


def test_a_partition_wide_cooling_event_is_one_thermal_finding_and_stamps_its_windows() -> None:
    watch = FleetWatch(SETTINGS)
    normal = [hot_windows(64, 0, 0.98, 0.98) for _ in range(10)]
    hot = [hot_windows(64, 50, 0.98, 0.92) for _ in range(12)]
    after = [hot_windows(64, 0, 0.98, 0.98) for _ in range(8)]
    found = run(watch, normal + hot + after)
    assert [(f["status"], f["cause"]) for f in found] == [
        ("FLEET_WIDE", "THERMAL"), ("CLEARED", "THERMAL")
    ]  # fmt: skip
    shift = found[0]
    assert shift["reason"].startswith("fleet-wide: 50 of 64 busy GPUs in partition gpu in thermal")
    assert (shift["windows_flagged"], shift["windows_considered"]) == (50, 64)
    assert "fleet-wide thermal slowdown in partition gpu over" in found[1]["reason"]
    # During the shift each window carries the partition's median move (0.92 / 0.98); not
    # before it, not after it.
    assert all("fleet_clk_ratio" not in w for ws in normal + after for w in ws)
    for ws in hot:
        assert [w["fleet_clk_ratio"] for w in ws] == pytest.approx([0.92 / 0.98] * 64)


def test_a_cap_wins_over_heat_and_another_partition_is_not_stamped() -> None:
    watch = FleetWatch(SETTINGS)
    both = []
    for _ in range(4):
        ws = windows(32, 32, capped_clk=0.9)
        for w in ws:
            w["thermal_frac"] = 1.0
        both.append(ws + windows(32, 0, part="other"))
    found = run(watch, [windows(32, 0) + windows(32, 0, part="other")] * 4 + both)
    assert [(f["status"], f["cause"]) for f in found] == [("FLEET_WIDE", "POWER")]
    assert all("fleet_clk_ratio" not in w for w in both[-1] if w["partition"] == "other")
    assert all(w["fleet_clk_ratio"] == pytest.approx(0.9) for w in both[-1]
               if w["partition"] == "gpu")  # fmt: skip


def test_without_a_shift_free_past_no_window_is_stamped() -> None:
    watch = FleetWatch(SETTINGS)
    ws = [hot_windows(64, 64, 0.98, 0.92) for _ in range(3)]
    assert [f["status"] for f in run(watch, ws)] == ["FLEET_WIDE"]
    assert all("fleet_clk_ratio" not in w for w in ws[-1])


def test_a_cap_during_an_open_cooling_episode_closes_it_and_opens_its_own() -> None:
    watch = FleetWatch(SETTINGS)
    normal = [hot_windows(64, 0, 0.98, 0.98) for _ in range(10)]
    hot = [hot_windows(64, 64, 0.98, 0.92) for _ in range(4)]
    quiet = [hot_windows(64, 0, 0.98, 0.98) for _ in range(2)]  # under clear_after_s
    capped = [windows(64, 64, capped_clk=0.88) for _ in range(4)]
    found = run(watch, normal + hot + quiet + capped)
    assert [(f["status"], f["cause"]) for f in found] == [
        ("FLEET_WIDE", "THERMAL"), ("CLEARED", "THERMAL"), ("FLEET_WIDE", "POWER")
    ]  # fmt: skip
    assert found[1]["window_end_ms"] == found[2]["detected_ms"] == 17 * W_MS
    assert [w["fleet_clk_ratio"] for w in capped[-1]] == pytest.approx([0.88 / 0.98] * 64)
