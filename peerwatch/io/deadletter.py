"""Dead letters: one convention for every stage that cannot decode, process or deliver a record.

A dead letter on ``peerwatch.deadletter`` carries the original key and value (or, where they
cannot travel, their sizes) and, in headers, why and where from:

========================  =====================================================================
``peerwatch.reason``      short machine-readable reason (``undecodable``, ``late``, ``too large``)
``peerwatch.error``       the error text, at most :data:`ERROR_MAX_BYTES` bytes
``peerwatch.stage``       which stage gave up (``stream``, ``export``, ``archive``, ``agent``, ...)
``peerwatch.topic``       the topic the record came from (or was meant for)
``peerwatch.partition``   its partition, where it was read from one
``peerwatch.offset``      its offset, where it was read from one
``peerwatch.size``        the value's size, where the value does not travel
``peerwatch.value.size``  / ``peerwatch.key.size``: a record too large to send whole
========================  =====================================================================

Every header is optional but the reason. Every producer of dead letters builds its headers
here (:func:`dead_letter_headers`), so a reader of the dead-letter topic sees one set.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

#: A dead letter keeps its original key up to this size (a larger one travels as its size).
DEADLETTER_KEY_MAX_BYTES = 1024
#: The error text of a dead letter is cut to this many bytes.
ERROR_MAX_BYTES = 1000

Headers = list[tuple[str, bytes]]


def dead_letter_headers(
    reason: str,
    error: str = "",
    *,
    stage: str | None = None,
    topic: str | None = None,
    partition: int | None = None,
    offset: int | None = None,
    size: int | None = None,
) -> Headers:
    """The headers of one dead letter (see the module doc); only the given ones are set."""
    out: Headers = [("peerwatch.reason", reason.encode(errors="replace"))]
    if error:
        out.append(("peerwatch.error", error.encode(errors="replace")[:ERROR_MAX_BYTES]))
    for name, value in (("stage", stage), ("topic", topic), ("partition", partition),
                        ("offset", offset), ("size", size)):  # fmt: skip
        if value is not None:
            out.append((f"peerwatch.{name}", str(value).encode(errors="replace")))
    return out


def without_payload(key: bytes | None, value: bytes | None) -> tuple[bytes | None, Headers]:
    """What a dead letter too large to send keeps instead of the original record: its key when
    at most :data:`DEADLETTER_KEY_MAX_BYTES`, and headers with the sizes of value and key."""
    sizes = [("peerwatch.value.size", str(len(value or b"")).encode()),
             ("peerwatch.key.size", str(len(key or b"")).encode())]  # fmt: skip
    return (key if key is None or len(key) <= DEADLETTER_KEY_MAX_BYTES else None), sizes


def produce_dead_letter(
    producer: Any, topic: str, value: bytes | None, key: bytes | None, headers: Headers
) -> None:
    """Produce one dead letter (confluent-kafka ``producer``). A record over the producer's
    size limit (``message.max.bytes``: an input near the broker's limit plus our headers) goes
    without its value (see :func:`without_payload`): the reason and the origin always arrive,
    and the caller's loop goes on. Raises BufferError on a full queue; KafkaException for
    anything else."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        producer.produce(topic, value, key, headers=headers)
        return
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError) or err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
            raise
    log.error("dead letter of a %d-byte value and %d-byte key over the producer's limit: sent "
              "without them", len(value or b""), len(key or b""))  # fmt: skip
    short_key, sizes = without_payload(key, value)
    producer.produce(topic, None, short_key, headers=[*headers, *sizes])


class KafkaDeadLetter:
    """Publishes rejected records to the dead-letter topic (confluent-kafka producer)."""

    def __init__(self, producer: Any, topic: str) -> None:
        self._producer = producer
        self._topic = topic

    def send(self, value: bytes | None, key: bytes | None, headers: Headers) -> None:
        """Queue one record (see :func:`produce_dead_letter`); delivery is confirmed by
        :meth:`flush`. Raises on a full queue."""
        try:
            produce_dead_letter(self._producer, self._topic, value, key, headers)
        except BufferError:
            self._producer.poll(1.0)
            produce_dead_letter(self._producer, self._topic, value, key, headers)
        self._producer.poll(0)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for delivery; returns how many records are still undelivered."""
        remaining: int = self._producer.flush(timeout_s)
        return remaining
