"""The drain controller loop: recommendations and node events in, Slurm drains and audit out.

Per recommendation, under the state-file lock: read Slurm's nodes, fold them into the state
(operator resumes), decide, drain when enforcing, record the decision and its DrainAction in the
state file's outbox, save. Then the outbox is delivered to ``peerwatch.drain.actions`` and only
then is the offset committed. A kill at any point therefore never acts twice: a replayed record
finds its id among the decided ones (DUPLICATE) or, if the kill came between ``scontrol`` and the
save, finds the node already carrying a peerwatch reason (DUPLICATE, adopted into the ledger).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from peerwatch.clock import SYSTEM_CLOCK, Clock
from peerwatch.errors import CodecError, ServiceError, SlurmCommandError
from peerwatch.exporters.drain.audit import action_record, invalid_record, resume_record
from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.decide import (
    ClusterView,
    Decision,
    NodeFacts,
    Outcome,
    Refusal,
    apply_decision,
    decide,
    expired_drains,
    forget_resumed,
    observe_node,
)
from peerwatch.exporters.drain.provenance import refusal_of, unverified_decision
from peerwatch.exporters.drain.slurm_ops import SlurmOps
from peerwatch.exporters.drain.state import ControllerState, StateStore
from peerwatch.io.deadletter import dead_letter_headers, produce_dead_letter
from peerwatch.schemas.codec import AvroCodec
from peerwatch.signing import Verifier

log = logging.getLogger(__name__)

#: Seconds between retries while Slurm's node list or Kafka delivery is unavailable.
RETRY_S = 2.0
#: Seconds between checks for expired recommendations (auto-resume).
EXPIRY_CHECK_S = 30.0


def offset_reset(store: StateStore) -> str:
    """``auto.offset.reset`` for the controller's consumer group: where it starts when the group
    has no committed offsets (a new group, or offsets Kafka expired).

    Without a state file, "latest": nothing was decided yet, and the topic's backlog (30 days)
    would be decided against today's cluster. With one, "earliest": the backlog since the last
    commit is decided, and the decided ids and the freshness bounds keep it from acting twice or
    on old evidence.
    """
    return "earliest" if store.path.exists() else "latest"


@dataclass
class DrainStats:
    """What the controller did (peerwatch's own telemetry reads it): recommendations by outcome,
    node events, records dead-lettered, failed audit deliveries, decision time; and, as of the
    latest decision, nodes drained by peerwatch and whether the breaker is open."""

    recommendations: int = 0
    drained: int = 0
    shadowed: int = 0
    refused: int = 0
    duplicate: int = 0
    resumed: int = 0
    deadletter: int = 0
    node_events: int = 0
    audit_failures: int = 0
    unverified: int = 0
    decision_time_s: float = 0.0
    outbox_depth: int | None = None
    drained_nodes: int | None = None
    breaker_open: bool | None = None

    def outcome(self, outcome: str) -> None:
        name = outcome.lower()
        if name in ("drained", "shadowed", "refused", "duplicate", "resumed"):
            setattr(self, name, getattr(self, name) + 1)

    def observe(self, state: ControllerState, enforce: bool) -> None:
        self.outbox_depth = len(state.outbox)
        self.drained_nodes = len(state.ledger(enforce).drained)
        self.breaker_open = state.breaker.open


@dataclass(frozen=True)
class Topics:
    recommendations: str
    node_events: str
    actions: str
    deadletter: str


class AuditPublisher:
    """Delivers DrainAction records (and dead letters) with a confluent-kafka Producer."""

    def __init__(self, producer: Any, topics: Topics, delivery_timeout_s: float) -> None:
        self._producer = producer
        self._topics = topics
        self._timeout_s = delivery_timeout_s
        self._codec = AvroCodec("DrainAction")
        self._in_flight: set[str] = set()
        self._delivered: set[str] = set()

    def deliver(self, actions: list[dict[str, Any]]) -> None:
        """Publish every action and wait for all acknowledgements. Raises ServiceError.

        An action still in flight from an earlier call (flush timed out) is not produced again;
        one whose delivery failed is."""
        errors: list[str] = []

        def on_delivery(action_id: str) -> Callable[[Any, Any], None]:
            def done(err: Any, _msg: Any) -> None:
                self._in_flight.discard(action_id)
                if err is None:
                    self._delivered.add(action_id)
                else:
                    errors.append(str(err))

            return done

        for action in actions:
            action_id = action["action_id"]
            if action_id in self._in_flight or action_id in self._delivered:
                continue
            self._in_flight.add(action_id)
            self._producer.produce(
                self._topics.actions, self._codec.encode(action), action["node"].encode(),
                on_delivery=on_delivery(action_id),
            )  # fmt: skip
        self._producer.flush(self._timeout_s)
        missing = [a["action_id"] for a in actions if a["action_id"] not in self._delivered]
        if missing:
            raise ServiceError(
                f"{len(missing)} audit record(s) undelivered after {self._timeout_s} s; {errors[:3]}"
            )
        for action in actions:
            self._delivered.discard(action["action_id"])

    def dead_letter(self, msg: Any, why: str) -> None:
        """Dead-letter the undecodable recommendation ``msg`` (a confluent-kafka Message)."""
        headers = dead_letter_headers("undecodable", why, stage="drain-controller",
                                      topic=str(msg.topic()), partition=msg.partition(),
                                      offset=msg.offset())  # fmt: skip
        key, value = msg.key(), msg.value()
        produce_dead_letter(self._producer, self._topics.deadletter, value, key, headers)


class DrainController:
    """Wires a consumer, the audit publisher, Slurm and the state file to the pure policy."""

    def __init__(
        self,
        consumer: Any,
        publisher: AuditPublisher,
        slurm: SlurmOps,
        store: StateStore,
        settings: DrainSettings,
        topics: Topics,
        clock: Clock = SYSTEM_CLOCK,
        sleep: Callable[[float], None] = time.sleep,
        verifier: Verifier | None = None,
    ) -> None:
        self._consumer = consumer
        self._verifier = verifier
        self._publisher = publisher
        self._slurm = slurm
        self._store = store
        self._settings = settings
        self._topics = topics
        self._clock = clock
        self._sleep = sleep
        self._rec_codec = AvroCodec("DrainRecommendation")
        self._event_codec = AvroCodec("NodeStateEvent")
        self._next_expiry_check_s = 0.0
        self.stats = DrainStats()

    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Consume until ``stop()`` is true. Raises ServiceError on a fatal Kafka error."""
        self._consumer.subscribe([self._topics.recommendations, self._topics.node_events])
        self.flush_outbox(stop)
        mode = "ENFORCE" if self._settings.enforce else "SHADOW"
        log.info("drain controller running in %s mode", mode)
        while not stop():
            msg = self._consumer.poll(self._settings.poll_timeout_s)
            if msg is not None:
                err = msg.error()
                if err is not None:
                    if getattr(err, "fatal", lambda: False)():
                        raise ServiceError(f"Kafka consumer failed: {err}")
                    log.warning("consumer: %s", err)
                elif self.handle(msg, stop):
                    self._consumer.commit(message=msg, asynchronous=False)
            self.tick(stop)

    def handle(self, msg: Any, stop: Callable[[], bool] = lambda: False) -> bool:
        """Process one message; True when its offset may be committed (False only if stopped)."""
        if msg.topic() == self._topics.node_events:
            self._on_node_event(msg)
            return True
        while True:
            try:
                self._on_recommendation(msg)
                break
            except SlurmCommandError as exc:
                # Without the node list nothing can be decided safely: retry, never skip.
                log.error("cannot read Slurm's nodes, retrying in %s s: %s", RETRY_S, exc)
                if stop():
                    return False
                self._sleep(RETRY_S)
        return self.flush_outbox(stop)

    def _on_recommendation(self, msg: Any) -> None:
        now_ms = self._clock.now_ms()
        started_s = time.monotonic()
        source = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
        with self._store.transaction() as state:
            why = refusal_of(self._verifier, msg)
            if why is not None:
                decision = unverified_decision(msg.key(), why, self._settings.enforce, now_ms)
                state.outbox.append(action_record(decision, source))
                self.stats.unverified += 1
                self.stats.refused += 1
                log.warning("refused %s from %s: %s", decision.node, source, decision.detail)
                return
            try:
                rec = self._rec_codec.decode(msg.value() or b"")
            except CodecError as exc:
                decision = invalid_record(msg.key(), f"undecodable record {source}: {exc}",
                                          self._settings.enforce, now_ms)  # fmt: skip
                self._publisher.dead_letter(msg, str(exc))
                state.outbox.append(action_record(decision, source))
                self.stats.deadletter += 1
                self.stats.observe(state, self._settings.enforce)
                return
            cluster = self._cluster()
            self._reconcile(state, cluster, now_ms)
            decision = decide(rec, state, cluster, self._settings, now_ms)
            decision = self._carry_out(decision)
            apply_decision(state, decision, self._settings)
            state.outbox.append(action_record(decision, source))
            self.stats.observe(state, self._settings.enforce)
        self.stats.recommendations += 1
        self.stats.outcome(str(decision.outcome))
        self.stats.decision_time_s += time.monotonic() - started_s
        log.info("%s %s %s", decision.outcome, decision.node, decision.detail)

    def _cluster(self) -> ClusterView:
        """Slurm's nodes now, with the size overrides of the settings. Raises SlurmCommandError."""
        s = self._settings
        return ClusterView.of(self._slurm.nodes(), s.partition_sizes, s.cluster_size)

    def _carry_out(self, decision: Decision) -> Decision:
        if not (decision.enforce and decision.outcome == Outcome.DRAINED):
            return decision
        try:
            self._slurm.drain(decision.node, decision.slurm_reason or "")
        except SlurmCommandError as exc:
            return decision.failed(f"slurm_error: scontrol update failed: {exc}")
        return decision

    def _reconcile(self, state: ControllerState, cluster: ClusterView, now_ms: int) -> None:
        state.prune(now_ms, self._settings.state_retention_s * 1000, self._window_ms())
        for node in list(state.enforce.drained):
            facts = cluster.nodes.get(node)
            if facts is None:
                state.enforce.drained.pop(node)
            elif observe_node(state, facts, now_ms) == "operator_resume":
                log.info("operator resumed %s: cooldown starts", node)

    def _window_ms(self) -> int:
        s = self._settings
        return max(s.job_window_s, s.partition_window_s) * 1000

    def _on_node_event(self, msg: Any) -> None:
        try:
            event = self._event_codec.decode(msg.value() or b"")
        except CodecError as exc:
            log.warning("skipping undecodable node event: %s", exc)
            return
        facts = NodeFacts(
            name=event["node"], state=event["state"], flags=tuple(event["flags"]),
            reason=event["reason"], reason_user=event["reason_user"],
            partitions=tuple(event["partitions"] or ()),
        )  # fmt: skip
        self.stats.node_events += 1
        with self._store.transaction() as state:
            if observe_node(state, facts, event["ts_ms"]) == "operator_resume":
                log.info("operator resumed %s (node event): cooldown starts", facts.name)

    def flush_outbox(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """Deliver the state's outbox, retrying until delivered; True when empty, False if stopped."""
        while True:
            with self._store.transaction() as state:
                pending = list(state.outbox)
            if not pending:
                return True
            try:
                self._publisher.deliver(pending)
            except ServiceError as exc:
                self.stats.audit_failures += 1
                log.error("audit delivery failed, retrying in %s s: %s", RETRY_S, exc)
                if stop():
                    return False
                self._sleep(RETRY_S)
                continue
            delivered = {a["action_id"] for a in pending}
            with self._store.transaction() as state:
                state.outbox = [a for a in state.outbox if a["action_id"] not in delivered]
                self.stats.outbox_depth = len(state.outbox)

    def tick(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Housekeeping between messages: auto-resume expired drains, deliver a pending outbox."""
        now_s = self._clock.monotonic_s()
        s = self._settings
        if s.enforce and s.auto_resume_on_expiry and now_s >= self._next_expiry_check_s:
            self._next_expiry_check_s = now_s + EXPIRY_CHECK_S
            try:
                self.resume_expired()
            except SlurmCommandError as exc:
                log.error("auto-resume skipped: %s", exc)
        self.flush_outbox(stop)

    def resume_expired(self) -> int:
        """Resume nodes whose recommendation expired and that still carry our reason; returns how
        many. Raises SlurmCommandError when the node list cannot be read."""
        now_ms = self._clock.now_ms()
        count = 0
        with self._store.transaction() as state:
            due = expired_drains(state, now_ms)
            if not due:
                return 0
            cluster = self._cluster()
            self._reconcile(state, cluster, now_ms)
            for entry in due:
                facts = cluster.nodes.get(entry.node)
                if entry.node not in state.enforce.drained or facts is None or not facts.ours:
                    continue
                part = entry.partitions[0] if entry.partitions else None
                try:
                    self._slurm.resume(entry.node)
                except SlurmCommandError as exc:
                    state.outbox.append(resume_record(
                        entry.node, now_ms, f"slurm_error: resume after expiry failed: {exc}",
                        recommendation_id=entry.recommendation_id, refusal=Refusal.SLURM_ERROR,
                        partition=part, slurm_reason=facts.reason))  # fmt: skip
                    continue
                forget_resumed(state, entry.node)
                self.stats.resumed += 1
                state.outbox.append(resume_record(
                    entry.node, now_ms, f"recommendation expired at {entry.expires_ms}: resumed",
                    recommendation_id=entry.recommendation_id, partition=part,
                    slurm_reason=facts.reason))  # fmt: skip
                count += 1
        return count
