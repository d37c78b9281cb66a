"""Deliver the hooks' outbox to Kafka within a time bound.

Runs in a process of its own, started detached by the hook (so the job never waits for it) or
by hand / cron (``peerwatch slurm flush-outbox``). Records go out oldest first through one
idempotent producer; each file is removed only after Kafka acknowledged its record. When Kafka
does not answer within the bound, what is left stays in the outbox for the next sender.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from peerwatch.errors import CodecError
from peerwatch.producers.slurm.outbox import Outbox, OutboxItem

log = logging.getLogger(__name__)

__all__ = ["KafkaProducer", "SendResult", "send_outbox"]


class KafkaProducer(Protocol):
    """The part of ``confluent_kafka.Producer`` the sender uses."""

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None: ...
    def poll(self, timeout: float) -> int: ...
    def flush(self, timeout: float) -> int: ...
    def purge(self, in_queue: bool = True, in_flight: bool = True) -> None: ...


@dataclass
class SendResult:
    delivered: int = 0
    left: int = 0
    bad: int = 0
    locked_out: bool = False


def send_outbox(
    outbox: Outbox,
    producer_factory: Callable[[], KafkaProducer],
    encode: Callable[[str, dict[str, Any]], bytes],
    timeout_s: float,
    batch_records: int = 500,
) -> SendResult:
    """Deliver waiting records for at most about ``timeout_s`` seconds.

    ``encode(schema_name, record)`` gives the wire bytes; a record it rejects (CodecError) is
    renamed ``*.bad`` and skipped. Waits up to ``timeout_s`` for another sender's lock; the
    producer is created only when there is something to send. Returns counts; raises nothing
    for Kafka being down (records stay)."""
    result = SendResult()
    deadline = time.monotonic() + timeout_s
    producer: KafkaProducer | None = None
    ok = True
    while ok:
        with outbox.locked(max(0.0, deadline - time.monotonic())) as got_lock:
            if not got_lock:
                result.locked_out = True
                break
            while time.monotonic() < deadline:
                items = outbox.pending(batch_records)
                if not items:
                    break
                if producer is None:
                    producer = producer_factory()
                done, ok = _send_batch(outbox, producer, items, encode, deadline, result)
                for item in done:
                    outbox.remove(item)
                result.delivered += len(done)
                if not ok:
                    break
        # A hook that stored a record while we held the lock started no sender of its own
        # (Outbox.sender_active): look again after releasing it.
        if not len(outbox) or time.monotonic() >= deadline:
            break
    result.left = len(outbox)
    return result


def _send_batch(
    outbox: Outbox,
    producer: KafkaProducer,
    items: list[OutboxItem],
    encode: Callable[[str, dict[str, Any]], bytes],
    deadline: float,
    result: SendResult,
) -> tuple[list[OutboxItem], bool]:
    delivered: list[OutboxItem] = []
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any, item: OutboxItem) -> None:
        if err is None:
            delivered.append(item)
        else:
            failed.append(str(err))

    produced = 0
    full = False
    for item in items:
        try:
            value = encode(item.schema, item.record)
        except CodecError as exc:
            log.error("outbox: %s does not encode (%s); set aside as .bad", item.path.name, exc)
            item.path.replace(item.path.with_suffix(".bad"))
            result.bad += 1
            continue
        try:
            producer.produce(
                item.topic, value, item.key.encode(),
                on_delivery=lambda err, msg, it=item: on_delivery(err, msg, it),
                timestamp=int(item.record.get("ts_ms") or 0),
            )  # fmt: skip
        except BufferError:  # librdkafka's queue is full: send the rest next round
            full = True
            break
        produced += 1
    remaining = producer.flush(max(0.0, deadline - time.monotonic()))
    if remaining:
        # Kafka did not acknowledge in time: take the rest back; those files stay.
        producer.purge(in_queue=True, in_flight=True)
        producer.poll(0)
        log.warning("outbox: Kafka did not acknowledge %d records in time; kept", remaining)
    if failed:
        log.warning("outbox: %d records failed (%s); kept", len(failed), failed[0])
    if full and not delivered:
        return delivered, False
    return delivered, not (remaining or failed) and len(delivered) == produced
