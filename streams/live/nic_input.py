"""The hot stage's NIC samples input: read, decoded, offsets committed after their outputs.

A consumer group of its own: the NIC state is per node and the allocation view fleet-wide, so
the NIC partitions need not match the samples partitions. Undecodable records are
dead-lettered; offsets are committed with the samples' (after a flush: their findings are out
first), or alone when the worker holds no samples partition.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from peerwatch.errors import CodecError
from peerwatch.kafka_config import consumer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.streams.live.delivery import FLUSH_TIMEOUT_S, OutputDelivery

log = logging.getLogger(__name__)


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

    def start(self) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(consumer_config(self.kafka, self.group, **{
            "enable.partition.eof": False,
        }))  # fmt: skip
        self._consumer.subscribe([self.topic], on_revoke=self._on_revoke)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()

    def read(self, most: int) -> list[Mapping[str, Any]]:
        """The NIC samples that arrived (up to ``most``; none waited for), decoded; undecodable
        ones dead-lettered."""
        samples: list[Mapping[str, Any]] = []
        for m in self._consumer.consume(most, timeout=0):
            if m.error() is not None:
                log.warning("hot stage NIC consume error: %s", m.error())
                continue
            self._offsets[m.partition()] = m.offset() + 1
            try:
                samples.append(self.codec.decode(m.value() or b""))
            except CodecError as exc:
                self.delivery.dead(m, "undecodable", str(exc))
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
        for tp in partitions:
            self._offsets.pop(tp.partition, None)
