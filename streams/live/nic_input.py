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
windows (its readings would be pruned before their window closed) nor behind them. When the
samples are caught up, everything that arrived is handed on (the link rules act on arrival). A
sample is never held longer than :data:`MOST_HELD_S` of wall time (a node whose clock runs
ahead, or a hostile time, must not stall its partition behind it); one whose time is no int in
``[0, 2**53)`` goes on at once (the link rules count it invalid).
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
from peerwatch.streams.live.delivery import FLUSH_TIMEOUT_S, OutputDelivery

log = logging.getLogger(__name__)
#: NIC samples held (ahead of the GPU samples) per partition before it is paused.
HOLD_MOST = 4096
#: Most wall time a NIC sample is held for the GPU samples to reach its time (s).
MOST_HELD_S = 5.0
_FIRST = -(1 << 62)  # the time of a record without a usable one: handed on at once


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

    def start(self) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(consumer_config(self.kafka, self.group, **{
            "enable.partition.eof": False,
        }))  # fmt: skip
        self._consumer.subscribe([self.topic], on_revoke=self._on_revoke)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()

    def read(self, most: int, until_ms: int | None = None) -> list[Mapping[str, Any]]:
        """The NIC samples that arrived (reading up to ``most`` at a time, none waited for),
        decoded, in each partition's order; undecodable ones dead-lettered. ``until_ms``: only
        those at or before this event time (ms: the newest GPU sample time the hot stage is
        about to take), the later ones held for a later call (module docstring); None: all."""
        samples = self._release(until_ms)
        while True:
            messages = self._consumer.consume(most, timeout=0)
            for m in messages:
                if m.error() is not None:
                    log.warning("hot stage NIC consume error: %s", m.error())
                    continue
                self._hold(m)
            samples += self._release(until_ms)  # what stays held is past until_ms
            if len(messages) < most or (until_ms is not None and self._ahead()):
                return samples

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

    def _release(self, until_ms: int | None) -> list[Mapping[str, Any]]:
        """The held samples at or before ``until_ms`` (None: all), partitions resumed once
        drained below :data:`HOLD_MOST`."""
        samples: list[Mapping[str, Any]] = []
        overdue = time.monotonic() - MOST_HELD_S
        for p, queue in self._held.items():
            while queue and (until_ms is None or queue[0][0] <= until_ms or queue[0][3] <= overdue):
                _, offset, sample, _ = queue.popleft()
                self._offsets[p] = offset + 1
                if sample is not None:
                    samples.append(sample)
            if p in self._paused and len(queue) < HOLD_MOST:
                from confluent_kafka import TopicPartition

                self._consumer.resume([TopicPartition(self.topic, p)])
                self._paused.discard(p)
        return samples

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

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.commit()
        for tp in partitions:  # held samples not handed on: the next owner reads them again
            self._offsets.pop(tp.partition, None)
            self._held.pop(tp.partition, None)
            self._paused.discard(tp.partition)
