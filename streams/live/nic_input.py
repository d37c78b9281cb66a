"""The hot stage's NIC samples input: read, decoded, offsets committed after their outputs.

A consumer group of its own: the NIC state is per node and the allocation view fleet-wide, so
the NIC partitions need not match the samples partitions. Undecodable records are
dead-lettered; offsets are committed with the samples' (after a flush: their findings are out
first), or alone when the worker holds no samples partition.

**Joined in event time with the GPU samples.** A window's port summaries are made when the GPU
samples close it, from the NIC readings stage 2 holds then; the in-process runner sees both
streams in event-time order, so a live worker must too. While the samples have a backlog (a
restart, a burst), :meth:`NicInput.read` hands on only the NIC samples at or before the newest
GPU sample time it is given and holds the later ones, in order, per partition (a partition that
holds :data:`HOLD_MOST` is paused until it drains), so the NIC input never runs ahead of the
windows (its readings would be pruned before their window closed). Nor does it fall behind
them: before the hot stage takes a batch, the NIC input reads on until every assigned NIC
partition has read a sample at or past the batch's time less half the allowed lateness (the
windows the batch may close end before that), or has nothing more to read (caught up, and
quiet for :data:`QUIET_S`), waiting at most :data:`MOST_WAIT_S` (counted, logged): a NIC
consumer that fetches slower than the samples' (a backlog, a start before its group join)
would otherwise close windows without their ports. When the samples are caught up, everything
that arrived is handed on (the link rules act on arrival). A sample whose time stays ahead (a
node whose clock runs ahead) never holds back those behind it: once a partition's head has
been held :data:`MOST_HELD_S` of wall time, the samples behind it that may go, go (a node's own
samples keep their order; the offset committed is the oldest held). Holding by wall time alone
would not do: a backlog takes longer than any such bound to work off, and NIC readings handed
on ahead of their windows were lost to them (stage 2 keeps a node's readings only so far behind
its newest). A sample whose time is no int in ``[0, 2**53)`` goes on at once (the link rules
count it invalid).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from peerwatch.errors import CodecError
from peerwatch.kafka_config import consumer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.streams.core.windows import VALUE_LIMIT
from peerwatch.streams.live import hot_partitions
from peerwatch.streams.live.delivery import FLUSH_TIMEOUT_S, OutputDelivery

log = logging.getLogger(__name__)
#: NIC samples held (ahead of the GPU samples) per partition before it is paused.
HOLD_MOST = 4096
#: A partition's head held this long (wall s) makes the samples behind it that may go, go.
MOST_HELD_S = 5.0
#: Longest the hot stage waits for the NIC samples to reach a batch's time (s); after that
#: it goes on (live may then differ from a replay: counted as ``nic_wait_given_up``).
MOST_WAIT_S = 5.0
#: A caught-up NIC partition that received nothing for this long is not waited for (s).
QUIET_S = 1.0
#: How often a waiting hot stage polls the NIC consumer (s).
WAIT_POLL_S = 0.02
#: A partition waited for in vain is not waited for again for this long (s): a node whose
#: clock runs behind, alone in its partition, must not slow every batch.
UNWAITED_AFTER_GIVE_UP_S = 60.0
_FIRST = -(1 << 62)  # the time of a record without a usable one: handed on at once
#: An event time (ms) for every partition, or one per partition (:func:`bound`).
Times = int | Mapping[int, int]


def bound(times: Times, partition: int) -> int:
    """``partition``'s time in ``times``: the one time, or its own; one absent from the mapping
    (its samples partition is held by another worker) has the newest of the others (ms; none:
    :data:`_FIRST`). The NIC topic is co-partitioned with the samples (same
    key, same count), so NIC partition p holds the nodes of samples partition p: each is held
    to its own partition's time, as the in-process runner, whose single stream is in event
    order, has it (one bound for all would let a partition's NIC readings run ahead of its
    slower samples, and stage 2 would drop them before their windows closed)."""
    if isinstance(times, int):
        return times
    own = times.get(partition)
    return own if own is not None else max(times.values(), default=_FIRST)


class NicInput:
    """NodeNicSample records of ``topic`` for one worker (module docstring)."""

    def __init__(
        self, kafka: KafkaSettings, topic: str, group: str, delivery: OutputDelivery
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self.group = f"{group}-nic"
        self.delivery = delivery
        self.codec = AvroCodec("NodeNicSample")
        self._consumer: Any = None
        #: partition -> next offset to commit (committed after a flush)
        self._offsets: dict[int, int] = {}
        #: partition -> (ts_ms, offset, decoded sample or None: dead-lettered) read ahead of the
        #: GPU samples, in offset order; the paused partitions
        #: (each with the monotonic s it was read at)
        self._held: dict[int, deque[tuple[int, int, Mapping[str, Any] | None, float]]] = {}
        self._paused: set[int] = set()
        #: partition -> the offset after the latest message read; (until, queue length) when a
        #: stuck head was last looked behind (:meth:`_pass_stuck`)
        self._next: dict[int, int] = {}
        self._stuck_seen: dict[int, tuple[int, int]] = {}
        #: the assigned partitions (None before the first assignment); per partition, the time
        #: of the latest sample read (ms) and when the latest message arrived (monotonic s)
        self._assigned: set[int] | None = None
        self._read_ms: dict[int, int] = {}
        self._arrived_s: dict[int, float] = {}
        self._started_s = time.monotonic()
        #: waits for the NIC samples that ended at MOST_WAIT_S, not caught up; partition ->
        #: monotonic s until which it is not waited for again
        self.waits_given_up = 0
        self._unwaited_until: dict[int, float] = {}

    def start(self) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(consumer_config(self.kafka, self.group, **{
            "enable.partition.eof": False,
        }))  # fmt: skip
        self._started_s = time.monotonic()
        self._consumer.subscribe([self.topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)  # fmt: skip

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()

    def read(
        self, most: int, until_ms: Times | None = None, reach_ms: Times | None = None
    ) -> list[Mapping[str, Any]]:
        """The NIC samples that arrived (reading up to ``most`` at a time), decoded, in each
        partition's order; undecodable ones dead-lettered. ``until_ms``: only those at or
        before this event time (ms: the newest GPU sample time the hot stage took, of each
        samples partition: :func:`bound`), the later ones held for a later call (module
        docstring); None: all. ``reach_ms``: wait (at most :data:`MOST_WAIT_S`) until each
        assigned partition read that far or has nothing more to read (:meth:`behind`); None:
        none waited for."""
        samples = self._release(until_ms)
        waited_since = time.monotonic()
        timeout = 0.0
        while True:
            messages = self._consumer.consume(most, timeout=timeout)
            for m in messages:
                if m.error() is not None:
                    log.warning("hot stage NIC consume error: %s", m.error())
                    continue
                self._hold(m)
            samples += self._release(until_ms)  # what stays held is past until_ms
            if len(messages) == most and not (until_ms is not None and self._ahead()):
                timeout = 0.0  # more arrived: read on
                continue
            if reach_ms is None or not self.behind(reach_ms):
                return samples
            if time.monotonic() - waited_since >= MOST_WAIT_S:
                self._give_up(reach_ms)
                return samples
            timeout = WAIT_POLL_S

    def _give_up(self, reach_ms: Times) -> None:
        """A wait ended at :data:`MOST_WAIT_S`: counted, logged, and the partitions still
        behind not waited for during :data:`UNWAITED_AFTER_GIVE_UP_S`."""
        late = self.behind(reach_ms)
        self.waits_given_up += 1
        log.warning("hot stage: NIC partitions %s did not reach %s ms within %.0f s; going on "
                    "without them (not waited for during %.0f s)", late, reach_ms, MOST_WAIT_S,
                    UNWAITED_AFTER_GIVE_UP_S)  # fmt: skip
        until = time.monotonic() + UNWAITED_AFTER_GIVE_UP_S
        if late == [-1]:  # never assigned: the samples go on alone
            self._assigned = set()
        for p in late:
            self._unwaited_until[p] = until

    def latest_read_ms(self, partition: int) -> int:
        """The time of the latest sample read from ``partition`` (ms; none yet: earlier than
        any)."""
        return self._read_ms.get(partition, _FIRST)

    def behind(self, reach_ms: Times) -> list[int]:
        """The assigned partitions that may still hold samples before ``reach_ms`` (ms, per
        partition: :func:`bound`; a partition absent from a mapping is not waited for): their
        latest sample read is older, and they have more to read or received something within
        :data:`QUIET_S`. Before the first assignment, every partition is (``[-1]``), for
        :data:`MOST_WAIT_S` after the start."""
        if self._assigned is None:
            waiting = time.monotonic() - self._started_s < MOST_WAIT_S
            return [-1] if waiting else []
        now = time.monotonic()
        late = [p for p in sorted(self._assigned)
                if (isinstance(reach_ms, int) or p in reach_ms)
                and p not in self._paused  # it holds HOLD_MOST ahead: nothing more is read
                and self._read_ms.get(p, _FIRST) < bound(reach_ms, p)
                and self._unwaited_until.get(p, 0.0) <= now]  # fmt: skip
        if not late:
            return []
        quiet_before = now - QUIET_S
        caught_up = hot_partitions.caught_up(self._consumer, self.topic, late)
        return [p for p in late
                if p not in caught_up or self._arrived_s.get(p, 0.0) > quiet_before]  # fmt: skip

    def _hold(self, m: Any) -> None:
        """One message into its partition's queue (decoded; undecodable: dead-lettered now,
        its offset passed in order); a partition holding :data:`HOLD_MOST` past the time asked
        is paused."""
        sample: Mapping[str, Any] | None = None
        try:
            sample = self.codec.decode(m.value() or b"")
        except CodecError as exc:
            self.delivery.dead(m, "undecodable", str(exc))
        ts = sample.get("ts_ms") if sample is not None else None
        # a time that is no int in [0, 2**53) goes on at once: the link rules count it invalid
        at = _FIRST
        if isinstance(ts, int) and not isinstance(ts, bool) and 0 <= ts < VALUE_LIMIT:
            at = ts
            # the latest read, not the newest: one node's clock ahead must not make its
            # partition look read past the others' samples behind it
            self._read_ms[m.partition()] = at
        self._arrived_s[m.partition()] = time.monotonic()
        self._next[m.partition()] = m.offset() + 1
        queue = self._held.setdefault(m.partition(), deque())
        queue.append((at, m.offset(), sample, time.monotonic()))
        if len(queue) >= HOLD_MOST and m.partition() not in self._paused:
            from confluent_kafka import TopicPartition

            self._consumer.pause([TopicPartition(self.topic, m.partition())])
            self._paused.add(m.partition())

    def _ahead(self) -> bool:
        """Whether every partition read holds a sample (after :meth:`_release`: past the time
        asked; reading more would only hold more)."""
        return bool(self._held) and all(self._held.values())

    def release(self, partition: int, until_ms: int) -> list[Mapping[str, Any]]:
        """The held samples of one partition at or before ``until_ms`` (ms), as :meth:`read`
        hands them on, none read: the hot stage steps a samples partition's batch in parts and
        gives each part the NIC readings up to its time (as the in-process runner has them)."""
        return self._release({partition: until_ms}, [partition])

    def _release(
        self, until_ms: Times | None, partitions: list[int] | None = None
    ) -> list[Mapping[str, Any]]:
        """The held samples at or before ``until_ms`` (:func:`bound`; None: all), in each
        partition's order (of ``partitions``; None: all); behind a head held
        :data:`MOST_HELD_S` (its time ahead of the others', :meth:`_pass_stuck`) too.
        Partitions are resumed once drained below :data:`HOLD_MOST`; the offset to commit is the
        oldest still held."""
        samples: list[Mapping[str, Any]] = []
        stuck_before = time.monotonic() - MOST_HELD_S
        held = self._held.items() if partitions is None else [
            (p, self._held[p]) for p in partitions if p in self._held]  # fmt: skip
        for p, queue in held:
            until = None if until_ms is None else bound(until_ms, p)
            released = False
            while queue and (until is None or queue[0][0] <= until):
                _, _, sample, _ = queue.popleft()
                released = True
                if sample is not None:
                    samples.append(sample)
            if until is not None and queue and queue[0][3] <= stuck_before:
                released |= self._pass_stuck(p, until, samples)
            if released:
                queue = self._held[p]
                self._offsets[p] = queue[0][1] if queue else self._next[p]
            if p in self._paused and len(queue) < HOLD_MOST:
                from confluent_kafka import TopicPartition

                self._consumer.resume([TopicPartition(self.topic, p)])
                self._paused.discard(p)
        return samples

    def _pass_stuck(self, p: int, until: int, samples: list[Mapping[str, Any]]) -> bool:
        """Partition ``p``'s head stays ahead of ``until`` (a node whose clock runs ahead, or
        a valid but odd time): the samples behind it at or before ``until`` go on (into
        ``samples``; each node's own order kept: a node's later samples are as far ahead),
        the rest stay held in order. Looked at again only once ``until`` or the queue
        changed. Returns whether any went."""
        queue = self._held[p]
        if self._stuck_seen.get(p) == (until, len(queue)):
            return False
        keep: deque[tuple[int, int, Mapping[str, Any] | None, float]] = deque()
        went = False
        for item in queue:
            if item[0] <= until:
                went = True
                if item[2] is not None:
                    samples.append(item[2])
            else:
                keep.append(item)
        self._held[p] = keep
        self._stuck_seen[p] = (until, len(keep))
        return went

    def commit(self) -> None:
        """Commit the offsets read, once every output is acknowledged (else read again after a
        restart)."""
        if not self._offsets:
            return
        from confluent_kafka import KafkaException, TopicPartition

        if self.delivery.producer.flush(FLUSH_TIMEOUT_S) or self.delivery.undelivered is not None:
            return
        offsets = [TopicPartition(self.topic, p, o) for p, o in sorted(self._offsets.items())]
        self._offsets = {}
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("hot stage NIC commit failed (will retry): %s", exc)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._assigned = (self._assigned or set()) | {tp.partition for tp in partitions}

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.commit()
        self._on_lost(consumer, partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:  # held samples not handed on: the next owner reads them again
            self._offsets.pop(tp.partition, None)
            self._held.pop(tp.partition, None)
            self._paused.discard(tp.partition)
            self._read_ms.pop(tp.partition, None)
            self._arrived_s.pop(tp.partition, None)
            self._next.pop(tp.partition, None)
            self._stuck_seen.pop(tp.partition, None)
            if self._assigned is not None:
                self._assigned.discard(tp.partition)
