"""The drain policy (peerwatch.exporters.drain.decide): every limit, the breaker, cooldown vs
hard errors, duplicates, hostile input, and the reason sanitiser."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.decide import (
    ClusterView,
    NodeFacts,
    Outcome,
    Refusal,
    apply_decision,
    decide,
    expired_drains,
    observe_node,
)
from peerwatch.exporters.drain.sanitize import FORBIDDEN, valid_node_name
from peerwatch.exporters.drain.state import ControllerState
from peerwatch.reasons import reason_is_clean, slurm_reason

NOW_MS = 1_795_000_000_000
MIN_MS = 60_000
ENFORCE = DrainSettings(enforce=True, operator_cooldown_s=24 * 3600)


def rec(node: str = "gpu001", rid: str = "r1", **kw: Any) -> dict[str, Any]:
    """A recommendation; ``ts_ms`` None = evidence taken when it is decided (see ``run``)."""
    base: dict[str, Any] = {
        "recommendation_id": rid, "node": node, "ts_ms": None, "action": "DRAIN",
        "severity": "WARNING", "hard": False, "reason": "sm clock 12% below peers",
        "gpu_indices": [3], "job_ids": ["4242"], "partition": "gpu", "evidence": [],
        "expires_ms": None,
    }  # fmt: skip
    base.update(kw)
    return base


def cluster(n: int = 100, part: str = "gpu", **special: NodeFacts) -> ClusterView:
    nodes = [NodeFacts(f"gpu{i:03d}", "IDLE", (), None, None, (part,)) for i in range(1, n + 1)]
    return ClusterView.of([special.get(x.name, x) for x in nodes])


def drained(name: str, reason: str, user: str = "root", part: str = "gpu") -> NodeFacts:
    return NodeFacts(name, "IDLE", ("DRAIN",), reason, user, (part,))


def run(
    recs: list[dict[str, Any]],
    settings: DrainSettings = ENFORCE,
    view: ClusterView | None = None,
    state: ControllerState | None = None,
    step_ms: int = MIN_MS,
) -> tuple[list[Any], ControllerState]:
    """Decide and record each recommendation in turn, ``step_ms`` apart; one without an evidence
    time gets the time it is decided at (fresh evidence)."""
    state = state or ControllerState()
    view = view or cluster()
    out = []
    for i, r in enumerate(recs):
        now = NOW_MS + i * step_ms
        if r["ts_ms"] is None:
            r = {**r, "ts_ms": now}
        d = decide(r, state, view, settings, now)
        apply_decision(state, d, settings)
        out.append(d)
    return out, state


def test_enforce_drains_with_the_sanitised_prefixed_reason() -> None:
    [d], state = run([rec()])
    assert d.outcome == Outcome.DRAINED and d.enforce
    assert d.slurm_reason == "peerwatch: sm clock 12% below peers"
    assert d.partition == "gpu" and d.refusal is None
    assert "gpu001" in state.enforce.drained
    assert state.decided["r1"].decision == "DRAINED"


def test_shadow_is_the_default_and_changes_nothing_real() -> None:
    [d], state = run([rec()], DrainSettings())
    assert d.outcome == Outcome.SHADOWED and d.mode == "SHADOW"
    assert state.enforce.drained == {} and "gpu001" in state.shadow.drained
    # a second recommendation for the node shadow-"drained" is a duplicate, not a second drain
    [d2], _ = run([rec(rid="r2")], DrainSettings(), state=state)
    assert d2.outcome == Outcome.DUPLICATE


def test_same_id_twice_is_duplicate_and_not_recorded_twice() -> None:
    [d1, d2], state = run([rec(), rec()])
    assert d1.outcome == Outcome.DRAINED
    assert d2.outcome == Outcome.DUPLICATE and "DRAINED" in d2.detail
    assert state.enforce.job_drains["4242"] == [NOW_MS]


def test_refused_ids_stay_decided() -> None:
    view = cluster(gpu001=drained("gpu001", "bad dimm"))
    [d1, d2], _ = run([rec(), rec()], view=view)
    assert d1.refusal == Refusal.FOREIGN_REASON
    assert d2.outcome == Outcome.DUPLICATE and "foreign_reason" in d2.detail


def test_alert_is_audited_never_drained() -> None:
    [d], state = run([rec(action="ALERT")])
    assert d.outcome == Outcome.REFUSED and d.refusal == Refusal.ALERT_ONLY
    assert state.enforce.drained == {}


def test_unknown_action_is_invalid() -> None:
    [d], _ = run([rec(action="UNKNOWN")])
    assert d.refusal == Refusal.INVALID_INPUT


def test_unknown_node_is_refused() -> None:
    [d], _ = run([rec(node="gpu999")])
    assert d.refusal == Refusal.UNKNOWN_NODE and d.node == "gpu999"


@pytest.mark.parametrize(
    "reason,user", [("bad dimm", "alice"), ("NHC: gpu missing", "root"), ("", None)]
)
def test_foreign_reason_is_never_overwritten(reason: str, user: str | None) -> None:
    [d], state = run([rec()], view=cluster(gpu001=drained("gpu001", reason, user or "root")))
    assert d.refusal == Refusal.FOREIGN_REASON
    assert state.enforce.drained == {}


def test_down_node_with_foreign_reason_is_refused() -> None:
    node = NodeFacts("gpu001", "DOWN", ("NOT_RESPONDING",), "Not responding", "slurm", ("gpu",))
    [d], _ = run([rec()], view=cluster(gpu001=node))
    assert d.refusal == Refusal.FOREIGN_REASON


def test_node_already_drained_by_peerwatch_is_a_duplicate_and_adopted() -> None:
    # e.g. a kill between scontrol and the state save: the replay must not act again
    view = cluster(gpu001=drained("gpu001", "peerwatch: sm clock"))
    [d], state = run([rec()], view=view)
    assert d.outcome == Outcome.DUPLICATE and d.adopt
    assert "gpu001" in state.enforce.drained
    assert state.decided["r1"].decision == "DUPLICATE"


def test_job_rate_limit_one_drain_per_job_per_30_min() -> None:
    recs = [rec("gpu001", "a"), rec("gpu002", "b")]
    [d1, d2], _ = run(recs, step_ms=29 * MIN_MS)
    assert d1.outcome == Outcome.DRAINED
    assert d2.refusal == Refusal.JOB_RATE_LIMIT and "4242" in d2.detail
    [_, d2], _ = run(recs, step_ms=31 * MIN_MS)
    assert d2.outcome == Outcome.DRAINED


def test_other_jobs_are_not_limited_by_the_job_rate() -> None:
    [_, d2], _ = run([rec("gpu001", "a"), rec("gpu002", "b", job_ids=["77"])])
    assert d2.outcome == Outcome.DRAINED


def test_partition_rate_two_percent_per_hour() -> None:
    # 100 nodes at 2% = 2 drains per hour; the third within the hour is refused
    recs = [rec(f"gpu{i:03d}", f"r{i}", job_ids=[str(i)]) for i in range(1, 4)]
    out, _ = run(recs, replace(ENFORCE, breaker_pct=50))
    assert [d.outcome for d in out[:2]] == [Outcome.DRAINED] * 2
    assert out[2].refusal == Refusal.PARTITION_RATE_LIMIT
    out, _ = run(recs, replace(ENFORCE, breaker_pct=50), step_ms=31 * MIN_MS)
    assert out[2].outcome == Outcome.DRAINED  # the first drain left the 1 h window


def test_partition_below_fifty_nodes_drains_nothing_unless_a_floor_is_set() -> None:
    view = cluster(20)
    [d], _ = run([rec()], view=view)
    assert d.refusal == Refusal.PARTITION_RATE_LIMIT and "allows 0" in d.detail
    [d], _ = run([rec()], replace(ENFORCE, partition_min_drains=1, breaker_pct=10), view=view)
    assert d.outcome == Outcome.DRAINED


def test_partition_size_override_from_settings() -> None:
    view = ClusterView.of(
        [NodeFacts("gpu001", "IDLE", (), None, None, ("gpu",))], {"gpu": 100}, cluster_size=100
    )
    [d], _ = run([rec()], view=view)
    assert d.outcome == Outcome.DRAINED


def test_breaker_opens_above_five_percent_and_latches() -> None:
    # 5% of 100 = 5 peerwatch-drained nodes; the 6th would exceed it
    view = cluster(
        100, **{f"gpu{i:03d}": drained(f"gpu{i:03d}", "peerwatch: x") for i in range(1, 6)}
    )
    settings = replace(ENFORCE, partition_rate_pct=100)
    [d], state = run([rec("gpu050", "six")], settings, view)
    assert d.refusal == Refusal.BREAKER_OPEN and d.open_breaker
    assert state.breaker.open and "6 of 100" in state.breaker.why
    # even when the count would allow it, an open breaker blocks every further drain
    [d], state = run([rec("gpu060", "seven", job_ids=["9"])], settings, cluster(100), state)
    assert d.refusal == Refusal.BREAKER_OPEN and "reset-breaker" in d.detail
    state.reset_breaker(NOW_MS)
    [d], _ = run([rec("gpu060", "eight", job_ids=["9"])], settings, cluster(100), state)
    assert d.outcome == Outcome.DRAINED


def test_breaker_exactly_at_threshold_is_still_closed() -> None:
    view = cluster(
        100, **{f"gpu{i:03d}": drained(f"gpu{i:03d}", "peerwatch: x") for i in range(1, 5)}
    )
    [d], state = run([rec("gpu050")], replace(ENFORCE, partition_rate_pct=100), view)
    assert d.outcome == Outcome.DRAINED and not state.breaker.open  # 5 of 100 = 5%, not above


def test_breaker_counts_the_ledger_too() -> None:
    settings = replace(ENFORCE, partition_rate_pct=100, breaker_pct=2)
    recs = [rec(f"gpu{i:03d}", f"r{i}", job_ids=[str(i)]) for i in range(1, 4)]
    out, state = run(recs, settings)  # Slurm view stays idle: the ledger alone counts
    assert [d.outcome for d in out[:2]] == [Outcome.DRAINED] * 2
    assert out[2].refusal == Refusal.BREAKER_OPEN and state.breaker.open


def test_shadow_breaker_is_simulated_but_never_latched() -> None:
    settings = DrainSettings(partition_rate_pct=100, breaker_pct=1)
    out, state = run(
        [rec("gpu001", "a", job_ids=["1"]), rec("gpu002", "b", job_ids=["2"])], settings
    )
    assert out[0].outcome == Outcome.SHADOWED
    assert out[1].refusal == Refusal.BREAKER_OPEN and "shadow" in out[1].detail
    assert not state.breaker.open


def test_shadow_limits_use_their_own_ledger() -> None:
    state = ControllerState()
    run([rec("gpu001", "a")], DrainSettings(), state=state)
    [d], _ = run([rec("gpu002", "b")], ENFORCE, state=state)
    assert d.outcome == Outcome.DRAINED  # the shadow drain of job 4242 does not count here


def test_operator_cooldown_blocks_soft_but_not_hard() -> None:
    state = ControllerState()
    run([rec()], state=state)
    observe_node(state, NodeFacts("gpu001", "IDLE", (), None, None, ("gpu",)), NOW_MS + 5 * MIN_MS)
    assert state.operator_resumes["gpu001"] == NOW_MS + 5 * MIN_MS
    later = NOW_MS + 2 * 3600_000  # evidence taken after the resume
    soft = decide(rec(rid="soft", job_ids=["1"], ts_ms=later), state, cluster(), ENFORCE, later)
    assert soft.refusal == Refusal.OPERATOR_COOLDOWN
    hard = rec(rid="hard", job_ids=["1"], hard=True, ts_ms=later)
    assert decide(hard, state, cluster(), ENFORCE, later).outcome == Outcome.DRAINED
    after_ms = NOW_MS + 25 * 3600_000
    after = decide(
        rec(rid="late", job_ids=["1"], ts_ms=after_ms), state, cluster(), ENFORCE, after_ms
    )
    assert after.outcome == Outcome.DRAINED


def test_observations_older_than_the_drain_are_ignored() -> None:
    state = ControllerState()
    run([rec()], state=state)
    idle = NodeFacts("gpu001", "IDLE", (), None, None, ("gpu",))
    assert observe_node(state, idle, NOW_MS - 1) is None
    assert "gpu001" in state.enforce.drained
    assert observe_node(state, drained("gpu001", "peerwatch: x"), NOW_MS + 1) is None
    assert (
        observe_node(state, drained("gpu001", "operator: taking over"), NOW_MS + 1) == "taken_over"
    )
    assert state.operator_resumes == {}


def test_expired_drains() -> None:
    _, state = run([rec(expires_ms=NOW_MS + 10 * MIN_MS)])
    assert expired_drains(state, NOW_MS + 9 * MIN_MS) == []
    assert [d.node for d in expired_drains(state, NOW_MS + 10 * MIN_MS)] == ["gpu001"]


HOSTILE_NODES = [
    "gpu001; scontrol update NodeName=ALL State=DOWN", "gpu$(reboot)", "gpu`id`", "gpu001\n",
    "gpu[001-100]", "gpu001,gpu002", "'gpu001'", '"gpu001"', "", " gpu001", "-gpu", "g" * 300,
    "gpu001 State=DOWN", "ALL=1", "gpu\x00",
]  # fmt: skip


@pytest.mark.parametrize("node", HOSTILE_NODES)
def test_hostile_node_names_are_refused_as_invalid_input(node: str) -> None:
    [d], state = run([rec(node=node)])
    assert d.outcome == Outcome.REFUSED and d.refusal == Refusal.INVALID_INPUT
    assert all(" " <= c <= "~" and c not in FORBIDDEN for c in d.node)
    assert len(d.node) <= 67 and state.enforce.drained == {}


@pytest.mark.parametrize("bad", [{"node": 5}, {"recommendation_id": ""}, {"recommendation_id": None},
                                 {"recommendation_id": "a b"}, {"job_ids": ["1; rm -rf /"]}, {"job_ids": "42"}])  # fmt: skip
def test_malformed_fields_are_invalid_input(bad: dict[str, Any]) -> None:
    [d], _ = run([rec(**bad)])
    assert d.refusal == Refusal.INVALID_INPUT


@pytest.mark.parametrize(
    "reason,expected",
    [
        (
            'xid 79 "fallen off the bus"; $(reboot) `id`',
            "peerwatch: xid 79 fallen off the bus (reboot) id",
        ),
        ("line1\nline2\r\n\tend", "peerwatch: line1 line2 end"),
        ("peerwatch: already prefixed", "peerwatch: already prefixed"),
        ("", "peerwatch: no reason given"),
        ("$$$;;;", "peerwatch: no reason given"),
        ("caf\u00e9 \u2603 ok", "peerwatch: caf ok"),
    ],
)
def test_reasons_are_sanitised(reason: str, expected: str) -> None:
    [d], _ = run([rec(reason=reason)])
    assert d.outcome == Outcome.DRAINED and d.slurm_reason == expected


def test_long_reasons_are_cut() -> None:
    [d], _ = run([rec(reason="x" * 10_000)])
    assert d.slurm_reason is not None and len(d.slurm_reason) == ENFORCE.max_reason_chars


@given(st.text(), st.integers(min_value=19, max_value=300))
def test_sanitiser_output_is_always_safe(reason: str, max_chars: int) -> None:
    out = slurm_reason(reason, max_chars)
    assert out.startswith("peerwatch: ")
    assert len(out) <= max_chars and len(out) > len("peerwatch: ")
    assert all(" " <= c <= "~" for c in out)
    assert not FORBIDDEN & set(out)
    assert "\n" not in out and "\r" not in out
    assert reason_is_clean(out)


@given(st.text(max_size=80))
def test_valid_node_names_carry_no_separator(name: str) -> None:
    if valid_node_name(name):
        assert not set(name) & set(" ,[]\n;$`'\"()=")


# Issue 39: never act on stale evidence; an absolute, cluster-wide cap.


def test_expired_recommendation_is_refused_not_drained() -> None:
    # 6 h old, expired 5 h ago: drained on the old code, then auto-resumed at once (a flap)
    old = rec(ts_ms=NOW_MS - 6 * 3600_000, expires_ms=NOW_MS - 5 * 3600_000)
    [d], state = run([old], replace(ENFORCE, max_age_s=7 * 3600, hard_max_age_s=7 * 3600))
    assert d.outcome == Outcome.REFUSED and d.refusal == Refusal.EXPIRED
    assert "expired at" in d.detail and "18000 s ago" in d.detail
    assert state.enforce.drained == {} and state.decided["r1"].refusal == "expired"
    [d], _ = run([rec(expires_ms=NOW_MS)])  # expiring this very ms counts as expired
    assert d.refusal == Refusal.EXPIRED


@pytest.mark.parametrize("hard,age_s,stale", [(False, 300, False), (False, 301, True),
                                               (True, 301, False), (True, 3601, True)])  # fmt: skip
def test_evidence_older_than_the_freshness_bound_is_refused(
    hard: bool, age_s: int, stale: bool
) -> None:
    # Defaults: 300 s for soft evidence, 3600 s for hard; the expiry is still ahead.
    r = rec(ts_ms=NOW_MS - age_s * 1000, hard=hard, expires_ms=NOW_MS + 3600_000)
    [d], state = run([r])
    if stale:
        assert d.refusal == Refusal.STALE and f"{age_s} s old" in d.detail
        assert state.enforce.drained == {}
    else:
        assert d.outcome == Outcome.DRAINED


def test_shadow_mode_refuses_stale_evidence_too() -> None:
    [d], state = run([rec(ts_ms=NOW_MS - 3600_000)], DrainSettings())
    assert d.refusal == Refusal.STALE and d.mode == "SHADOW" and state.shadow.drained == {}


@pytest.mark.parametrize("ts", [None, "1795000000000", 1.5e12, True])
def test_evidence_time_must_be_an_integer(ts: Any) -> None:
    d = decide(rec(ts_ms=ts), ControllerState(), cluster(), ENFORCE, NOW_MS)
    assert d.refusal == Refusal.INVALID_INPUT and "ts_ms" in d.detail


def test_evidence_from_the_future_is_refused() -> None:
    # Such a time would pass the age checks (and the resume check) for as long as it is ahead.
    ahead = rec(ts_ms=NOW_MS + 61_000)
    d = decide(ahead, ControllerState(), cluster(), ENFORCE, NOW_MS)
    assert d.refusal == Refusal.INVALID_INPUT and "ahead" in d.detail
    assert (
        decide(rec(ts_ms=NOW_MS + 60_000), ControllerState(), cluster(), ENFORCE, NOW_MS).outcome
        == Outcome.DRAINED
    )


def test_a_node_already_drained_by_us_is_adopted_whatever_the_age() -> None:
    # a crash between scontrol and the save, found only after a long outage: adopt, never
    # refuse (the node would stay drained, unknown to the ledger and to auto-resume)
    view = cluster(gpu001=drained("gpu001", "peerwatch: sm clock"))
    old = rec(ts_ms=NOW_MS - 6 * 3600_000, expires_ms=NOW_MS - 3600_000)
    [d], state = run([old], view=view)
    assert d.outcome == Outcome.DUPLICATE and d.adopt
    assert [e.node for e in expired_drains(state, NOW_MS)] == ["gpu001"]  # auto-resume frees it


def test_hard_evidence_older_than_an_operator_resume_never_drains() -> None:
    state = ControllerState()
    run([rec()], state=state)  # drained at NOW_MS
    resumed = NOW_MS + 10 * MIN_MS
    observe_node(state, NodeFacts("gpu001", "IDLE", (), None, None, ("gpu",)), resumed)
    now = resumed + MIN_MS
    for ts in (resumed - 1, resumed):  # taken before (or at) the resume: hard or not
        late = rec(rid=f"late{ts}", job_ids=["1"], hard=True, ts_ms=ts)
        d = decide(late, state, cluster(), ENFORCE, now)
        assert d.refusal == Refusal.EVIDENCE_BEFORE_RESUME and str(resumed) in d.detail
    fresh = rec(rid="fresh", job_ids=["1"], hard=True, ts_ms=resumed + 1)
    assert decide(fresh, state, cluster(), ENFORCE, now).outcome == Outcome.DRAINED


def unpartitioned(n: int) -> ClusterView:
    return ClusterView.of(NodeFacts(f"gpu{i:03d}", "IDLE") for i in range(1, n + 1))


def test_nodes_in_no_partition_are_held_to_the_cluster_cap() -> None:
    # No partition: no rate limit and no breaker apply. The old code drained 100 of 100.
    recs = [rec(f"gpu{i:03d}", f"r{i}", job_ids=[str(i)], partition=None) for i in range(1, 101)]
    out, state = run(recs, view=unpartitioned(100), step_ms=1)
    assert [d.outcome for d in out[:5]] == [Outcome.DRAINED] * 5  # 5% of 100
    assert {d.refusal for d in out[5:]} == {Refusal.CLUSTER_CAP}
    assert len(state.enforce.drained) == 5
    assert "6 of 100 nodes of the cluster" in out[5].detail and "cap of 5" in out[5].detail


@pytest.mark.parametrize("nodes,pct,count,cap", [(1000, 5.0, 20, 20), (100, 5.0, 20, 5),
                                                  (1000, 1.0, 20, 10), (10, 5.0, 20, 0)])  # fmt: skip
def test_cluster_cap_is_the_lower_of_count_and_percent(
    nodes: int, pct: float, count: int, cap: int
) -> None:
    settings = replace(ENFORCE, max_drained_nodes=count, max_drained_pct=pct)
    recs = [rec(f"gpu{i:03d}", f"r{i}", job_ids=[str(i)], partition=None) for i in range(1, 41)]
    out, _ = run(recs, settings, unpartitioned(nodes), step_ms=1)
    assert sum(d.outcome == Outcome.DRAINED for d in out) == cap


def test_cluster_cap_counts_our_drains_seen_in_slurm_and_the_size_override() -> None:
    # 2 nodes Slurm shows drained by peerwatch (not in the ledger) + 1 = 3 > 2% of 100
    view = ClusterView.of(
        [NodeFacts("gpu001", "IDLE", ("DRAIN",), "peerwatch: x"),
         NodeFacts("gpu002", "IDLE", ("DRAIN",), "peerwatch: y"), NodeFacts("gpu003", "IDLE")],
        cluster_size=100,
    )  # fmt: skip
    [d], _ = run([rec("gpu003", partition=None)], replace(ENFORCE, max_drained_pct=2), view)
    assert d.refusal == Refusal.CLUSTER_CAP and "3 of 100" in d.detail
    [d], _ = run([rec("gpu003", partition=None)], replace(ENFORCE, max_drained_pct=3), view)
    assert d.outcome == Outcome.DRAINED


def test_shadow_cluster_cap_uses_the_shadow_ledger() -> None:
    settings = DrainSettings(max_drained_nodes=1)
    recs = [rec(f"gpu{i:03d}", f"r{i}", job_ids=[str(i)], partition=None) for i in (1, 2)]
    out, _ = run(recs, settings, unpartitioned(100), step_ms=1)
    assert out[0].outcome == Outcome.SHADOWED
    assert out[1].refusal == Refusal.CLUSTER_CAP and out[1].detail.startswith("cluster_cap: shadow")
