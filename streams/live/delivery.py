"""The hot stage's outputs to Kafka: sent, their delivery tracked, refused ones dead-lettered.

At least once: the hot stage commits its input only after :meth:`OutputDelivery.flush` says every
output of it is acknowledged (:mod:`~peerwatch.streams.live.hot_commits`). The broker refuses a
whole produce batch for one record over the topic's ``max.message.bytes``, so a refused record
is first sent again on its own (:meth:`OutputDelivery.resend_refused`); refused alone, it is
dead-lettered and counted. Any other failure (e.g. timed out through a long outage) is
remembered, and the next flush raises instead of letting a commit pass an output that never
arrived (the worker exits, and its restart redoes the windows from the last committed point).
Dead letters of inputs (undecodable, late, invalid samples) go through :meth:`OutputDelivery.dead`.
"""

from __future__ import annotations

import logging
from typing import Any

from peerwatch.errors import ServiceError
from peerwatch.io.deadletter import DEADLETTER_KEY_MAX_BYTES, dead_letter_headers, without_payload

log = logging.getLogger(__name__)
#: The stage named in the hot stage's dead letters.
STAGE = "stream"
#: How long a flush waits for the outputs in flight (s).
FLUSH_TIMEOUT_S = 30.0


class OutputDelivery:
    """One librdkafka producer's outputs (module docstring). ``counters``: the worker's
    (``outputs_refused``, ``outputs_failed``, ``late``, ``count_deadletter``)."""

    def __init__(self, deadletter_topic: str, counters: Any, producer: Any = None) -> None:
        """``producer``: a confluent-kafka Producer whose ``on_delivery`` is
        :meth:`delivered` (None: set :attr:`producer` before sending)."""
        self.deadletter = deadletter_topic
        self.counters = counters
        self.producer = producer
        #: The first output that failed to arrive (see delivered); None while all did.
        self.undelivered: str | None = None
        #: Outputs refused in a batch, to send again alone: (topic, key, value, headers); True
        #: while one is sent alone.
        self._refused: list[tuple[str, Any, Any, list[Any]]] = []
        self._alone = False

    def send(self, topic: str, key: bytes | None, value: bytes, **kw: Any) -> None:
        """Produce one record (``kw``: ``partition``, ``headers``). A full local queue waits
        for deliveries; a record larger than ``message.max.bytes`` is dead-lettered (a dead
        letter of that size is sent without its value). Raises KafkaException otherwise."""
        from confluent_kafka import KafkaError, KafkaException

        while True:
            try:
                self.producer.produce(topic, value, key, **kw)
                return
            except BufferError:  # local queue full: let deliveries drain
                self.producer.poll(0.2)
            except KafkaException as exc:  # larger than message.max.bytes: that record only
                err = exc.args[0] if exc.args else None
                if not isinstance(err, KafkaError) or err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                if topic == self.deadletter:  # an input's: sent without its bytes
                    log.error("hot stage: a dead letter of %d bytes refused (%s); sent without "
                              "its value", len(value) + len(key or b""), err.str())  # fmt: skip
                    if value or len(key or b"") > DEADLETTER_KEY_MAX_BYTES:
                        short_key, sizes = without_payload(key, value)
                        headers = [*(kw.get("headers") or []), *sizes]
                        self.send(topic, short_key, b"", headers=headers)
                    return
                self.counters.count_deadletter()
                log.error("hot stage: a %d-byte record for %s refused (%s); dead-lettered",
                          len(value), topic, err.str())  # fmt: skip
                headers = dead_letter_headers("too large", err.str(), stage=STAGE, topic=topic,
                                              size=len(value))  # fmt: skip
                self.send(self.deadletter, key, b"", headers=headers)
                return

    def delivered(self, err: Any, msg: Any) -> None:
        """OutputDelivery report of one output (librdkafka's ``on_delivery``, on the thread that
        polls or flushes); see the module docstring."""
        from confluent_kafka import KafkaError

        if err is None:
            return
        topic = str(msg.topic())
        permanent = err.code() in (
            KafkaError.MSG_SIZE_TOO_LARGE,
            KafkaError.INVALID_RECORD,
            KafkaError.RECORD_LIST_TOO_LARGE,
        )
        if permanent and topic != self.deadletter:
            if not self._alone:
                self._refused.append((topic, msg.key(), msg.value(), list(msg.headers() or [])))
                return
            self.counters.outputs_refused += 1
            self.counters.count_deadletter()
            value = msg.value() or b""
            log.error("hot stage: the broker refused a %d-byte record for %s (%s); dead-lettered",
                      len(value), topic, err.str())  # fmt: skip
            dead = dead_letter_headers("refused", err.str(), stage=STAGE, topic=topic,
                                       size=len(value))  # fmt: skip
            self.send(self.deadletter, msg.key(), b"", headers=dead)
            return
        self.counters.outputs_failed += 1
        log.error("hot stage: an output to %s was not delivered (%s)", topic, err.str())
        if self.undelivered is None:
            self.undelivered = f"{topic}: {err.str()}"

    def resend_refused(self) -> None:
        """Send each refused record again alone: everything in flight is delivered first, then
        each is sent and flushed by itself, so the broker's verdict on it is final."""
        if not self._refused:
            return
        self.producer.flush(FLUSH_TIMEOUT_S)
        while self._refused:
            topic, key, value, headers = self._refused.pop(0)
            self._alone = True
            try:
                self.send(topic, key, value, headers=headers)
                self.producer.flush(FLUSH_TIMEOUT_S)
            finally:
                self._alone = False

    def flush(self) -> bool:
        """Wait for every output in flight (refused ones sent again alone): True when all are
        acknowledged, False when some are still in flight after :data:`FLUSH_TIMEOUT_S`.
        Raises ServiceError when one was not delivered (no commit may pass it)."""
        left = self.producer.flush(FLUSH_TIMEOUT_S)
        self.resend_refused()
        if self.undelivered is not None:
            raise ServiceError(
                f"hot stage: an output was not delivered ({self.undelivered}); stopping "
                "without committing past it"
            )
        if left:
            log.warning("hot stage: %d outputs not acknowledged; not committing", left)
        return not left

    def dead(self, m: Any, reason: str, detail: str) -> None:
        """Dead-letter input message ``m`` (its key and bytes) with ``reason`` (late samples
        have their own counter; every other reason counts as a dead letter)."""
        if reason != "late":
            self.counters.count_deadletter()
        headers = dead_letter_headers(reason, detail, stage=STAGE, topic=str(m.topic()),
                                      partition=m.partition(), offset=m.offset())  # fmt: skip
        self.send(self.deadletter, m.key(), m.value() or b"", headers=headers)

    def unencodable(self, topic: str, key: bytes, what: str, exc: Exception) -> None:
        """An output that does not fit its schema (``what`` names it): counted as refused,
        logged and dead-lettered with the reason (it is lost; the others are not)."""
        self.counters.outputs_refused += 1
        self.counters.count_deadletter()
        log.error("hot stage: %s not encodable: %s", what, exc)
        dead = dead_letter_headers("unencodable", str(exc), stage=STAGE, topic=topic)
        self.send(self.deadletter, key[:DEADLETTER_KEY_MAX_BYTES], b"", headers=dead)
