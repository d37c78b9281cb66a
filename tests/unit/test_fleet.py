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
