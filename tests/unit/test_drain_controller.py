"""The drain controller loop and operator commands with fake Kafka clients and a fake Slurm:
commit ordering, replay after a kill, dead letters, node events, auto-resume, resume rules."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeClock

from peerwatch.errors import SlurmCommandError
from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.controller import (
    AuditPublisher,
    DrainController,
    Topics,
    offset_reset,
)
from peerwatch.exporters.drain.decide import NodeFacts
from peerwatch.exporters.drain.operations import describe, reset_breaker, resume_node
from peerwatch.exporters.drain.slurm_ops import drain_argv, resume_argv
from peerwatch.exporters.drain.state import StateStore
from peerwatch.schemas.codec import AvroCodec

NOW_MS = 1_795_000_000_000
TOPICS = Topics("recs", "events", "actions", "dead")
REC, ACT, EVT = (
    AvroCodec("DrainRecommendation"),
    AvroCodec("DrainAction"),
    AvroCodec("NodeStateEvent"),
)


@dataclass
class Msg:
    _topic: str
    _value: bytes | None
    _key: bytes | None = b"n1"
    _offset: int = 0

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> None:
        return None


@dataclass
class FakeConsumer:
    messages: list[Msg]
    log: list[str]
    commits: list[int] = field(default_factory=list)

    def subscribe(self, topics: list[str]) -> None:
        assert topics == ["recs", "events"]

    def poll(self, timeout: float) -> Msg | None:
        return self.messages.pop(0) if self.messages else None

    def commit(self, message: Msg, asynchronous: bool) -> None:
        assert asynchronous is False
        self.log.append(f"commit {message.offset()}")
        self.commits.append(message.offset())


@dataclass
class FakeProducer:
    log: list[str]
    fail: int = 0
    sent: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)
    _pending: list[Any] = field(default_factory=list)

    def produce(self, topic: str, value: bytes | None, key: bytes | None, **kw: Any) -> None:
        self._pending.append((topic, value, key, kw.get("on_delivery")))

    def flush(self, timeout: float) -> int:
        if self.fail:
            self.fail -= 1
            self.log.append("flush failed")
            return len(self._pending)
        for topic, value, key, cb in self._pending:
            self.sent.append((topic, value, key))
            if cb:
                cb(None, None)
        self.log.append(f"delivered {len(self._pending)}")
        self._pending.clear()
        return 0

    def actions(self) -> list[dict[str, Any]]:
        return [ACT.decode(v) for t, v, _ in self.sent if t == "actions" and v]


@dataclass
class FakeSlurm:
    nodes_: dict[str, NodeFacts]
    log: list[str]
    list_failures: int = 0
    drains: list[tuple[str, str]] = field(default_factory=list)

    def nodes(self) -> list[NodeFacts]:
        if self.list_failures:
            self.list_failures -= 1
            raise SlurmCommandError("slurmctld down")
        return list(self.nodes_.values())

    def drain(self, node: str, reason: str) -> None:
        self.log.append(f"drain {node}")
        self.drains.append((node, reason))
        self.nodes_[node] = replace(self.nodes_[node], flags=("DRAIN",), reason=reason)

    def resume(self, node: str) -> None:
        self.log.append(f"resume {node}")
        self.nodes_[node] = replace(self.nodes_[node], flags=(), reason=None)


def rec_msg(rid: str, offset: int = 0, node: str = "n1", **kw: Any) -> Msg:
    rec = {"recommendation_id": rid, "node": node, "ts_ms": NOW_MS, "action": "DRAIN",
           "reason": "sm clock low", "job_ids": ["42"], **kw}  # fmt: skip
    return Msg("recs", REC.encode(rec), node.encode(), offset)


class Rig:
    def __init__(self, tmp: Path, settings: DrainSettings | None = None, **slurm_kw: Any) -> None:
        self.log: list[str] = []
        self.settings = settings or DrainSettings(
            enforce=True, partition_sizes={"gpu": 100}, cluster_size=100
        )
        self.store = StateStore(tmp / "state.json")
        nodes = {f"n{i}": NodeFacts(f"n{i}", "IDLE", (), None, None, ("gpu",)) for i in range(1, 4)}
        self.slurm = FakeSlurm(nodes, self.log, **slurm_kw)
        self.producer = FakeProducer(self.log)
        self.clock = FakeClock(NOW_MS)

    def controller(self, messages: list[Msg]) -> tuple[DrainController, FakeConsumer]:
        consumer = FakeConsumer(messages, self.log)
        publisher = AuditPublisher(self.producer, TOPICS, 1.0)
        ctl = DrainController(consumer, publisher, self.slurm, self.store, self.settings, TOPICS,
                              clock=self.clock, sleep=lambda s: None)  # fmt: skip
        return ctl, consumer

    def run(self, messages: list[Msg]) -> FakeConsumer:
        """Run until every message is committed (or 100 stop checks, a guard against hangs)."""
        ctl, consumer = self.controller(messages)
        total, checks = len(messages), iter(range(100))
        ctl.run(stop=lambda: len(consumer.commits) == total or next(checks, None) is None)
        return consumer


def test_drain_then_deliver_then_commit(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.run([rec_msg("r1", 0), rec_msg("r2", 1, node="n2")])
    assert rig.log == ["drain n1", "delivered 1", "commit 0", "delivered 1", "commit 1"]
    actions = rig.producer.actions()
    assert [(a["decision"], a["refusal"]) for a in actions] == [
        ("DRAINED", None),
        ("REFUSED", "job_rate_limit"),
    ]
    assert actions[0]["slurm_reason"] == "peerwatch: sm clock low"
    assert actions[0]["action_id"] == "r1:DRAINED" and actions[0]["mode"] == "ENFORCE"
    assert rig.store.load().outbox == []


def test_shadow_mode_never_calls_slurm_update(tmp_path: Path) -> None:
    rig = Rig(tmp_path, DrainSettings(partition_sizes={"gpu": 100}, cluster_size=100))
    rig.run([rec_msg("r1")])
    assert rig.slurm.drains == []
    [a] = rig.producer.actions()
    assert a["decision"] == "SHADOWED" and a["mode"] == "SHADOW"


def test_kill_before_commit_then_restart_does_not_act_twice(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    ctl, consumer = rig.controller([rec_msg("r1")])
    msg = consumer.poll(0)
    assert ctl.handle(msg) is True  # state saved and audit delivered; "killed" before commit
    assert consumer.commits == []
    consumer2 = rig.run([rec_msg("r1")])  # the uncommitted record is replayed
    assert rig.slurm.drains == [("n1", "peerwatch: sm clock low")]
    assert [a["decision"] for a in rig.producer.actions()] == ["DRAINED", "DUPLICATE"]
    assert consumer2.commits == [0]


def test_kill_between_scontrol_and_save_is_caught_by_the_slurm_reason(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.slurm.drain("n1", "peerwatch: sm clock low")  # drained, then the process died
    rig.run([rec_msg("r1")])
    assert len(rig.slurm.drains) == 1
    [a] = rig.producer.actions()
    assert a["decision"] == "DUPLICATE"
    assert "n1" in rig.store.load().enforce.drained


def test_undelivered_audit_is_not_committed_and_is_redelivered(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.producer.fail = 1
    rig.run([rec_msg("r1")])
    assert rig.log == ["drain n1", "flush failed", "delivered 1", "commit 0"]
    rig2 = Rig(tmp_path)
    rig2.producer.fail = 10
    ctl, consumer = rig2.controller([rec_msg("r2", 1, node="n2", job_ids=["7"])])
    assert ctl.handle(consumer.poll(0), stop=lambda: True) is False  # stopping: no commit
    assert len(rig2.store.load().outbox) == 1  # kept for the next start


def test_slurm_outage_retries_instead_of_deciding(tmp_path: Path) -> None:
    rig = Rig(tmp_path, list_failures=2)
    rig.run([rec_msg("r1")])
    assert [a["decision"] for a in rig.producer.actions()] == ["DRAINED"]


def test_scontrol_failure_is_refused_slurm_error(tmp_path: Path) -> None:
    rig = Rig(tmp_path)

    def broken(node: str, reason: str) -> None:
        raise SlurmCommandError("scontrol: error: Invalid node state")

    rig.slurm.drain = broken  # type: ignore[method-assign]
    rig.run([rec_msg("r1")])
    [a] = rig.producer.actions()
    assert a["refusal"] == "slurm_error" and "Invalid node state" in a["detail"]
    assert rig.store.load().enforce.drained == {}


def test_undecodable_record_is_audited_and_dead_lettered(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    consumer = rig.run([Msg("recs", b"\xc3\x01garbage", b"n1;$(x)", 5)])
    assert consumer.commits == [5]
    [a] = rig.producer.actions()
    assert a["refusal"] == "invalid_input" and a["node"] == "n1??(x)"
    assert a["action_id"] == "invalid:recs/0/5:REFUSED"
    assert [t for t, _, _ in rig.producer.sent] == ["dead", "actions"]


def event(node: str, ts_ms: int, flags: list[str], reason: str | None) -> Msg:
    ev = {"event_id": f"e{ts_ms}", "node": node, "ts_ms": ts_ms, "state": "IDLE", "flags": flags,
          "reason": reason, "reason_user": "alice", "partitions": ["gpu"], "source": "WATCHER"}  # fmt: skip
    return Msg("events", EVT.encode(ev), node.encode(), 9)


def test_operator_resume_seen_in_node_events_starts_the_cooldown(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.run([rec_msg("r1")])
    rig.clock.ms += 10_000
    rig.run([event("n1", NOW_MS + 5_000, [], None)])
    assert rig.store.load().operator_resumes == {"n1": NOW_MS + 5_000}
    rig.slurm.resume("n1")
    rig.run([rec_msg("r2", 2, job_ids=["43"], ts_ms=rig.clock.ms)])
    assert rig.producer.actions()[-1]["refusal"] == "operator_cooldown"
    # hard evidence taken after the resume skips the cooldown
    rig.run([rec_msg("r3", 3, job_ids=["44"], hard=True, ts_ms=rig.clock.ms)])
    assert rig.producer.actions()[-1]["decision"] == "DRAINED"


def test_operator_resume_seen_in_slurm_starts_the_cooldown(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.run([rec_msg("r1")])
    rig.slurm.resume("n1")  # by hand, not through peerwatch
    rig.clock.ms += 60_000
    # seen at this decision: the evidence (NOW_MS) predates the resume, hard or not
    rig.run([rec_msg("r2", 1, job_ids=["43"], hard=True)])
    last = rig.producer.actions()[-1]
    assert last["refusal"] == "evidence_before_resume" and "resumed the node" in last["detail"]
    assert rig.slurm.drains == [("n1", "peerwatch: sm clock low")]
    rig.clock.ms += 1000
    rig.run([rec_msg("r3", 2, job_ids=["44"], ts_ms=rig.clock.ms)])
    assert rig.producer.actions()[-1]["refusal"] == "operator_cooldown"


def test_auto_resume_on_expiry(tmp_path: Path) -> None:
    settings = DrainSettings(
        enforce=True, partition_sizes={"gpu": 100}, cluster_size=100, auto_resume_on_expiry=True
    )
    rig = Rig(tmp_path, settings)
    rig.run([rec_msg("r1", expires_ms=NOW_MS + 1000)])
    ctl, _ = rig.controller([])
    assert ctl.resume_expired() == 0  # not expired yet
    rig.clock.ms += 1000
    assert ctl.resume_expired() == 1
    ctl.flush_outbox()
    assert rig.log[-2:] == ["resume n1", "delivered 1"]
    last = rig.producer.actions()[-1]
    assert last["decision"] == "RESUMED" and last["recommendation_id"] == "r1"
    assert rig.store.load().operator_resumes == {}  # our own resume: no cooldown


def test_resume_only_nodes_with_our_prefix(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    rig.slurm.nodes_["n2"] = replace(rig.slurm.nodes_["n2"], flags=("DRAIN",), reason="hw: dimm")
    assert resume_node(rig.store, rig.slurm, "n2", NOW_MS)["refusal"] == "foreign_reason"
    assert (
        resume_node(rig.store, rig.slurm, "n3", NOW_MS)["refusal"] == "foreign_reason"
    )  # not drained
    assert resume_node(rig.store, rig.slurm, "n9", NOW_MS)["refusal"] == "unknown_node"
    assert resume_node(rig.store, rig.slurm, "n1;reboot", NOW_MS)["refusal"] == "invalid_input"
    rig.run([rec_msg("r1")])
    action = resume_node(rig.store, rig.slurm, "n1", NOW_MS + 1)
    assert action["decision"] == "RESUMED" and "r1" in action["detail"]
    assert "resume n2" not in rig.log and rig.log.count("resume n1") == 1
    # refusals were queued and delivered by the controller's start; the resume is queued
    assert [a["refusal"] for a in rig.producer.actions()[:4]] == [
        "foreign_reason", "foreign_reason", "unknown_node", "invalid_input"]  # fmt: skip
    assert [a["decision"] for a in rig.store.load().outbox] == ["RESUMED"]


def test_reset_breaker_and_describe(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    with store.transaction() as state:
        state.open_breaker("6 of 100", NOW_MS)
    assert describe(store, NOW_MS)["breaker"]["open"] is True
    assert "6 of 100" in reset_breaker(store, NOW_MS + 1)
    assert reset_breaker(store, NOW_MS + 2) == "breaker was already closed"


def test_argument_vectors_and_their_guard() -> None:
    assert drain_argv("scontrol", "n1", "peerwatch: x y") == [
        "scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=peerwatch: x y"]  # fmt: skip
    assert resume_argv("/usr/bin/scontrol", "n1")[-1] == "State=RESUME"
    for node, reason in [("n1 n2", "x"), ("n[1-2]", "x"), ("n1", "a\nb"), ("n1", "$(x)")]:
        with pytest.raises(ValueError):
            drain_argv("scontrol", node, reason)


def test_stats_count_outcomes_dead_letters_and_the_ledger(tmp_path: Path) -> None:
    """The numbers the controller exports about itself (telemetry) follow what it did."""
    rig = Rig(tmp_path)
    ctl, consumer = rig.controller([rec_msg("r1", 0), rec_msg("r2", 1, node="n2"),
                                    rec_msg("r1", 2), Msg("recs", b"\xc3\x01", b"n3", 3)])  # fmt: skip
    total, checks = 4, iter(range(100))
    ctl.run(stop=lambda: len(consumer.commits) == total or next(checks, None) is None)
    s = ctl.stats
    assert (s.recommendations, s.drained, s.refused, s.duplicate) == (3, 1, 1, 1)
    assert s.deadletter == 1 and s.drained_nodes == 1 and s.breaker_open is False
    assert s.outbox_depth == 0 and s.decision_time_s > 0


def test_a_controller_without_state_starts_its_group_at_the_latest_offsets(tmp_path: Path) -> None:
    # A new group (or expired offsets) with a fresh state file would re-decide the topic's
    # 30 days of recommendations against today's cluster: start at the end instead.
    store = StateStore(tmp_path / "state.json")
    assert offset_reset(store) == "latest"
    with store.transaction():
        pass
    assert offset_reset(store) == "earliest"  # decided ids and freshness bounds guard the backlog


def test_refusals_for_old_evidence_are_audited_with_their_reason(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    old_ms = NOW_MS - 6 * 3600_000
    rig.run([rec_msg("expired", 0, ts_ms=old_ms, expires_ms=NOW_MS - 5 * 3600_000),
             rec_msg("stale", 1, node="n2", ts_ms=NOW_MS - 301_000, job_ids=["7"]),
             rec_msg("ahead", 2, node="n3", ts_ms=NOW_MS + 3600_000, job_ids=["8"])])  # fmt: skip
    assert rig.slurm.drains == []
    got = {a["recommendation_id"]: a for a in rig.producer.actions()}
    assert [(got[i]["decision"], got[i]["refusal"]) for i in ("expired", "stale", "ahead")] == [
        ("REFUSED", "expired"), ("REFUSED", "stale"), ("REFUSED", "invalid_input")]  # fmt: skip
    assert "expired at" in got["expired"]["detail"] and "301 s old" in got["stale"]["detail"]
