"""Fleet context: a power cap over a whole partition is one FLEET_WIDE finding (cause POWER, no
GPU blamed) with its evidence, closed by one CLEARED; anything smaller, idle GPUs, or another
partition's cap changes nothing; the same episode gives the same finding id."""

from __future__ import annotations

import json
from typing import Any

import pytest

from peerwatch.streams.core.fleet import (
    FLEET_JOB,
    FleetWatch,
    SourceCensus,
    census,
    census_closed,
    set_ratios,
)
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


def _closed_windows() -> tuple[list[Any], list[dict[str, Any]]]:
    """Two aggregators (as two hot-stage partitions) over one window start: jobs in two Slurm
    partitions, idle GPUs, a lost GPU, GPUs at the power cap, in thermal slowdown, without a
    clock reading. Their closed windows as columns, and the same windows as dicts."""
    from peerwatch.streams.core.allocation import AllocationTable
    from peerwatch.streams.core.windows import POWER_CAP_BIT, THERMAL_BITS, WindowAggregator

    t0 = 1_767_225_600_000
    table = AllocationTable()
    for job, part, nodes in (("1", "a", ["n0", "n1"]), ("2", "b", ["n2"]), ("3", None, ["n3"])):
        allocs = [{"node": n, "gpu_indices": [0, 1, 2, 3]} for n in nodes]
        table.apply_event({"job_id": job, "kind": "STARTED", "ts_ms": t0 - 60_000,
                           "start_ms": t0 - 60_000, "user": "u", "partition": part,
                           "account": "x", "allocations": allocs})  # fmt: skip
    thermal = THERMAL_BITS & 0x40
    aggs = [WindowAggregator(table, 5, 1, idle_jobs=True) for _ in range(2)]
    for k in range(5):
        for n in range(4):
            gpus = []
            for i in range(8):  # GPUs 4-7 belong to no job: idle windows
                r: dict[str, Any] = {"index": i, "uuid": f"GPU-{n}-{i}", "state": "OK",
                                     "sm_clock_max_mhz": 2000, "clocks_event_reasons": 0}  # fmt: skip
                if (n, i) != (1, 3):  # one GPU without a clock reading
                    r["sm_clock_mhz"] = 1900 - 37 * i - 11 * n
                if (n, i) == (2, 1):
                    r["state"] = "LOST"
                if i in (0, 5) or n == 0:
                    r["clocks_event_reasons"] |= POWER_CAP_BIT
                if i in (1, 2) and k > 1:
                    r["clocks_event_reasons"] |= thermal
                gpus.append(r)
            sample = {"node": f"n{n}", "ts_ms": t0 + k * 1000, "gpus": gpus, "xids": []}
            aggs[n % 2].add_batch([sample])
    parts = [p for a in aggs for p in a.pop_all()]
    dicts = [w for a, p in zip(aggs, parts, strict=True) for b in a.group([p]) for w in b.windows]
    return parts, dicts


@pytest.mark.parametrize("cap_frac", [0.0, 0.5, 1.0])
def test_the_census_of_columns_is_the_census_of_their_dicts(cap_frac: float) -> None:
    parts, dicts = _closed_windows()
    assert len(parts) == 2 and {p.start_ms for p in parts} == {parts[0].start_ms}
    expected = census(dicts, cap_frac)
    assert set(expected) == {"a", "b", ""}  # job 3 has no partition; idle GPUs do not count
    # the GPU without a clock reading counts (without a clock); lost GPU 1 of n2 does not
    assert (expected["a"].gpus, expected["b"].gpus, expected[""].gpus) == (8, 3, 4)
    assert census_closed(parts, cap_frac) == expected


def test_the_fleet_watch_on_columns_finds_and_marks_what_it_finds_on_dicts() -> None:
    parts, dicts = _closed_windows()
    settings = DetectorSettings(fleet_min_gpus=3, clear_after_s=30, fleet_cap_share=0.5)
    on_dicts, on_columns = FleetWatch(settings), FleetWatch(settings)
    # a window start before, nothing capped or hot: each partition's reference clock 0.95
    before = [{**w, "clk_ratio": 0.95, "power_cap_frac": 0.0, "thermal_frac": 0.0} for w in dicts]
    on_dicts.observe(parts[0].start_ms - W_MS, parts[0].start_ms, before)
    on_columns.observe(parts[0].start_ms - W_MS, parts[0].start_ms, before)
    marked = [dict(w) for w in dicts]
    found = on_dicts.observe(parts[0].start_ms, parts[0].end_ms, marked)
    on_columns.add_closed(0, parts)
    on_columns.closed(0, parts[0].end_ms)
    got, ratios = on_columns.judge(), on_columns.shifted
    # job 3 (no partition): 2 of 4 GPUs hot; partition a: 5 of 8 at the power cap
    assert [(f["cause"], f["windows_considered"]) for f in found] == [("THERMAL", 4), ("POWER", 8)]
    assert got == found
    assert set(ratios[parts[0].start_ms]) == {"", "a"}
    for w in dicts:
        set_ratios([w], ratios[parts[0].start_ms])
    assert dicts == marked
    # partition a's 8 windows, job 3's 4 and the 16 idle ones (no partition either)
    assert sum(w.get("fleet_clk_ratio") is not None for w in marked) == 8 + 4 + 16
    on_columns.add_closed(0, parts)  # a repeated window start: nothing
    assert on_columns.judge() == [] and not on_columns.waiting


def _episode() -> list[list[dict[str, Any]]]:
    """A normal stretch, a power cap over 60 of 64 GPUs, a cooling event, then normal again."""
    normal = [windows(64, 0, clk=0.99)] * 10
    capped = [windows(64, 60, clk=0.99, capped_clk=0.90)] * 8
    hot = [
        [{**w, "thermal_frac": 1.0, "power_cap_frac": 0.0, "clk_ratio": 0.93 + 0.001 * (i % 5)}
         for i, w in enumerate(windows(64, 0))]
    ] * 6  # fmt: skip
    return normal + capped + hot + normal


@pytest.mark.parametrize("sources", [2, 5, 12])
def test_sources_merged_decide_as_one_source(sources: int) -> None:
    """DETECTION.md item 12: however the GPUs are split over sources (samples partitions),
    one watch judging their merged censuses gives the findings and ratios of one source."""
    one, many = FleetWatch(SETTINGS), FleetWatch(SETTINGS, sources)
    expected, got = [], []
    for k, ws in enumerate(_episode()):
        start, end = k * W_MS, (k + 1) * W_MS
        expected += one.observe(start, end, [dict(w) for w in ws])
        # each GPU's window to the source of its node, as the producers' partitioner does
        for src in range(sources):
            mine = [w for w in ws if int(str(w["node"])[1:]) % sources == src]
            many.add(src, start, end, census(mine, SETTINGS.fleet_cap_frac))
        for src in reversed(range(sources)):  # the watch waits for the slowest source
            assert many.judge() == []
            many.closed(src, end)
        got += many.judge()
        assert many.ratios(start) == one.ratios(start)
    assert [f["status"] for f in expected] == ["FLEET_WIDE", "CLEARED", "FLEET_WIDE", "CLEARED"]
    assert got == expected


def test_a_start_waits_for_every_source_and_a_late_census_is_ignored() -> None:
    watch = FleetWatch(SETTINGS, sources=2)
    capped = SourceCensus(32, 32, 0, (0.9,) * 32)
    watch.add(0, 0, W_MS, {"gpu": capped})
    watch.closed(0, W_MS)
    assert watch.judge() == [] and watch.judged_until_ms is None  # source 1 not heard from
    watch.add(1, 0, W_MS, {"gpu": capped})
    watch.closed(1, W_MS)
    (found,) = watch.judge()
    assert found["status"] == "FLEET_WIDE" and found["windows_considered"] == 64
    watch.add(1, 0, W_MS, {"gpu": capped})  # sent again (a restarted hot stage): ignored
    assert not watch.waiting


def test_a_census_sent_again_before_the_judgement_counts_once() -> None:
    watch = FleetWatch(SETTINGS, sources=2)
    capped = SourceCensus(32, 32, 0, (0.9,) * 32)
    for src in (0, 1, 1):  # source 1's census again (its hot stage restarted before a commit)
        watch.add(src, 0, W_MS, {"gpu": capped})
    watch.closed(0, W_MS)
    watch.closed(1, W_MS)
    (found,) = watch.judge()
    assert (found["windows_considered"], found["windows_flagged"]) == (64, 64)


def test_the_census_survives_json_and_the_state_a_restore() -> None:
    c = SourceCensus(3, 1, 0, (0.1, 0.30000000000000004, 1 / 3))
    assert SourceCensus.from_json(json.loads(json.dumps(c.to_json()))) == c
    for bad in (
        [3, 1, 0, "AAAA"],
        [3, 1, 0, "not base64!"],
        [3, 1, 0],
        [3, 1, 0, "AAAAAAAA+H8="],
        [3, 1, 0, "AAAAAAAA8H8="],
        [3, 1, 0, "AAAAAAAA8L8="],
        [3, 4, 0, "zczMzMzM7D8="],
        [-1, 0, 0, "zczMzMzM7D8="],
    ):
        # 3 bytes; not base64; short; a NaN; an infinity; negative; more capped than GPUs
        with pytest.raises((ValueError, TypeError)):
            SourceCensus.from_json(bad)
    a = FleetWatch(SETTINGS)
    run(a, _episode()[:14])
    b = FleetWatch(SETTINGS)
    b.restore(json.loads(json.dumps(a.to_dict())))
    rest = _episode()[14:]
    assert run(a, rest, first=14) == run(b, rest, first=14) != []


@pytest.mark.parametrize(
    "damage",
    [{"partitions": []}, {"partitions": {"gpu": {"cause": "COSMIC"}}}, {"shifted": {"x": {}}},
     {"partitions": {"gpu": {"clean_clk": ["a"], "finding_id": None, "cause": "POWER",
                             "start_ms": 0, "quiet_windows": 0, "reference_clk": None}}}],
)  # fmt: skip
def test_a_damaged_memory_is_refused_whole(damage: dict[str, Any]) -> None:
    a = FleetWatch(SETTINGS)
    run(a, _episode()[:14])
    saved = {**json.loads(json.dumps(a.to_dict())), **damage}
    b = FleetWatch(SETTINGS)
    with pytest.raises((KeyError, ValueError, TypeError, AttributeError)):
        b.restore(saved)
    assert b.partitions == {} and b.last_start_ms is None and b.shifted == {}
