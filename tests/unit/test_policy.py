"""The drain policy: when it drains, when it only alerts, and that it never repeats itself."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st
from windowgen import WINDOW_MS, run, window, with_overrides

from peerwatch.reasons import sanitize_reason
from peerwatch.streams.core.model import InvalidRecordError, JobContext, stable_id
from peerwatch.streams.core.policy import apply, record_kind
from peerwatch.streams.core.policy_state import DrainPolicyState
from peerwatch.streams.core.settings import PolicySettings

SCHEMAS = pathlib.Path(__file__).resolve().parents[2] / "schemas"
MINUTE_MS = 60_000
DAY_MS = 24 * 60 * MINUTE_MS

CLK_SLOW = {"feature": "clk", "value": 0.85, "peer_median": 0.90, "mad": 0.009, "z": -3.75}
THR_HIGH = {"feature": "thr", "value": 0.30, "peer_median": 0.0, "mad": 0.02, "z": 10.1}
SM_LOW = {"feature": "sm", "value": 0.45, "peer_median": 0.90, "mad": 0.02, "z": -15.2}
CLK_FINE = {"feature": "clk", "value": 0.90, "peer_median": 0.90, "mad": 0.009, "z": 0.0}


def finding(
    status: str,
    end_ms: int,
    *,
    job: str = "j1",
    node: str | None = "n1",
    gpu: int | None = 3,
    first_ms: int = 0,
    features: list[dict[str, Any]] | None = None,
    rules: list[str] | None = None,
) -> dict[str, Any]:
    start_ms = end_ms - WINDOW_MS
    return {
        "finding_id": stable_id(job, node, gpu, status, start_ms),
        "job_id": job,
        "node": node,
        "gpu_index": gpu,
        "gpu_uuid": None,
        "status": status,
        "window_start_ms": start_ms,
        "window_end_ms": end_ms,
        "features": features if features is not None else [CLK_SLOW, SM_LOW],
        "hard_rules": rules or [],
        "windows_flagged": 4,
        "windows_considered": 6,
        "first_flagged_ms": first_ms,
        "peer_group_size": 64,
        "reason": "test",
    }


def health(status: str, ts_ms: int, node: str = "n1") -> dict[str, Any]:
    return {
        "event_id": f"h-{ts_ms}",
        "node": node,
        "ts_ms": ts_ms,
        "phase": "PERIODIC",
        "job_id": None,
        "status": status,
        "exit_code": {"OK": 0, "WARNING": 1, "CRITICAL": 2}[status],
        "checks": [
            {"name": "ecc_uncorrected", "status": status, "message": "2 errors", "gpu_index": 5},
            {"name": "gpu_count", "status": "OK", "message": "8 GPUs", "gpu_index": None},
        ],
        "duration_ms": 800,
    }


def node_event(ts_ms: int, state: str, flags: list[str], node: str = "n1") -> dict[str, Any]:
    return {
        "event_id": f"e-{ts_ms}",
        "node": node,
        "ts_ms": ts_ms,
        "state": state,
        "flags": flags,
        "reason": None,
        "reason_user": None,
        "reason_set_ms": None,
        "partitions": ["gpu"],
        "source": "WATCHER",
    }


def feed(records: list[dict[str, Any]], state: DrainPolicyState | None = None) -> list[dict]:
    state = state if state is not None else DrainPolicyState()
    return [rec for r in records for rec in apply(r, state)]


def actions(recs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["action"], r["severity"]) for r in recs]


# --- the 10-minute rule ----------------------------------------------------------------------


@pytest.mark.parametrize(("last_heartbeat_min", "drains"), [(9.5, False), (10, True), (25, True)])
def test_straggler_confirmed_for_10_minutes_with_clock_evidence_drains(
    last_heartbeat_min: float, drains: bool
) -> None:
    confirmed_at = 3 * MINUTE_MS
    beats = [confirmed_at, confirmed_at + 5 * MINUTE_MS]
    beats.append(confirmed_at + int(last_heartbeat_min * MINUTE_MS))
    state = DrainPolicyState()
    first = apply(finding("CONFIRMED", beats[0]), state)
    assert actions(first) == [("ALERT", "WARNING")]
    assert feed([finding("CONFIRMED", beats[1])], state) == []
    last = feed([finding("CONFIRMED", beats[2])], state)
    if not drains:
        assert last == []
        return
    (drain,) = last
    assert (drain["action"], drain["severity"], drain["hard"]) == ("DRAIN", "WARNING", False)
    assert drain["gpu_indices"] == [3] and drain["job_ids"] == ["j1"]
    assert drain["reason"].startswith("straggler gpu3 job j1: clk -5.6%")
    assert drain["evidence"][0]["kind"] == "straggler"
    assert drain["expires_ms"] == beats[2] + PolicySettings().drain_expiry_s * 1000
    # the same episode never recommends twice, also not after later heartbeats
    assert feed([finding("CONFIRMED", beats[2] + 5 * MINUTE_MS)], state) == []


@pytest.mark.parametrize(
    "features", [[SM_LOW, CLK_FINE], [{**THR_HIGH, "value": 0.03, "z": 1.5}], []]
)
def test_low_sm_alone_or_no_hw_evidence_never_drains(features: list[dict[str, Any]]) -> None:
    records = [finding("SUSPECT", 2 * MINUTE_MS, features=features)]
    records += [finding("CONFIRMED", m * MINUTE_MS, features=features) for m in range(3, 90, 5)]
    recs = feed(records)
    assert recs and all(r["action"] == "ALERT" for r in recs)
    assert actions(recs) == [("ALERT", "INFO"), ("ALERT", "INFO")]  # suspect, confirmed


def test_cleared_episode_restarts_the_clock() -> None:
    state = DrainPolicyState()
    feed([finding("CONFIRMED", 0), finding("CLEARED", 5 * MINUTE_MS)], state)
    later = [finding("CONFIRMED", m * MINUTE_MS, first_ms=6 * MINUTE_MS) for m in (7, 12, 17)]
    assert actions(feed(later, state)) == [("ALERT", "WARNING"), ("DRAIN", "WARNING")]


# --- repeat offender ---------------------------------------------------------------------------


@pytest.mark.parametrize(("gap_days", "drains"), [(1, True), (6.9, True), (7.1, False)])
def test_repeat_offender_across_two_jobs_within_7_days(gap_days: float, drains: bool) -> None:
    state = DrainPolicyState()
    assert actions(feed([finding("CONFIRMED", MINUTE_MS, job="A")], state)) == [
        ("ALERT", "WARNING")
    ]
    t = MINUTE_MS + int(gap_days * DAY_MS)
    recs = feed([finding("CONFIRMED", t, job="B", gpu=6, first_ms=t - 3 * MINUTE_MS)], state)
    drains_now = [r for r in recs if r["action"] == "DRAIN"]
    if not drains:
        assert drains_now == []
        return
    (drain,) = drains_now
    assert drain["reason"].startswith("repeat offender: straggler in 2 jobs in 7d")
    assert drain["job_ids"] == ["A", "B"] and drain["gpu_indices"] == [3, 6]
    assert [e["kind"] for e in drain["evidence"]] == ["repeat_offender"] * 2
    again = feed(
        [finding("CONFIRMED", t + MINUTE_MS, job="B", gpu=6, first_ms=t - 3 * MINUTE_MS)], state
    )
    assert [r for r in again if r["action"] == "DRAIN"] == []


def test_sm_only_confirmations_do_not_make_a_repeat_offender() -> None:
    recs = feed(
        [
            finding("CONFIRMED", MINUTE_MS, job="A", features=[SM_LOW]),
            finding("CONFIRMED", 2 * MINUTE_MS, job="B", features=[SM_LOW]),
        ]
    )
    assert all(r["action"] == "ALERT" for r in recs)


# --- hard errors and health checks ------------------------------------------------------------------


def test_hard_error_drains_at_once_and_once_per_episode() -> None:
    state = DrainPolicyState()
    first = feed(
        [finding("HARD_ERROR", MINUTE_MS, rules=["ecc_uncorrected", "xid_79"], features=[])], state
    )
    (drain,) = first
    assert (drain["action"], drain["severity"], drain["hard"]) == ("DRAIN", "CRITICAL", True)
    assert drain["reason"] == "hard error gpu3: ecc_uncorrected xid_79"
    assert drain["evidence"][0]["kind"] == "hard_rule"
    assert feed([finding("HARD_ERROR", 2 * MINUTE_MS, gpu=5, rules=["xid_48"])], state) == []
    expiry_ms = PolicySettings().hard_expiry_s * 1000
    after = feed([finding("HARD_ERROR", MINUTE_MS + expiry_ms, rules=["xid_79"])], state)
    assert len(after) == 1 and after[0]["recommendation_id"] != drain["recommendation_id"]


def test_operator_resume_opens_a_new_episode() -> None:
    state = DrainPolicyState()
    feed([node_event(0, "IDLE", []), finding("HARD_ERROR", MINUTE_MS, rules=["xid_79"])], state)
    feed([node_event(2 * MINUTE_MS, "IDLE", ["DRAIN"])], state)
    assert feed([finding("HARD_ERROR", 3 * MINUTE_MS, rules=["xid_79"])], state) == []
    feed([node_event(60 * MINUTE_MS, "IDLE", [])], state)
    (again,) = feed([finding("HARD_ERROR", 61 * MINUTE_MS, rules=["xid_79"])], state)
    assert again["partition"] == "gpu"


def test_health_results() -> None:
    state = DrainPolicyState()
    (critical,) = feed([health("CRITICAL", 0)], state)
    assert (critical["action"], critical["severity"], critical["hard"]) == (
        "DRAIN",
        "CRITICAL",
        True,
    )
    assert critical["reason"] == "health CRITICAL: ecc_uncorrected"
    assert critical["gpu_indices"] == [5]
    assert feed([health("CRITICAL", MINUTE_MS)], state) == []
    assert feed([health("OK", 2 * MINUTE_MS)], state) == []
    assert actions(feed([health("CRITICAL", 3 * MINUTE_MS)], state)) == [("DRAIN", "CRITICAL")]
    assert actions(feed([health("WARNING", 0, node="n2")], state)) == [("ALERT", "WARNING")]


def test_job_wide_only_alerts() -> None:
    assert feed([finding("JOB_WIDE", MINUTE_MS, node=None, gpu=None, features=[])]) == []
    recs = feed([finding("JOB_WIDE", MINUTE_MS, node="n7", gpu=None, features=[])])
    assert actions(recs) == [("ALERT", "INFO")]
    # The one sanitiser bans ";" (peerwatch/reasons.py): the policy's own text has none.
    assert recs[0]["reason"].endswith(", no GPU blamed") and ";" not in recs[0]["reason"]


# --- ids, restarts, reasons, schema ---------------------------------------------------------------


def scenario() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [node_event(0, "MIXED", [])]
    records += [finding("SUSPECT", MINUTE_MS)]
    records += [finding("CONFIRMED", m * MINUTE_MS) for m in range(3, 30, 5)]
    records += [finding("CONFIRMED", DAY_MS + m * MINUTE_MS, job="B") for m in (1, 6)]
    records += [finding("HARD_ERROR", 2 * DAY_MS, rules=["xid_79"]), health("CRITICAL", 2 * DAY_MS)]
    return records


@pytest.mark.parametrize("split", range(0, 12, 2))
def test_state_round_trips_and_restarts_never_double_recommend(split: int) -> None:
    records = scenario()
    straight = feed(records)
    state = DrainPolicyState()
    first = feed(records[:split], state)
    restored = DrainPolicyState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    # a restart replays from the last committed offset: records before the split come again
    second = feed(records[max(0, split - 3) :], restored)
    assert first + second == straight
    # a fresh state replaying everything produces the very same ids
    assert [r["recommendation_id"] for r in feed(records)] == [
        r["recommendation_id"] for r in straight
    ]
    ids = [r["recommendation_id"] for r in straight]
    assert len(ids) == len(set(ids))
    assert [(r["action"], r["evidence"][0]["kind"]) for r in straight] == [
        ("ALERT", "straggler"),  # suspect
        ("ALERT", "straggler"),  # confirmed
        ("DRAIN", "straggler"),  # 10 minutes confirmed
        ("ALERT", "straggler"),  # confirmed in job B
        ("DRAIN", "repeat_offender"),
        ("DRAIN", "hard_rule"),
        ("DRAIN", "health_check"),
    ]


def test_recommendations_fit_the_schema() -> None:
    schema = fastavro.parse_schema(json.loads((SCHEMAS / "DrainRecommendation.avsc").read_text()))
    recs = feed(scenario())
    assert {r["action"] for r in recs} == {"ALERT", "DRAIN"}
    for rec in recs:
        assert fastavro.validation.validate(rec, schema, raise_errors=True)


@given(st.text(max_size=400))
def test_reason_is_fit_for_scontrol(text: str) -> None:
    reason = sanitize_reason("peerwatch: " + text)
    assert reason.isascii() and len(reason) <= 100
    assert not any(c in reason for c in "'\"`\\\n\r\t;$")
    assert not reason.lower().startswith("peerwatch:")
    assert reason == reason.strip()


def test_records_of_unknown_kind_or_missing_fields_raise() -> None:
    with pytest.raises(InvalidRecordError):
        record_kind({"something": 1})
    with pytest.raises(InvalidRecordError):
        apply({"finding_id": "x", "status": "CONFIRMED"}, DrainPolicyState())


# --- end to end: detector findings through the policy ----------------------------------------------


def test_throttling_gpu_from_detector_is_drained_after_10_minutes() -> None:
    job = JobContext(job_id="job1", expected_gpus=16, start_ms=0)

    def make(k: int) -> list[dict[str, Any]]:
        base = [window("job1", i, k) for i in range(16)]
        return with_overrides(base, {4: {"throttle_frac": 0.3}})

    results, _ = run(job, make, range(30))
    state = DrainPolicyState()
    drains = [
        (idx, rec)
        for idx, r in enumerate(results)
        for f in r.findings
        for rec in apply(f, state)
        if rec["action"] == "DRAIN"
    ]
    # confirmed in window 5 (ends 3 min), heartbeats every 10 windows: drained in window 25
    assert [(idx, rec["ts_ms"]) for idx, rec in drains] == [(25, 26 * WINDOW_MS)]
    assert drains[0][1]["reason"].startswith("straggler gpu4 job job1: thr +0.30")
