"""The soak suite: its scenarios (healthy fleets, every confounder) and the alert census."""

from __future__ import annotations

import pytest

from peerwatch.producers.sim import Fleet, parse_scenario
from peerwatch.producers.sim.nic import NIC_CONFOUNDERS
from peerwatch.producers.sim.scenario import CONFOUNDER_KINDS
from peerwatch.streams.tools.evaluation import score, soak_targets
from peerwatch.streams.tools.soak import AlertCensus, alert_kind, census, soak, soak_suite


def rec(action: str = "ALERT", gpus: list[int] | None = None, **kw: object) -> dict[str, object]:
    return {"action": action, "node": "gpu00001", "ts_ms": 60_000, "reason": "suspect",
            "gpu_indices": [3] if gpus is None else gpus, "cause": "UNKNOWN", **kw}  # fmt: skip


def test_alert_kinds() -> None:
    assert alert_kind(rec("DRAIN")) == "drain"
    assert alert_kind(rec(gpus=[])) == "group"
    assert alert_kind(rec(reason="job-wide: 2 of 2 GPUs slow")) == "group"
    assert alert_kind(rec(cause="HOST")) == "host"
    assert alert_kind(rec(cause="THERMAL")) == "gpu"


def test_census_counts_per_100_node_days_and_sets_explained_alerts_apart() -> None:
    recs = [rec(), rec(node="gpu00002"), rec(cause="HOST"), rec(gpus=[]), rec("DRAIN")]
    c = census(recs, node_s=2 * 86_400, explained=lambda r: r["node"] == "gpu00002")
    assert (c.drains, c.gpu_alerts, c.host_alerts, c.group_alerts, c.explained_alerts) == (
        1, 1, 1, 1, 1,
    )  # fmt: skip
    assert c.node_days == 2.0
    assert c.per_100_node_days(c.gpu_alerts) == 50.0
    total = AlertCensus()
    total.add(c)
    total.add(c)
    assert total.to_dict()["gpu_alerts_per_100_node_days"] == 50.0
    assert AlertCensus().per_100_node_days(3) is None


def test_soak_targets() -> None:
    quiet = AlertCensus(node_s=200 * 86_400, gpu_alerts=2, host_alerts=9)
    assert [t.passed for t in soak_targets(quiet)] == [True, True]
    noisy = AlertCensus(node_s=100 * 86_400, gpu_alerts=2, drains=1)
    assert [t.passed for t in soak_targets(noisy)] == [False, False]


def test_score_fills_the_census_with_fault_labels_explaining_alerts() -> None:
    label = {"kind": "fault", "name": "thermal_throttle", "node": "gpu00001", "gpu_index": 3,
             "job_id": "1", "start_ms": 0, "end_ms": 120_000, "expect": "straggler", "params": {}}  # fmt: skip
    recs = [(rec(), 60_000), (rec(node="gpu00009"), 60_000)]
    s = score([label], [], recs, node_s=86_400)
    assert (s.alerts.gpu_alerts, s.alerts.explained_alerts) == (1, 1)


@pytest.mark.parametrize("scenario", soak_suite(), ids=lambda s: s.name)
def test_soak_scenarios_are_healthy_fleets_with_every_confounder(scenario: object) -> None:
    fleet = Fleet(parse_scenario(scenario.doc))  # type: ignore[attr-defined]
    labels = fleet.labels()
    assert labels and all(lb["kind"] == "confounder" and lb["expect"] == "nothing" for lb in labels)
    # checkpoints, evaluation phases and requeues come from the jobs and the workload; the
    # network confounders need NIC ports (the "network" suite has them)
    injected = set(CONFOUNDER_KINDS) - {"checkpoint", "eval_pause", "requeue"} - NIC_CONFOUNDERS
    assert {lb["name"] for lb in labels} == injected
    spec = parse_scenario(scenario.doc)  # type: ignore[attr-defined]
    assert spec.workload.requeue_prob > 0 and spec.workload.checkpoint_s > 0
    assert any(j.checkpoint_s for j in spec.jobs) and any(j.eval_s for j in spec.jobs)
    assert fleet.spec.nodes * fleet.spec.duration_ms / 86_400_000 >= 16.0  # node-days per seed


def test_a_soak_needs_room_for_its_pinned_jobs() -> None:
    with pytest.raises(ValueError, match="32 nodes"):
        soak(1, nodes=16)
