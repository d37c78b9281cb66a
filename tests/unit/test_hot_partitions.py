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
    """Positions (none read yet: -1001) and the high watermarks librdkafka cached."""

    def __init__(self, cached: dict[int, int]) -> None:
        self.cached = cached

    def position(self, tps: list[Any]) -> list[Any]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in tps]

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        assert cached  # the broker is asked through the admin client
        return 0, self.cached[tp.partition]


class Offset:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self) -> Offset:
        return self


class Admin:
    """The broker's log ends per partition (start 0), asked through ``list_offsets``."""

    def __init__(self, ends: dict[int, int]) -> None:
        self.ends = ends
        self.asked: list[int] = []  # partitions asked, per request
        self.refuse = False

    def list_offsets(self, specs: dict[Any, Any], request_timeout: float) -> dict[Any, Offset]:
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import OffsetSpec

        if self.refuse:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        out = {}
        for tp, spec in specs.items():
            latest = repr(spec) == repr(OffsetSpec.latest())
            self.asked.append(tp.partition)
            out[tp] = Offset(self.ends[tp.partition] if latest else 0)
        return out


def partitions(consumer: Consumer, admin: Admin) -> Partitions:
    parts = Partitions("s", 10_000, OutputDelivery("dead", StreamCounters(), producer=object()),
                       admin=lambda: admin)  # fmt: skip
    parts.consumer = consumer
    for p in consumer.cached:
        parts.parts[p] = Partition(PartitionProgress(10_000))
    return parts


def test_a_partition_empty_only_in_the_cache_gets_no_idle_mark() -> None:
    consumer, admin = Consumer(cached={0: 0, 1: 0}), Admin(ends={0: 0, 1: 250})
    parts = partitions(consumer, admin)  # 1's records are at the broker, not fetched yet
    assert parts.idle_marks(60_000, {0: None, 1: None}) == {0: 60_000}
    # once the broker says so, asked again only when the mark would move
    admin.ends[1] = 0
    assert parts.idle_marks(60_000, {0: None, 1: None}) == {0: 60_000, 1: 60_000}
    asked = len(admin.asked)
    assert parts.idle_marks(60_000, {0: None, 1: None}) == {0: 60_000, 1: 60_000}
    assert len(admin.asked) == asked
    assert parts.idle_marks(70_000, {0: None, 1: None}) == {0: 70_000, 1: 70_000}
    assert len(admin.asked) == asked + 4  # both partitions, start and end: two requests


def test_a_broker_that_does_not_answer_sends_no_idle_mark() -> None:
    admin = Admin(ends={0: 0})
    admin.refuse = True
    assert partitions(Consumer(cached={0: 0}), admin).idle_marks(60_000, {0: None}) == {}
