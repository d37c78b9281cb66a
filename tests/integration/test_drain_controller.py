"""The drain controller against the real one-node Slurm cluster and the real Kafka broker.

The test cluster has one node in partition ``gpu``, so the percentage limits are exercised
through the ``partition_sizes`` setting: the partition is declared as 100 nodes, which makes
2%/h = 2 drains per hour and lets ``breaker_pct`` pick the threshold (1.0% of 100 = 1 node:
one drain is at the threshold and allowed, 0.5% = the first drain would exceed it). The
arithmetic for real multi-node partitions is covered by tests/unit/test_drain_decide.py.

Other suites drain and resume the same node concurrently: every test leaves the node resumed
if it carries a reason this file set (``peerwatch:`` or ``pwtest-operator:``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.controller import AuditPublisher, DrainController, Topics
from peerwatch.exporters.drain.decide import NodeFacts
from peerwatch.exporters.drain.operations import reset_breaker, resume_node
from peerwatch.exporters.drain.slurm_ops import ScontrolSlurm
from peerwatch.exporters.drain.state import ControllerState, StateStore
from peerwatch.kafka_config import consumer_config, producer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import ACTIONS, DEADLETTER, NODE_EVENTS, RECOMMENDATIONS, catalogue
from tests.integration.slurm_fixture import SlurmCluster

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
REC, ACT = AvroCodec("DrainRecommendation"), AvroCodec("DrainAction")
OPERATOR_REASON = "pwtest-operator: bad dimm, do not touch"
USABLE = ["idle", "mixed", "allocated", "completing"]


class CountingSlurm(ScontrolSlurm):
    """The real Slurm, counting drains (to prove nothing is done twice)."""

    def __init__(self, bin_dir: Path) -> None:
        super().__init__(bin_dir)
        self.drains: list[tuple[str, str]] = []

    def drain(self, node: str, reason: str) -> None:
        self.drains.append((node, reason))
        super().drain(node, reason)


@dataclass
class Env:
    kafka: KafkaSettings
    cluster: SlurmCluster
    topics: Topics
    prefix: str
    state_file: Path

    def settings(self, **kw: Any) -> DrainSettings:
        base: dict[str, Any] = {
            "enforce": True, "partition_sizes": {"gpu": 100}, "cluster_size": 100,
            "partition_rate_pct": 100.0,
            "breaker_pct": 100.0, "operator_cooldown_s": 0, "group_id": self.prefix + "drain",
            "poll_timeout_s": 0.5, "state_file": str(self.state_file),
        }  # fmt: skip
        base.update(kw)
        return DrainSettings(**base)

    def send(self, *recs: dict[str, Any]) -> None:
        producer = Producer(producer_config(self.kafka))
        for rec in recs:
            producer.produce(self.topics.recommendations, REC.encode(rec), rec["node"].encode())
        assert producer.flush(30) == 0

    def run(self, settings: DrainSettings, commits: int, slurm: ScontrolSlurm | None = None,
            timeout_s: float = 60.0) -> ScontrolSlurm:  # fmt: skip
        """Run a controller in this process until it has committed ``commits`` offsets."""
        slurm = slurm or ScontrolSlurm(self.cluster.bin_dir)
        consumer = Consumer(consumer_config(self.kafka, settings.group_id))
        done: list[Any] = []
        real_commit = consumer.commit

        class Counting:
            def __getattr__(self, name: str) -> Any:
                return getattr(consumer, name)

            def commit(self, **kw: Any) -> Any:
                done.append(real_commit(**kw))

        publisher = AuditPublisher(Producer(producer_config(self.kafka)), self.topics, 30.0)
        ctl = DrainController(Counting(), publisher, slurm, StateStore(self.state_file), settings,
                              self.topics)  # fmt: skip
        deadline = time.monotonic() + timeout_s
        try:
            ctl.run(stop=lambda: len(done) >= commits or time.monotonic() > deadline)
        finally:
            consumer.close()
        assert len(done) >= commits, (
            f"controller committed {len(done)} of {commits} in {timeout_s}s"
        )
        return slurm

    def actions(
        self, want: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 60.0
    ) -> list[dict[str, Any]]:
        """Read the audit topic from the start until ``want(actions)`` holds (or fail)."""
        consumer = Consumer(consumer_config(self.kafka, f"{self.prefix}audit-{time.time_ns()}"))
        consumer.subscribe([self.topics.actions])
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        try:
            while not want(got) and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.append(ACT.decode(msg.value()))
        finally:
            consumer.close()
        assert want(got), f"audit never satisfied the test: {got}"
        return got

    def node(self) -> NodeFacts:
        return {n.name: n for n in ScontrolSlurm(self.cluster.bin_dir).nodes()}[self.cluster.node]

    def sinfo_reasons(self) -> str:
        return self.cluster.cmd("sinfo", "-R", "-h", "-N", "-o", "%n|%E")


def rec(env: Env, rid: str, **kw: Any) -> dict[str, Any]:
    base = {"recommendation_id": f"{env.prefix}{rid}", "node": env.cluster.node,
            "ts_ms": time.time_ns() // 1_000_000, "action": "DRAIN", "severity": "WARNING",
            "hard": False, "reason": f"sm clock 12% below peers ({rid})",
            "job_ids": [f"{abs(hash(rid)) % 10**6}"], "partition": "gpu"}  # fmt: skip
    base.update(kw)
    return base


def _leave_node_idle(cluster: SlurmCluster) -> None:
    facts = {n.name: n for n in ScontrolSlurm(cluster.bin_dir).nodes()}[cluster.node]
    if facts.drained and (facts.reason or "").startswith(("peerwatch:", "pwtest-operator:")):
        cluster.cmd("scontrol", "update", f"NodeName={cluster.node}", "State=RESUME")
        cluster.wait_for_node_state(USABLE)


@pytest.fixture
def env(kafka_settings: KafkaSettings, slurm_cluster: SlurmCluster, topic_prefix: str,
        tmp_path: Path) -> Iterator[Env]:  # fmt: skip
    names = {RECOMMENDATIONS.name, NODE_EVENTS.name, ACTIONS.name, DEADLETTER.name}
    ensure_topics(
        kafka_settings, [s for s in catalogue(topic_prefix) if s.name[len(topic_prefix) :] in names]
    )
    topics = Topics(
        *(topic_prefix + t.name for t in (RECOMMENDATIONS, NODE_EVENTS, ACTIONS, DEADLETTER))
    )
    _leave_node_idle(slurm_cluster)
    slurm_cluster.wait_for_node_state(USABLE)
    try:
        yield Env(
            kafka_settings, slurm_cluster, topics, topic_prefix, tmp_path / "drain-state.json"
        )
    finally:
        _leave_node_idle(slurm_cluster)


def test_recommendation_drains_and_duplicate_does_not_drain_again(env: Env) -> None:
    r1 = rec(env, "r1")
    env.send(r1, r1)  # delivered twice, as after a producer retry
    slurm = env.run(env.settings(), commits=2, slurm=CountingSlurm(env.cluster.bin_dir))
    want = f"{env.cluster.node}|peerwatch: sm clock 12% below peers (r1)"
    assert want in env.sinfo_reasons().splitlines()
    assert env.node().drained
    assert isinstance(slurm, CountingSlurm) and len(slurm.drains) == 1
    actions = env.actions(lambda a: len(a) >= 2)
    assert [a["decision"] for a in actions] == ["DRAINED", "DUPLICATE"]
    assert actions[0]["slurm_reason"] == "peerwatch: sm clock 12% below peers (r1)"
    assert actions[0]["partition"] == "gpu" and actions[0]["mode"] == "ENFORCE"
    # A new recommendation for the drained node is not a second drain either.
    env.send(rec(env, "r2"))
    env.run(env.settings(), commits=1, slurm=slurm)
    assert len(slurm.drains) == 1
    assert env.actions(lambda a: len(a) >= 3)[2]["decision"] == "DUPLICATE"


def test_node_drained_by_an_operator_is_left_alone(env: Env) -> None:
    node = env.cluster.node
    env.cluster.cmd(
        "scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={OPERATOR_REASON}"
    )
    env.send(rec(env, "op"))
    env.run(env.settings(), commits=1)
    [action] = env.actions(lambda a: len(a) >= 1)
    assert action["decision"] == "REFUSED" and action["refusal"] == "foreign_reason"
    assert env.node().reason == OPERATOR_REASON
    # ... and peerwatch refuses to resume it.
    refused = resume_node(StateStore(env.state_file), ScontrolSlurm(env.cluster.bin_dir), node, 1)
    assert refused["refusal"] == "foreign_reason" and env.node().drained


def test_shadow_mode_changes_nothing(env: Env) -> None:
    before = env.node()
    env.send(rec(env, "sh"))
    env.run(env.settings(enforce=False), commits=1)
    [action] = env.actions(lambda a: len(a) >= 1)
    assert action["decision"] == "SHADOWED" and action["mode"] == "SHADOW"
    assert action["slurm_reason"] == "peerwatch: sm clock 12% below peers (sh)"
    after = env.node()
    assert not after.drained and after.reason == before.reason


def test_hostile_input_is_refused_and_nothing_reaches_slurm(env: Env, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    hostile = [f"{env.cluster.node}; touch {canary}", f"$(touch {canary})", f"`touch {canary}`",
               f"{env.cluster.node}\nState=DOWN", "x" * 5000, "nosuchnode42"]  # fmt: skip
    env.send(*(rec(env, f"h{i}", node=n) for i, n in enumerate(hostile)))
    env.send(rec(env, "reason", reason=f'"; touch {canary}; $(reboot) `id`\nState=DOWN'))
    env.run(env.settings(), commits=len(hostile) + 1)
    actions = env.actions(lambda a: len(a) >= len(hostile) + 1)
    # keys differ, so partitions (and order) differ: match by recommendation id
    by_id = {a["recommendation_id"]: a for a in actions}
    assert [by_id[f"{env.prefix}h{i}"]["refusal"] for i in range(len(hostile))] == [
        "invalid_input"] * 5 + ["unknown_node"]  # fmt: skip
    assert all(by_id[f"{env.prefix}h{i}"]["decision"] == "REFUSED" for i in range(len(hostile)))
    last = by_id[f"{env.prefix}reason"]
    assert last["decision"] == "DRAINED"
    assert last["slurm_reason"] == f"peerwatch: touch {canary} (reboot) id State=DOWN"
    assert env.node().reason == last["slurm_reason"] and env.node().state != "DOWN"
    assert not canary.exists()


def test_breaker_opens_at_the_threshold_blocks_and_survives_restart(env: Env) -> None:
    node = env.cluster.node
    store = StateStore(env.state_file)
    # 1 of 100 nodes = 1%: at the threshold, allowed.
    env.send(rec(env, "b1"))
    env.run(env.settings(breaker_pct=1.0), commits=1)
    assert env.node().drained
    assert (
        resume_node(store, ScontrolSlurm(env.cluster.bin_dir), node, time.time_ns() // 10**6)[
            "decision"
        ]
        == "RESUMED"
    )
    env.cluster.wait_for_node_state(USABLE)
    # At 0.5% the same drain would exceed it: refused and the breaker latches open.
    env.send(rec(env, "b2"))
    env.run(env.settings(breaker_pct=0.5), commits=1)
    assert store.load().breaker.open and not env.node().drained
    # A restarted controller whose threshold would allow the drain still refuses: it stays open.
    env.send(rec(env, "b3"))
    env.run(env.settings(breaker_pct=50.0), commits=1)
    assert not env.node().drained
    assert "was open" in reset_breaker(store, time.time_ns() // 10**6)
    env.send(rec(env, "b4"))
    env.run(env.settings(breaker_pct=50.0), commits=1)
    assert env.node().drained
    actions = env.actions(lambda a: len(a) >= 5)
    assert [(a["decision"], a["refusal"]) for a in actions] == [
        ("DRAINED", None), ("RESUMED", None), ("REFUSED", "breaker_open"),
        ("REFUSED", "breaker_open"), ("DRAINED", None),
    ]  # fmt: skip
    assert "circuit breaker opens" in actions[2]["detail"]
    assert "circuit breaker open since" in actions[3]["detail"]


def _cli(env: Env, *args: str, **popen: Any) -> subprocess.Popen[str]:
    environ = {**os.environ, "PEERWATCH_KAFKA_BOOTSTRAP": env.kafka.bootstrap_servers,
               "PEERWATCH_TOPIC_PREFIX": env.prefix, "PEERWATCH_DRAIN_GROUP_ID": env.prefix + "drain",
               "PEERWATCH_DRAIN_PARTITION_SIZES": "gpu=100", "PEERWATCH_DRAIN_CLUSTER_SIZE": "100",
               "PEERWATCH_DRAIN_PARTITION_RATE_PCT": "100",
               "PEERWATCH_DRAIN_BREAKER_PCT": "100", "PEERWATCH_DRAIN_OPERATOR_COOLDOWN_S": "0",
               "PEERWATCH_DRAIN_POLL_TIMEOUT_S": "0.2"}  # fmt: skip
    argv = [sys.executable, "-m", "peerwatch.cli", "drain-controller", *args,
            "--state-file", str(env.state_file), "--slurm-bin", str(env.cluster.bin_dir)]  # fmt: skip
    return subprocess.Popen(argv, cwd=REPO, env=environ, text=True, **popen)


def _cli_until(env: Env, log_path: Path, want: Callable[[list[dict[str, Any]]], bool],
               *args: str) -> list[dict[str, Any]]:  # fmt: skip
    """Run ``drain-controller run ARGS`` until the audit satisfies ``want``, then stop it with
    SIGTERM (it must exit 0); returns the audit read."""
    with log_path.open("a") as log:
        proc = _cli(env, "run", *args, stderr=log)
        try:
            actions = env.actions(want)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    assert proc.returncode == 0, log_path.read_text()[-2000:]
    return actions


def test_killed_mid_stream_and_restarted_does_not_act_twice(env: Env, tmp_path: Path) -> None:
    ids = [f"k{i}" for i in range(8)]
    # A controller that has state: its new group starts at the earliest offsets (without state
    # it would start at the latest, test_without_state_the_group_starts_at_the_latest_offsets).
    StateStore(env.state_file).save(ControllerState())
    env.send(*(rec(env, i) for i in ids))
    log = (tmp_path / "controller.log").open("w")
    proc = _cli(env, "run", "--enforce", stderr=log)
    try:
        first = env.actions(lambda a: len(a) >= 1)
    finally:
        proc.send_signal(signal.SIGKILL)  # no chance to commit or clean up
        proc.wait(30)
        log.close()
    assert first[0]["decision"] == "DRAINED"
    # The operator (through peerwatch) resumes the node: a replay that acted again would re-drain it.
    resumed = _cli(env, "resume", env.cluster.node, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = resumed.communicate(timeout=60)
    assert resumed.returncode == 0, err
    assert out.startswith("RESUMED")
    env.cluster.wait_for_node_state(USABLE)
    env.send(rec(env, ids[0]))  # and one more duplicate of the drained recommendation
    decided = lambda a: {x["recommendation_id"] for x in a} >= {env.prefix + i for i in ids} and sum(  # noqa: E731
        1 for x in a if x["recommendation_id"] == env.prefix + ids[0]) >= 2  # fmt: skip
    actions = _cli_until(env, tmp_path / "controller.log", decided, "--enforce")
    # One real decision per recommendation across both runs; every replay is a DUPLICATE. In
    # particular k0, replayed after the resume, did not drain the node again. (A recommendation
    # the killed run never reached is decided, once, by the restarted one: that one may drain.)
    for i in ids:
        mine = [a["decision"] for a in actions if a["recommendation_id"] == env.prefix + i]
        assert len([d for d in mine if d != "DUPLICATE"]) <= 1, (i, mine)
    k0 = [a["decision"] for a in actions if a["recommendation_id"] == env.prefix + ids[0]]
    assert k0[0] == "DRAINED" and set(k0[1:]) == {"DUPLICATE"}
    drained = [a["recommendation_id"] for a in actions if a["decision"] == "DRAINED"]
    assert len(drained) == len(set(drained)) <= 2, drained


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_expired_and_stale_recommendations_are_refused_and_audited(env: Env) -> None:
    """Issue 39: the backlog after an outage (old evidence, passed expiry) never drains."""
    hour = 3_600_000
    env.send(
        rec(env, "expired", ts_ms=now_ms() - 6 * hour, expires_ms=now_ms() - 5 * hour),
        rec(env, "stale", ts_ms=now_ms() - 10 * 60_000, expires_ms=now_ms() + hour),
        rec(env, "stale-hard", ts_ms=now_ms() - 2 * hour, hard=True, expires_ms=now_ms() + hour),
    )
    slurm = env.run(env.settings(), commits=3, slurm=CountingSlurm(env.cluster.bin_dir))
    assert isinstance(slurm, CountingSlurm) and slurm.drains == []
    assert not env.node().drained
    by_id = {a["recommendation_id"]: a for a in env.actions(lambda a: len(a) >= 3)}
    got = [(by_id[env.prefix + i]["decision"], by_id[env.prefix + i]["refusal"])
           for i in ("expired", "stale", "stale-hard")]  # fmt: skip
    assert got == [("REFUSED", "expired"), ("REFUSED", "stale"), ("REFUSED", "stale")]
    assert "expired at" in by_id[env.prefix + "expired"]["detail"]
    assert "hard freshness bound of 3600 s" in by_id[env.prefix + "stale-hard"]["detail"]


def test_hard_evidence_taken_before_an_operator_resume_never_drains(env: Env) -> None:
    node = env.cluster.node
    env.send(rec(env, "first"))
    env.run(env.settings(), commits=1)
    assert env.node().ours
    before_resume = now_ms()
    env.cluster.cmd("scontrol", "update", f"NodeName={node}", "State=RESUME")  # by hand
    env.cluster.wait_for_node_state(USABLE)
    # A late hard recommendation whose evidence predates the resume (hard skips the cooldown).
    env.send(rec(env, "late", hard=True, ts_ms=before_resume - 1, job_ids=["77"]))
    env.run(env.settings(operator_cooldown_s=0), commits=1)
    assert not env.node().drained
    actions = env.actions(lambda a: len(a) >= 2)
    assert [(a["decision"], a["refusal"]) for a in actions] == [
        ("DRAINED", None), ("REFUSED", "evidence_before_resume")]  # fmt: skip
    assert "an operator resumed the node after it" in actions[1]["detail"]
    # Evidence taken after the resume (the controller saw it at the last decision) drains.
    time.sleep(0.01)  # the next evidence time is past the resume the controller recorded
    env.send(rec(env, "after", hard=True, ts_ms=now_ms(), job_ids=["78"]))
    env.run(env.settings(operator_cooldown_s=0), commits=1)
    assert env.node().ours
    assert env.actions(lambda a: len(a) >= 3)[2]["decision"] == "DRAINED"


def test_cluster_cap_refuses_and_is_audited(env: Env) -> None:
    # 1% of 100 nodes = 1, but at most 0 by count: the lower applies.
    env.send(rec(env, "capped"))
    env.run(env.settings(max_drained_pct=1.0, max_drained_nodes=0), commits=1)
    assert not env.node().drained
    env.send(rec(env, "allowed", job_ids=["99"]))
    env.run(env.settings(max_drained_pct=1.0, max_drained_nodes=5), commits=1)
    assert env.node().ours
    actions = env.actions(lambda a: len(a) >= 2)
    assert [(a["decision"], a["refusal"]) for a in actions] == [
        ("REFUSED", "cluster_cap"), ("DRAINED", None)]  # fmt: skip
    assert "above the cap of 0 (the lower of 0 nodes and 1.0%)" in actions[0]["detail"]


def test_without_state_the_group_starts_at_the_latest_offsets(env: Env, tmp_path: Path) -> None:
    """A fresh state file and a new group: the topic's backlog is not decided at all."""
    assert not env.state_file.exists()
    env.send(rec(env, "backlog"))
    sent: list[str] = []

    def decided(actions: list[dict[str, Any]]) -> bool:
        # Keep publishing until the controller, assigned by now, decides one of them.
        if not actions:
            sent.append(f"new{len(sent)}")
            env.send(rec(env, sent[-1]))
        return bool(actions)

    # shadow mode: Slurm is not changed
    actions = _cli_until(env, tmp_path / "controller.log", decided)
    assert actions[0]["recommendation_id"] in {env.prefix + s for s in sent}
    assert env.prefix + "backlog" not in {a["recommendation_id"] for a in actions}
