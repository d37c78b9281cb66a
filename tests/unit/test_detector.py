"""The straggler detector against DETECTION.md's cases and confounders."""

from __future__ import annotations

import json
import pathlib
import random
from dataclasses import replace
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from windowgen import (
    SETTINGS_30S,
    WINDOW_MS,
    findings,
    gpu_ident,
    noisy_job,
    run,
    statuses,
    window,
    with_overrides,
)

from peerwatch.streams.core.detector import detect_job_window
from peerwatch.streams.core.detector_state import JobDetectorState
from peerwatch.streams.core.model import InvalidRecordError, JobContext, gpu_key

FIRST_EVALUATED = 2  # windows 0 and 1 are the warm-up after a job start at 0 ms


def job(n: int, **kw: Any) -> JobContext:
    return JobContext(job_id="job1", expected_gpus=n, start_ms=0, **kw)


def quiet_job(n: int, seed: int = 1) -> tuple[random.Random, list[float]]:
    rng = random.Random(seed)
    return rng, [rng.uniform(-0.0015, 0.0015) for _ in range(n)]


# --- the straggler cases -------------------------------------------------------------------


@pytest.mark.parametrize("n", [8, 64, 512])
def test_clock_drop_of_5pct_of_max_clock_is_suspected_then_confirmed_after_4_of_6(n: int) -> None:
    # clk is SM clock / max SM clock; busy peers run at 0.90, the straggler 5 points lower
    # (5% of the max clock, 5.6% of the peers' clock).
    rng, offsets = quiet_job(n)
    victim = n // 2 - 1
    node, index = gpu_ident(victim)

    def make(k: int) -> list[dict[str, Any]]:
        base = noisy_job("job1", n, k, rng, offsets, clk_jitter=0.003)
        return with_overrides(base, {victim: {"clk_ratio": 0.85}}) if k >= FIRST_EVALUATED else base

    results, _ = run(job(n), make, range(8))
    assert [r.gated for r in results[:FIRST_EVALUATED]] == ["warmup", "warmup"]
    assert statuses(results) == [(2, "SUSPECT"), (5, "CONFIRMED")]
    confirmed = findings(results)[1]
    assert (confirmed["node"], confirmed["gpu_index"]) == (node, index)
    assert confirmed["windows_flagged"] == 4
    assert confirmed["first_flagged_ms"] == FIRST_EVALUATED * WINDOW_MS
    assert confirmed["peer_group_size"] == n
    clk = next(f for f in confirmed["features"] if f["feature"] == "clk")
    assert clk["z"] <= -3.5
    assert clk["value"] == pytest.approx(0.85)
    assert clk["peer_median"] == pytest.approx(0.90, abs=0.002)
    assert clk["mad"] == pytest.approx(
        SETTINGS_30S.mad_floor_clk_rel * clk["peer_median"]
    )  # the floor binds
    scores = {gpu_key(w["node"], w["gpu_index"]): w["score"] for w in results[5].windows}
    assert max(scores, key=lambda k: scores[k]) == gpu_key(node, index)


@pytest.mark.parametrize(
    ("floor", "drop", "flagged"),
    [
        # DETECTION.md's literal 1% floor: z = 0.6745 * drop / 1% reaches 3.5 only past 5.19%.
        (0.01, 0.05, False), (0.01, 0.0515, False), (0.01, 0.053, True),
        # The default 0.9% floor: the limit is 4.67%, so a 5% drop is flagged and 4.5% is not.
        (None, 0.045, False), (None, 0.05, True),
    ],
)  # fmt: skip
def test_clock_detection_limit_follows_the_mad_floor(
    floor: float | None, drop: float, flagged: bool
) -> None:
    def make(k: int) -> list[dict[str, Any]]:
        return [window("job1", i, k, clk_ratio=1.0 - (drop if i == 0 else 0.0)) for i in range(16)]

    settings = SETTINGS_30S if floor is None else replace(SETTINGS_30S, mad_floor_clk_rel=floor)
    results, _ = run(job(16), make, range(3), settings=settings)
    assert bool(findings(results)) is flagged


def test_throttling_gpu_is_confirmed_with_thr_evidence() -> None:
    rng, offsets = quiet_job(64)

    def make(k: int) -> list[dict[str, Any]]:
        base = noisy_job("job1", 64, k, rng, offsets)
        return with_overrides(base, {9: {"throttle_frac": 0.30, "clk_ratio": 0.88}})

    results, _ = run(job(64), make, range(8))
    assert statuses(results) == [(2, "SUSPECT"), (5, "CONFIRMED")]
    thr = next(f for f in findings(results)[1]["features"] if f["feature"] == "thr")
    assert thr["z"] >= 3.5 and thr["value"] - thr["peer_median"] >= 0.05
    assert "thr" in findings(results)[1]["reason"]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.sampled_from([8, 16, 64, 256, 512]),
    jitter=st.floats(0.005, 0.015),
    with_step=st.booleans(),
)
def test_healthy_noise_gives_no_finding(seed: int, n: int, jitter: float, with_step: bool) -> None:
    rng = random.Random(seed)
    offsets = [rng.uniform(-jitter / 2, jitter / 2) for _ in range(n)]

    def make(k: int) -> list[dict[str, Any]]:
        return noisy_job("job1", n, k, rng, offsets, clk_jitter=jitter, with_step=with_step)

    results, _ = run(job(n), make, range(24))
    assert findings(results) == []
    assert all(w["gated"] is None for r in results[FIRST_EVALUATED:] for w in r.windows)
    assert all(w["score"] < 3.5 for r in results[FIRST_EVALUATED:] for w in r.windows)


# --- confounders ---------------------------------------------------------------------------


def test_checkpoint_pause_everyone_idle_is_gated() -> None:
    def make(k: int) -> list[dict[str, Any]]:
        idle = [window("job1", i, k, sm_frac=0.03, clk_ratio=0.40) for i in range(64)]
        return with_overrides(idle, {5: {"clk_ratio": 0.20, "sm_frac": 0.0}})

    results, _ = run(job(64), make, range(10))
    assert findings(results) == []
    assert {r.gated for r in results[FIRST_EVALUATED:]} == {"low_activity"}
    assert all(w["score"] is None for r in results for w in r.windows)


def test_data_loader_stall_low_sm_alone_is_at_most_suspect() -> None:
    rng, offsets = quiet_job(64)

    def make(k: int) -> list[dict[str, Any]]:
        base = noisy_job("job1", 64, k, rng, offsets)
        return with_overrides(base, {17: {"sm_frac": 0.45, "throttle_frac": 0.0}})

    results, _ = run(job(64), make, range(30))
    got = statuses(results)
    assert got == [(FIRST_EVALUATED, "SUSPECT")]
    assert findings(results)[0]["gpu_index"] == gpu_ident(17)[1]
    assert "sm" in findings(results)[0]["reason"]


def test_job_wide_slowdown_blames_no_gpu() -> None:
    rng, offsets = quiet_job(64)
    slow = {i: {"clk_ratio": 0.80, "throttle_frac": 0.2} for i in range(0, 64, 3)}  # 22 of 64

    def make(k: int) -> list[dict[str, Any]]:
        return with_overrides(noisy_job("job1", 64, k, rng, offsets), slow)

    results, _ = run(job(64), make, range(12))
    got = findings(results)
    assert [f["status"] for f in got] == ["JOB_WIDE"]  # once per episode
    assert got[0]["node"] is None and got[0]["gpu_index"] is None
    assert got[0]["peer_group_size"] == 64
    assert all(w["gated"] == "job_wide" for r in results[FIRST_EVALUATED:] for w in r.windows)


def test_pipeline_stages_split_by_role_give_nothing() -> None:
    # 4 stages of 8 GPUs; the last stage legitimately runs at lower sm.
    roles = {gpu_key(*gpu_ident(i)): f"stage{i // 8}" for i in range(32)}
    rng, offsets = quiet_job(32)

    def make(k: int) -> list[dict[str, Any]]:
        base = noisy_job("job1", 32, k, rng, offsets)
        return with_overrides(base, {i: {"sm_frac": 0.60} for i in range(24, 32)})

    with_roles, _ = run(job(32, roles=roles), make, range(12))
    assert findings(with_roles) == []
    # Without the split, a quarter of the job looks slow (not more than 25%: no abstain).
    without, _ = run(job(32), make, range(12))
    assert {f["gpu_index"] for f in findings(without)} == set(range(8))
    assert {f["status"] for f in findings(without)} == {"SUSPECT"}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_small_jobs_use_own_baseline(n: int) -> None:
    def make(k: int) -> list[dict[str, Any]]:
        clk = 0.85 if k >= 6 else 0.90  # 2 warm-up, 3 baseline windows, then the drop
        return with_overrides([window("job1", i, k) for i in range(n)], {0: {"clk_ratio": clk}})

    results, _ = run(job(n), make, range(12))
    assert [r.windows[0]["gated"] for r in results[2:5]] == ["no_baseline"] * 3
    assert statuses(results) == [(6, "SUSPECT"), (9, "CONFIRMED")]
    clk = findings(results)[1]["features"][0]
    assert (clk["feature"], clk["peer_median"], clk["value"]) == ("clk", 0.90, 0.85)
    assert "own baseline" in findings(results)[1]["reason"]


@pytest.mark.parametrize("n", [1, 4])
def test_small_jobs_stay_quiet_when_healthy_or_power_capped(n: int) -> None:
    def make(k: int) -> list[dict[str, Any]]:
        capped = {"clk_ratio": 0.80, "power_cap_frac": 0.9} if k >= 8 else {}
        return [window("job1", i, k, **capped) for i in range(n)]

    results, _ = run(job(n), make, range(16))
    assert findings(results) == []


@pytest.mark.parametrize("n", [1, 4])
def test_small_jobs_are_judged_against_their_partitions_move_in_a_fleet_shift(n: int) -> None:
    """A cooling event moves the whole partition 6% down (windows carry fleet_clk_ratio): a GPU
    that moved with it is not flagged; one that fell 12% (6% below the partition's move) is."""

    def make(k: int, own_drop: float) -> list[dict[str, Any]]:
        shift = {"clk_ratio": 0.90 * 0.94, "thermal_frac": 1.0, "fleet_clk_ratio": 0.94}
        ws = [window("job1", i, k, **(shift if k >= 8 else {})) for i in range(n)]
        if k >= 8:
            ws[0]["clk_ratio"] = 0.90 * own_drop
        return ws

    moved, _ = run(job(n), lambda k: make(k, 0.94), range(16))
    assert findings(moved) == []
    fell, _ = run(job(n), lambda k: make(k, 0.88), range(16))
    assert [(f["gpu_index"], f["status"]) for f in findings(fell)][:1] == [(0, "SUSPECT")]
    clk = findings(fell)[0]["features"][0]
    assert clk["peer_median"] == pytest.approx(0.90 * 0.94)  # its own past times the move

    # Windows of a fleet shift do not teach the baseline: after it, the old baseline holds.
    def later(k: int) -> list[dict[str, Any]]:  # GPU 0 at 0.865 after it: 3.9% below 0.90
        if k < 16:
            return make(k, 0.94)
        return with_overrides([window("job1", i, k) for i in range(n)], {0: {"clk_ratio": 0.865}})

    after, _ = run(job(n), later, range(24))
    assert [f["status"] for f in findings(after)][:1] == ["SUSPECT"]


def test_small_job_where_every_gpu_drops_abstains_without_a_finding() -> None:
    # "2 of 2 GPUs slow" tells an operator nothing: the GPUs abstain (gated), nothing reported.
    def make(k: int) -> list[dict[str, Any]]:
        return [window("job1", i, k, clk_ratio=0.80 if k >= 6 else 0.90) for i in range(2)]

    results, _ = run(job(2), make, range(10))
    assert findings(results) == []
    assert all(w["gated"] == "job_wide" for r in results[6:] for w in r.windows)
    reported, _ = run(
        job(2), make, range(10), settings=replace(SETTINGS_30S, job_wide_report_min_gpus=2)
    )
    assert [f["status"] for f in findings(reported)] == ["JOB_WIDE"]


# --- hard rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 64])
def test_xid_79_is_a_hard_error_on_the_first_window_even_when_gated(n: int) -> None:
    def make(k: int) -> list[dict[str, Any]]:
        return with_overrides(
            [window("job1", i, k, sm_frac=0.05) for i in range(n)], {0: {"xids": [79]}}
        )

    results, _ = run(job(n), make, range(3))
    assert results[0].gated == "warmup"
    assert statuses(results) == [(0, "HARD_ERROR")]  # fires once, not again next window
    hard = findings(results)[0]
    assert hard["hard_rules"] == ["xid_79"]
    assert (hard["node"], hard["gpu_index"]) == gpu_ident(0)
    assert hard["window_start_ms"] == 0
    assert results[2].gated == "low_activity"


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"ecc_uncorrected_delta": 1}, "ecc_uncorrected"),
        ({"remap_failed": True}, "remap_failed"),
        ({"remap_pending": True}, "remap_pending"),
        ({"nvlink_errors_delta": 12}, "nvlink_errors"),
        ({"pcie_link_width_min": 8}, "pcie_width_degraded"),
        ({"lost": True, "samples": 0, "clk_ratio": None}, "gpu_lost"),
        ({"xids": [48, 13]}, "xid_48"),
        ({"xids": [94]}, "xid_94"),
    ],
)
def test_each_hard_rule_fires(fields: dict[str, Any], rule: str) -> None:
    windows = with_overrides([window("job1", i, 5) for i in range(16)], {3: fields})
    result = detect_job_window(job(16), windows, JobDetectorState("job1"), SETTINGS_30S)
    assert [(f["status"], f["hard_rules"]) for f in result.findings] == [("HARD_ERROR", [rule])]


def test_xid_13_is_recorded_and_blames_nobody() -> None:
    def make(k: int) -> list[dict[str, Any]]:
        return with_overrides([window("job1", i, k) for i in range(16)], {2: {"xids": [13, 31]}})

    results, _ = run(job(16), make, range(6))
    assert findings(results) == []
    recorded = results[3].recorded_xids
    assert [(r["xid"], r["category"]) for r in recorded] == [(13, "app"), (31, "app")]


def test_hard_rule_fires_again_after_a_quiet_spell() -> None:
    def make(k: int) -> list[dict[str, Any]]:
        xids = [79] if k in (3, 4, 20) else []
        return with_overrides([window("job1", i, k) for i in range(8)], {1: {"xids": xids}})

    results, _ = run(job(8), make, range(22))
    assert statuses(results) == [(3, "HARD_ERROR"), (20, "HARD_ERROR")]


# --- persistence, clearing, state, ids ---------------------------------------------------------


def straggler_episode(k: int, n: int = 16) -> list[dict[str, Any]]:
    """GPU 4 throttles in windows 2..9 and is healthy afterwards."""
    base = [window("job1", i, k) for i in range(n)]
    if 2 <= k <= 9:
        return with_overrides(base, {4: {"throttle_frac": 0.4, "clk_ratio": 0.85}})
    return base


def test_clears_after_exactly_10_clean_windows() -> None:
    results, state = run(job(16), straggler_episode, range(24))
    assert statuses(results) == [(2, "SUSPECT"), (5, "CONFIRMED"), (19, "CLEARED")]
    assert findings(results)[2]["first_flagged_ms"] == 2 * WINDOW_MS
    assert state.gpus[gpu_key(*gpu_ident(4))].status is None


def test_confirmed_episode_is_re_emitted_as_a_heartbeat() -> None:
    def make(k: int) -> list[dict[str, Any]]:
        base = [window("job1", i, k) for i in range(16)]
        return with_overrides(base, {4: {"throttle_frac": 0.4}})

    results, _ = run(job(16), make, range(27))
    assert statuses(results) == [
        (2, "SUSPECT"),
        (5, "CONFIRMED"),
        (15, "CONFIRMED"),
        (25, "CONFIRMED"),
    ]
    ids = [f["finding_id"] for f in findings(results)]
    assert len(set(ids)) == len(ids)
    assert {f["first_flagged_ms"] for f in findings(results)} == {2 * WINDOW_MS}


@pytest.mark.parametrize(
    ("flagged_windows", "confirmed_at"),
    [
        ({2, 3, 6, 7}, 7),
        ({2, 3, 5, 8, 10, 11, 12}, 12),
        ({2, 3, 7, 8}, None),
        ({2, 4, 6, 8, 10}, None),
    ],
)
def test_intermittent_straggler_needs_4_of_the_last_6(
    flagged_windows: set[int], confirmed_at: int | None
) -> None:
    def make(k: int) -> list[dict[str, Any]]:
        base = [window("job1", i, k) for i in range(16)]
        return with_overrides(base, {7: {"throttle_frac": 0.4}} if k in flagged_windows else {})

    results, _ = run(job(16), make, range(14))
    confirmed = [f for f in findings(results) if f["status"] == "CONFIRMED"]
    assert statuses(results, status="SUSPECT") == [(2, "SUSPECT")]
    if confirmed_at is None:
        assert confirmed == []
    else:
        assert statuses(results, status="CONFIRMED") == [(confirmed_at, "CONFIRMED")]
        assert (confirmed[0]["windows_flagged"], confirmed[0]["windows_considered"]) == (4, 6)


def test_cusum_mode_confirms_a_lasting_straggler_but_not_one_extreme_window() -> None:
    cusum = replace(SETTINGS_30S, persistence_mode="cusum")

    def lasting(k: int) -> list[dict[str, Any]]:
        return with_overrides(
            [window("job1", i, k) for i in range(16)], {4: {"throttle_frac": 0.9}}
        )

    def blip(k: int) -> list[dict[str, Any]]:
        fields = {4: {"throttle_frac": 1.0, "clk_ratio": 0.3}} if k == 3 else {}
        return with_overrides([window("job1", i, k) for i in range(16)], fields)

    results, _ = run(job(16), lasting, range(8), settings=cusum)
    assert statuses(results) == [(2, "SUSPECT"), (3, "CONFIRMED")]  # 3.0 + 3.0 >= h = 5
    results, _ = run(job(16), blip, range(16), settings=cusum)
    assert [s for _, s in statuses(results)] == ["SUSPECT", "CLEARED"]


def test_gated_windows_neither_flag_nor_clear() -> None:
    def make(k: int) -> list[dict[str, Any]]:
        sm = 0.05 if 8 <= k < 20 else 0.9  # a long checkpoint in the middle
        base = [window("job1", i, k, sm_frac=sm) for i in range(16)]
        return with_overrides(base, {4: {"throttle_frac": 0.4, "sm_frac": sm}})

    results, state = run(job(16), make, range(22))
    assert statuses(results) == [(2, "SUSPECT"), (5, "CONFIRMED")]
    assert state.gpus[gpu_key(*gpu_ident(4))].status == "CONFIRMED"


@pytest.mark.parametrize(("reported", "gate"), [(64, None), (58, None), (57, "incomplete")])
def test_incomplete_window_is_gated(reported: int, gate: str | None) -> None:
    state = JobDetectorState("job1", windows_seen=5)
    windows = [window("job1", i, 9) for i in range(reported)]
    assert detect_job_window(job(64), windows, state, SETTINGS_30S).gated == gate


def test_requeue_restarts_the_warmup_and_forgets_episodes() -> None:
    results, state = run(job(16), straggler_episode, range(7))
    assert state.gpus[gpu_key(*gpu_ident(4))].status == "CONFIRMED"
    requeued = job(16, requeue_ms=7 * WINDOW_MS)
    results, state = run(
        requeued, lambda k: [window("job1", i, k) for i in range(16)], range(7, 12), state=state
    )
    assert [r.gated for r in results] == ["warmup", "warmup", None, None, None]
    assert state.gpus[gpu_key(*gpu_ident(4))].status is None
    assert findings(results) == []


@pytest.mark.parametrize("split", [0, 3, 5, 9, 15])
def test_state_round_trips_mid_run_with_identical_results(split: int) -> None:
    def make(k: int) -> list[dict[str, Any]]:
        return straggler_episode(k, n=16)

    straight, _ = run(job(16), make, range(24))
    first, state = run(job(16), make, range(split))
    restored = JobDetectorState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    second, _ = run(job(16), make, range(split, 24), state=restored)
    assert [(r.windows, r.findings, r.gated) for r in first + second] == [
        (r.windows, r.findings, r.gated) for r in straight
    ]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_input_order_does_not_matter_and_ids_are_deterministic(seed: int) -> None:
    shuffler = random.Random(seed)

    def shuffled(k: int) -> list[dict[str, Any]]:
        windows = straggler_episode(k, n=24)
        shuffler.shuffle(windows)
        return windows

    a, _ = run(job(24), lambda k: straggler_episode(k, n=24), range(22))
    b, _ = run(job(24), shuffled, range(22))
    assert [(r.windows, r.findings) for r in a] == [(r.windows, r.findings) for r in b]
    ids = [f["finding_id"] for f in findings(a)]
    assert len(set(ids)) == len(ids) and all(len(i) == 32 for i in ids)


def test_redelivered_window_is_skipped() -> None:
    state = JobDetectorState("job1")
    _, state = run(job(16), straggler_episode, range(6), state=state)
    again = detect_job_window(job(16), straggler_episode(5), state, SETTINGS_30S)
    assert again.skipped == "already_processed" and again.findings == []


def test_score_and_gate_annotation() -> None:
    results, _ = run(job(16), straggler_episode, range(4))
    assert all(w["score"] is None and w["gated"] == "warmup" for w in results[0].windows)
    scores = [w["score"] for w in results[3].windows]
    assert all(isinstance(s, float) for s in scores)
    assert max(scores) == results[3].windows[4]["score"] >= 3.5


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (lambda ws: [*ws, dict(ws[0])], "GPU .* twice in one window"),
        (lambda ws: [ws[2], ws[1], dict(ws[1])], "GPU .* twice in one window"),  # out of order
        (lambda ws: [ws[0], dict(ws[1], window_start_ms=999)], "different starts mixed"),
        (lambda ws: [dict(ws[0], job_id="other")], "GpuWindow of job 'other' in job 'job1'"),
        (lambda ws: [{k: v for k, v in ws[0].items() if k != "node"}], "lacks 'node'"),
        (lambda ws: [ws[0], dict(ws[1], window_end_ms=None)], "lacks 'window_end_ms'"),
        (lambda ws: [dict(ws[0], window_start_ms=None), ws[1]], "lacks 'window_start_ms'"),
        # the first fault in checking order: a missing field before another job
        (lambda ws: [dict(ws[0], job_id="other", gpu_index=None)], "lacks 'gpu_index'"),
        (lambda ws: [ws[0], dict(ws[1], gpu_index="x")], "bad gpu_index 'x'"),
    ],
)
def test_invalid_input_raises_naming_the_fault(bad: Any, message: str) -> None:
    windows = [window("job1", i, 3) for i in range(4)]
    with pytest.raises(InvalidRecordError, match=message):
        detect_job_window(job(4), bad(windows), JobDetectorState("job1"))


def test_windows_missing_a_feature_or_samples_are_handled() -> None:
    windows = with_overrides(
        [window("job1", i, 5) for i in range(16)],
        {0: {"samples": 0, "clk_ratio": None, "sm_frac": None}, 1: {"step_ms": 900.0}},
    )
    result = detect_job_window(
        job(16), windows, JobDetectorState("job1", windows_seen=4), SETTINGS_30S
    )
    assert result.gated is None and result.findings == []
    assert result.windows[0]["gated"] == "no_data" and result.windows[0]["score"] is None


def test_outputs_fit_the_schemas() -> None:
    schemas = pathlib.Path(__file__).resolve().parents[2] / "schemas"
    finding_schema = fastavro.parse_schema(
        json.loads((schemas / "StragglerFinding.avsc").read_text())
    )
    window_schema = fastavro.parse_schema(json.loads((schemas / "GpuWindow.avsc").read_text()))

    def make(k: int) -> list[dict[str, Any]]:
        fields = {4: {"throttle_frac": 0.4, "xids": [79] if k == 3 else []}}
        if k >= 14:
            fields.update({i: {"clk_ratio": 0.7} for i in range(8, 13)})  # job-wide
        return with_overrides(straggler_episode(k), fields)

    results, _ = run(job(16), make, range(16))
    assert {f["status"] for f in findings(results)} == {
        "SUSPECT",
        "CONFIRMED",
        "HARD_ERROR",
        "JOB_WIDE",
    }
    for f in findings(results):
        assert fastavro.validation.validate(f, finding_schema, raise_errors=True)
    for w in (w for r in results for w in r.windows):
        assert fastavro.validation.validate(w, window_schema, raise_errors=True)


def test_a_job_wide_throttle_change_is_gated_so_a_skewed_node_straddling_it_is_not_flagged() -> (
    None
):
    """A cooling event ends at the start of window 11: every GPU of the job was hot until then;
    node0's clock runs 6 s ahead, so its GPUs still look hot for 0.2 of window 11."""

    def make(k: int) -> list[dict[str, Any]]:
        thr = 0.9 if k < 11 else 0.0
        ahead = 0.9 if k < 11 else 0.2 if k == 11 else 0.0
        return [
            window("job1", i, k, throttle_frac=ahead if i < 8 else thr,
                   thermal_frac=ahead if i < 8 else thr)
            for i in range(32)
        ]  # fmt: skip

    results, state = run(job(32), make, range(16))
    assert [r.gated for r in results[10:13]] == [None, "phase_change", None]
    assert findings(results) == []
    assert state.last_job_thr == 0.0
    # The same windows with the gate off: node0's GPUs are suspects (thr +0.2).
    loose = replace(SETTINGS_30S, phase_change_thr=0.95)
    results, _ = run(job(32), make, range(16), settings=loose)
    assert results[11].gated is None
    assert {(f["node"], f["status"]) for f in findings(results)} == {("node0000", "SUSPECT")}
