"""The hot stage's samples partitions: assignment, positions and commits.

Each assigned partition resumes from its committed offset and metadata
(:class:`~peerwatch.streams.live.hot_progress.PartitionProgress`: commit at the oldest open
window, so a crash loses no open window and duplicates no emitted one). Commits follow a flush
of every output (:meth:`OutputDelivery.flush`), so every output of the committed input is
acknowledged first; the NIC offsets ride on them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from peerwatch.streams.live.delivery import OutputDelivery
from peerwatch.streams.live.hot_progress import PartitionProgress

log = logging.getLogger(__name__)
#: Longest wait for the broker's answer whether a partition is empty (s).
EMPTY_ASK_S = 1.0


def nothing_to_read(position: int, low: int, high: int) -> bool:
    """Whether a partition at ``position`` (the next offset to read; negative: none read yet)
    with watermarks ``low``/``high`` has nothing left to read (an unknown high: it may)."""
    return high >= 0 and (position >= high or (position < 0 and high == low))


def caught_up(consumer: Any, topic: str, partitions: list[int]) -> set[int]:
    """Those of ``partitions`` of ``topic`` with nothing left to read, as far as ``consumer``
    knows (its position against the high watermark librdkafka caches from its fetches: one
    not fetched since data came may look caught up; ask the broker where that matters)."""
    from confluent_kafka import KafkaException, TopicPartition

    out: set[int] = set()
    try:
        for tp in consumer.position([TopicPartition(topic, p) for p in partitions]):
            marks = consumer.get_watermark_offsets(tp, cached=True)
            if marks and nothing_to_read(tp.offset, *marks):
                out.add(tp.partition)
    except KafkaException as exc:  # not known yet: none caught up
        log.debug("%s: positions unavailable (%s)", topic, exc)
    return out


class Partition:
    """One assigned samples partition: its offsets and when it was last heard from."""

    def __init__(self, progress: PartitionProgress) -> None:
        self.progress = progress
        self.dirty = False  # windows closed since the last commit
        self.max_ts_ms: int | None = None  # latest valid sample time (the silence clock's)
        self.arrival_wall_s = time.time()  # when its latest samples arrived

    def arrived(self) -> None:
        """Samples were consumed (before they are taken: a batch may take seconds, and the
        partition must not look quiet to the NIC join meanwhile)."""
        self.arrival_wall_s = time.time()

    def heard(self, newest_ms: int | None) -> None:
        """Samples were taken, the newest valid one at ``newest_ms`` (None: none valid)."""
        if newest_ms is None:
            return
        self.max_ts_ms = newest_ms if self.max_ts_ms is None else max(self.max_ts_ms, newest_ms)
        self.arrival_wall_s = time.time()


class Partitions:
    """The assigned samples partitions of ``topic`` on one consumer (set :attr:`consumer`
    before the first assignment)."""

    def __init__(
        self,
        topic: str,
        window_ms: int,
        delivery: OutputDelivery,
        admin: Callable[[], Any] | None = None,
    ) -> None:
        """``admin``: the admin client the broker is asked through whether a partition is
        empty (made at first use; None: never asked, no idle marks)."""
        self.topic = topic
        self._admin_factory = admin
        self._admin: Any = None
        self.window_ms = window_ms
        self.delivery = delivery
        self.consumer: Any = None
        self.parts: dict[int, Partition] = {}
        #: called after each successful commit (the NIC offsets ride on it)
        self.after_commit: Callable[[], None] = lambda: None
        #: partition -> the latest closed-until its idle marks were confirmed empty for (ms)
        self._confirmed: dict[int, int] = {}

    def admin(self) -> Any:
        """The admin client (made at first use)."""
        if self._admin is None and self._admin_factory is not None:
            self._admin = self._admin_factory()
        return self._admin

    def __iter__(self) -> Iterator[int]:
        return iter(self.parts)

    def __len__(self) -> int:
        return len(self.parts)

    def assign(self, consumer: Any, partitions: list[Any]) -> dict[int, int | None]:
        """Take ``partitions`` (TopicPartitions) with their committed progress; returns each
        one's closed-until (ms; None: fresh) for its stage-2 source."""
        from confluent_kafka import KafkaException

        try:
            committed = {tp.partition: tp for tp in consumer.committed(partitions, timeout=30)}
        except KafkaException as exc:
            # The consumer still starts from the committed offsets; only the skip metadata is
            # missing, so windows emitted just before are re-emitted (stage 3 drops them).
            log.warning("hot stage: committed offsets unreadable (%s); resuming without "
                        "skip metadata", exc)  # fmt: skip
            committed = {}
        out: dict[int, int | None] = {}
        for tp in partitions:
            progress = PartitionProgress(self.window_ms)
            c = committed.get(tp.partition)
            if c is not None and c.offset >= 0:
                progress.resume(c.metadata)
            self.parts[tp.partition] = Partition(progress)
            out[tp.partition] = progress.resumed_closed_until_ms
        log.info("hot stage assigned samples partitions %s", sorted(self.parts))
        return out

    def drop(self, partitions: list[Any]) -> list[int]:
        """Forget ``partitions`` (revoked or lost); returns their numbers."""
        gone = [tp.partition for tp in partitions]
        for p in gone:
            self.parts.pop(p, None)
            self._confirmed.pop(p, None)
        return gone

    def caught_up(self) -> set[int]:
        """Assigned partitions with nothing left to read (:func:`caught_up`)."""
        return caught_up(self.consumer, self.topic, list(self.parts))

    def quiet(self, quiet_after_s: float, never_after_s: float) -> set[int]:
        """Assigned partitions with nothing to read (:meth:`caught_up`) that received no sample
        for ``quiet_after_s``, or none at all since their assignment ``never_after_s`` ago
        (wall s): their nodes send nothing now (or they hold none)."""
        wall = time.time()
        waited = [p for p, q in self.parts.items()
                  if wall - q.arrival_wall_s
                  >= (quiet_after_s if q.max_ts_ms is not None else never_after_s)]  # fmt: skip
        if not waited:
            return set()
        caught_up = self.caught_up()
        return {p for p in waited if p in caught_up}

    def event_clock(
        self, wall_s: float, quiet_after_s: float, silent_after_ms: int
    ) -> tuple[list[int], int | None]:
        """Where event time stands for the silence checks: the partitions that hold them back,
        or (none holding back) the event time itself (ms; None: no sample yet). A partition
        with nothing to read that received nothing since the assignment, or for
        ``quiet_after_s``, holds nothing back (it holds no node, or its nodes stopped). When all
        are so quiet, event time is the latest sample of any, moved on by the wall clock where
        the samples came in real time (within ``silent_after_ms`` of their arrival): a fleet
        gone quiet is still seen (the one rule a replay cannot follow)."""
        busy = [p for p, q in self.parts.items()
                if q.max_ts_ms is not None and wall_s - q.arrival_wall_s < quiet_after_s]  # fmt: skip
        quiet = [p for p in self.parts if p not in busy]
        if quiet:
            caught_up = self.caught_up()
            busy += [p for p in quiet if p not in caught_up]
        if busy:
            return busy, None
        clocks = [q.max_ts_ms + (int((wall_s - q.arrival_wall_s) * 1000)
                                 if q.max_ts_ms >= q.arrival_wall_s * 1000 - silent_after_ms
                                 else 0)
                  for q in self.parts.values() if q.max_ts_ms is not None]  # fmt: skip
        return [], max(clocks) if clocks else None

    def idle_marks(self, latest: int, closed_until: Mapping[int, int | None]) -> dict[int, int]:
        """Heartbeats for assigned partitions that hold no node: nothing to read and no sample
        since the assignment (an empty log; ``closed_until``: each one's, None before its first
        close). They follow the worker's ``latest`` closed-until, so the fleet watches, which
        wait for every samples partition, are not held back by a partition without nodes (a
        node that appears there later sends its censuses for windows the fleet may have judged
        already: those are ignored).

        Empty is asked of the broker (:meth:`_empty`), not of the consumer's cache: at a start
        on a backlog, a partition whose first fetch has not come back looks empty in the cache
        while another runs ahead, and a mark following that one released job windows before
        the slow partition's batches came (stage 3 then dropped them as late; found by the
        demo's live = replay test). Asked again only when ``latest`` moved past what it was
        confirmed for."""
        empty = [p for p, q in self.parts.items()
                 if closed_until.get(p) is None and q.max_ts_ms is None]  # fmt: skip
        if not empty:
            return {}
        caught_up = self.caught_up()
        ask = [p for p in empty if p in caught_up and self._confirmed.get(p, -1) < latest]
        for p in self._broker_empty(ask) if ask else ():
            self._confirmed[p] = latest
        return {p: latest for p in empty
                if p in caught_up and self._confirmed.get(p, -1) >= latest}  # fmt: skip

    def _broker_empty(self, partitions: list[int]) -> set[int]:
        """Those of ``partitions`` with nothing to read at the broker now: their log's start
        and end asked through the admin client, one request each for all (on the consumer's
        own connection each would queue behind its long-polling fetch, up to fetch.wait.max.ms
        a partition), :data:`EMPTY_ASK_S` at most; unanswered: none (the marks wait)."""
        from confluent_kafka import KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        if self._admin_factory is None:
            return set()
        tps = [TopicPartition(self.topic, p) for p in partitions]
        try:
            positions = {tp.partition: tp.offset for tp in self.consumer.position(tps)}
            ends = {}
            for name, spec in (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest())):  # type: ignore[no-untyped-call]
                futures = self.admin().list_offsets({tp: spec for tp in tps},
                                                    request_timeout=EMPTY_ASK_S)  # fmt: skip
                ends[name] = {tp.partition: f.result().offset for tp, f in futures.items()}
        except KafkaException as exc:
            log.debug("hot stage: offsets of partitions %s unavailable (%s)", partitions, exc)
            # a fresh client next time: after a broker restart an old one kept asking with the
            # partitions' old leader epoch (see job_event_sync)
            self._admin = None
            return set()
        return {p for p in partitions
                if nothing_to_read(positions[p], ends["low"][p], ends["high"][p])}  # fmt: skip

    def commit_dirty(self) -> None:
        """:meth:`commit` the partitions that closed windows since their last commit."""
        dirty = [p for p, part in self.parts.items() if part.dirty]
        if dirty:
            self.commit(dirty)

    def commit(self, partitions: list[int]) -> None:
        """Flush the outputs, then commit each partition's resume point (see hot_progress).
        Raises ServiceError when an output was not delivered."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = []
        for p in partitions:
            part = self.parts.get(p)
            point = part.progress.commit_point() if part else None
            if part is not None:
                part.dirty = False
            if point is not None:
                offsets.append(TopicPartition(self.topic, p, point[0], metadata=point[1]))
        if not offsets:
            return
        if not self.delivery.flush():
            for p in partitions:
                if p in self.parts:
                    self.parts[p].dirty = True
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("hot stage commit failed (will retry at the next close): %s", exc)
        self.after_commit()
