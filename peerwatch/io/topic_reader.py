"""Read Kafka topics up to their end, bounded: the one reader every side uses.

A replay of a time range, ``peerwatch job``, the published stream settings and the benchmark all
read "what the topic holds now": each partition from a start (its beginning, or the first offset
at or after a time) to its end offset as of the read (the high watermark asked first), or until
its messages' times pass a bound. Nothing is committed; reading changes nothing on the cluster.

The read is bounded in time: when ``idle_timeout_s`` passes without a message while partitions
are still open (a broker that stopped answering, a partition whose last offsets are
transaction markers that are never delivered), or the whole read passes ``deadline_s``,
:class:`TopicEndNotReached` is raised, naming the partitions left open; what was yielded before
stays with the caller, who decides whether a partial read is an answer.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Messages asked of librdkafka per consume call.
_BATCH = 5000


class TopicEndNotReached(TimeoutError):
    """The read stopped before every partition reached its end (``open_partitions``:
    (topic, partition) pairs)."""

    def __init__(self, message: str, open_partitions: Collection[tuple[str, int]]) -> None:
        super().__init__(message)
        self.open_partitions = frozenset(open_partitions)


@dataclass(frozen=True)
class TopicRange:
    """What to read of one ``topic``: its ``partitions`` (None: all), from the first message at
    or after ``from_ms`` (None: the beginning), each partition until its end offset as of the
    read or until a message's time passes ``until_ms`` (that message is the last one yielded;
    None: no time bound)."""

    topic: str
    partitions: Collection[int] | None = None
    from_ms: int | None = None
    until_ms: int | None = None


def read_to_end(
    consumer: Any,
    ranges: Sequence[TopicRange],
    *,
    idle_timeout_s: float = 10.0,
    deadline_s: float | None = None,
    metadata_timeout_s: float = 10.0,
) -> Iterator[Any]:
    """Every message of ``ranges`` (confluent-kafka ``Message``s without an error), each
    partition in offset order, as they come. ``consumer``: a confluent-kafka Consumer, assigned
    here and unassigned at the end (it may be reused). A topic that does not exist is read as
    empty. Raises :class:`TopicEndNotReached` (see the module doc), and
    confluent_kafka.KafkaException when the cluster does not answer the metadata requests."""
    ends, starts, until = _plan(consumer, ranges, metadata_timeout_s)
    if not starts:
        return
    consumer.assign(starts)
    open_parts = {(tp.topic, tp.partition) for tp in starts}
    began = last = time.monotonic()
    try:
        while open_parts:
            msgs = consumer.consume(num_messages=_BATCH, timeout=min(1.0, idle_timeout_s))
            now = time.monotonic()
            if msgs:
                last = now
            elif now - last >= idle_timeout_s:
                raise TopicEndNotReached(
                    f"no message for {idle_timeout_s:g} s with {_named(open_parts)} open",
                    open_parts,
                )
            if deadline_s is not None and now - began > deadline_s:
                raise TopicEndNotReached(
                    f"end not reached in {deadline_s:g} s: {_named(open_parts)} open", open_parts
                )
            for msg in msgs:
                if msg.error() is not None:
                    continue
                where = (str(msg.topic()), int(msg.partition() or 0))
                if where not in open_parts:
                    continue
                bound = until.get(where[0])
                if int(msg.offset() or 0) + 1 >= ends[where] or (
                    bound is not None and msg.timestamp()[1] > bound
                ):
                    open_parts.discard(where)
                yield msg
    finally:
        consumer.unassign()


def _plan(
    consumer: Any, ranges: Sequence[TopicRange], timeout_s: float
) -> tuple[dict[tuple[str, int], int], list[Any], Mapping[str, int]]:
    """The end offset of each partition to read, the start positions of those with anything
    to read, and the time bound of each topic."""
    from confluent_kafka import TopicPartition

    ends: dict[tuple[str, int], int] = {}
    by_offset: list[Any] = []
    by_time: list[Any] = []
    until: dict[str, int] = {}
    for spec in ranges:
        meta = consumer.list_topics(spec.topic, timeout=timeout_s).topics.get(spec.topic)
        if meta is None or meta.error is not None or not meta.partitions:
            continue
        if spec.until_ms is not None:
            until[spec.topic] = spec.until_ms
        wanted = meta.partitions if spec.partitions is None else spec.partitions
        for p in sorted(set(wanted) & set(meta.partitions)):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(spec.topic, p), timeout=timeout_s
            )
            if high <= low:
                continue
            ends[(spec.topic, p)] = high
            if spec.from_ms is None:
                by_offset.append(TopicPartition(spec.topic, p, low))
            else:
                by_time.append(TopicPartition(spec.topic, p, max(0, spec.from_ms)))
    if by_time:  # -1: no message at or after the time
        by_offset += consumer.offsets_for_times(by_time, timeout=timeout_s)
    starts = [tp for tp in by_offset if 0 <= tp.offset < ends[(tp.topic, tp.partition)]]
    return ends, starts, until


def _named(parts: Collection[tuple[str, int]]) -> str:
    shown = sorted(parts)[:4]
    more = f" and {len(parts) - len(shown)} more" if len(parts) > len(shown) else ""
    return ", ".join(f"{t}[{p}]" for t, p in shown) + more
