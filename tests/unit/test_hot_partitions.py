"""The hot stage's idle marks (streams/live/hot_partitions.py): a samples partition with no
node follows the worker's latest closed-until, so the fleet watches are not held back; but
"empty" is the broker's answer, not the consumer's cache.

Found by the demo's live = replay test: at a start on a backlog, a partition whose first fetch
had not come back looked empty in librdkafka's cached watermarks while another partition ran
ahead; its idle mark followed and released job windows before its batches came. The consumer
here is a stand-in with a cached and a broker high watermark per partition (no broker: the
rule under test is which one decides)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.delivery import OutputDelivery
from peerwatch.streams.live.hot_partitions import Partition, Partitions
from peerwatch.streams.live.hot_progress import PartitionProgress


class Consumer:
    """Positions (none read yet: -1001) and high watermarks as cached and at the broker."""

    def __init__(self, cached: dict[int, int], broker: dict[int, int]) -> None:
        self.cached, self.broker = cached, broker
        self.asked: list[int] = []  # partitions whose broker watermark was asked

    def position(self, tps: list[Any]) -> list[Any]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]

    def get_watermark_offsets(
        self, tp: Any, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        if cached:
            return 0, self.cached[tp.partition]
        self.asked.append(tp.partition)
        return 0, self.broker[tp.partition]


def partitions(consumer: Consumer) -> Partitions:
    parts = Partitions("s", 10_000, OutputDelivery("dead", StreamCounters(), producer=object()))
    parts.consumer = consumer
    for p in consumer.cached:
        parts.parts[p] = Partition(PartitionProgress(10_000))
    return parts


def test_a_partition_empty_only_in_the_cache_gets_no_idle_mark() -> None:
    consumer = Consumer(cached={0: 0, 1: 0}, broker={0: 0, 1: 250})  # 1's records not fetched
    parts = partitions(consumer)
    assert parts.idle_marks(60_000, {0: None, 1: None}) == {0: 60_000}
    # once the broker says so, asked again only when the mark would move
    consumer.broker[1] = 0
    assert parts.idle_marks(60_000, {0: None, 1: None}) == {0: 60_000, 1: 60_000}
    asked = len(consumer.asked)
    assert parts.idle_marks(60_000, {0: None, 1: None}) == {0: 60_000, 1: 60_000}
    assert len(consumer.asked) == asked
    assert parts.idle_marks(70_000, {0: None, 1: None}) == {0: 70_000, 1: 70_000}
    assert len(consumer.asked) == asked + 2


def test_a_broker_that_does_not_answer_sends_no_idle_mark() -> None:
    from confluent_kafka import KafkaError, KafkaException

    consumer = Consumer(cached={0: 0}, broker={0: 0})

    def refuse(tp: Any, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        if cached:
            return 0, 0
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

    consumer.get_watermark_offsets = refuse  # type: ignore[method-assign]
    assert partitions(consumer).idle_marks(60_000, {0: None}) == {}
