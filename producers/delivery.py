"""Delivery that loses nothing, shared by every producer (agent, hooks, watcher, health, simulator).

The caller's loop only ever calls :meth:`Delivery.send`, which puts the record on a bounded
in-memory queue and returns at once: sampling never blocks on Kafka. A worker thread owns the
confluent-kafka producer (idempotent, acks=all, lz4, murmur2 partitioner) and the on-disk
:class:`~peerwatch.producers.spool.Spool`:

* DIRECT mode: records go straight to librdkafka, which retries them itself with their
  idempotent sequence numbers, so the broker discards any copy it already has.
* When every broker is down (librdkafka's error callback), or librdkafka's bounded queue is full,
  the worker switches to SPOOL mode: new records go to the spool and are never handed to
  librdkafka, so they cannot be duplicated. Records librdkafka already holds stay there.
* When the broker answers again and librdkafka has delivered everything it held, the spool is
  replayed in order, chunk by chunk, each chunk removed only after it was delivered (a partly
  delivered chunk puts back exactly the failed records); then DIRECT mode resumes.
* :meth:`close` flushes; records librdkafka never sent are purged from it and spooled.

Within one process nothing is lost, duplicated or reordered, except for two documented cases: a
record librdkafka itself gave up on after ``message_timeout_ms`` (5 minutes by default) may or may
not have reached the broker; it is spooled behind newer records and may arrive late or twice. The
per-node sequence number makes that visible to consumers. And a record Kafka refuses for good (too
large for the topic, invalid) is dead-lettered with the reason and counted (``stats.refused``);
the records that shared its refused batch are sent again one by one, so they arrive late.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from peerwatch.errors import ServiceError
from peerwatch.io.deadletter import dead_letter_headers
from peerwatch.kafka_config import producer_config
from peerwatch.producers.spool import Spool, SpooledRecord
from peerwatch.settings import KafkaSettings

log = logging.getLogger(__name__)


#: Errors after which Kafka will never take the record: it is dead-lettered, not retried.
PERMANENT_ERRORS = frozenset({
    KafkaError.INVALID_RECORD, KafkaError.INVALID_MSG, KafkaError.INVALID_TIMESTAMP,
})  # fmt: skip
#: A batch too large: every record in it gets this, not only the one at fault (found alone).
SIZE_ERRORS = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
#: A refused record's value goes to the dead-letter topic up to this size (else none).
DEADLETTER_VALUE_MAX_BYTES = 64 * 1024


def _note_answer(answer: list[KafkaError | None], err: KafkaError | None, _msg: object) -> None:
    answer.append(err)


@dataclass(frozen=True)
class DeliverySettings:
    """Knobs of the delivery path (all have safe defaults)."""

    spool_dir: Path
    spool_max_bytes: int = 256 * 1024 * 1024
    spool_max_age_s: float = 24 * 3600.0
    #: librdkafka retries a record for this long before giving up (then we spool it).
    message_timeout_ms: int = 300_000
    #: Records held in memory between ``send`` and the worker; beyond it ``send`` spools directly.
    queue_max_records: int = 100_000
    #: Records librdkafka may hold (in memory) before new ones go to the spool.
    librdkafka_max_records: int = 20_000
    replay_chunk_records: int = 2_000
    retry_interval_s: float = 2.0
    #: Where records Kafka refuses for good go (None: counted and logged only).
    deadletter_topic: str | None = None


@dataclass
class DeliveryStats:
    sent: int = 0
    delivered: int = 0
    spooled: int = 0
    replayed: int = 0
    dropped: int = 0
    failed_attempts: int = 0
    #: errors that stopped the worker thread's loop (each logged), and its restarts
    worker_errors: int = 0
    worker_restarts: int = 0
    #: records dropped in memory (queue and overflow full: the worker did not keep up)
    dropped_in_memory: int = 0
    #: corrupt regions skipped in the spool when it was opened (records lost there)
    spool_corrupt_regions: int = 0
    #: records the broker refused for good (too large...): dead-lettered, never retried
    refused: int = 0

    def summary(self) -> str:
        """One readable line for logs: "3 sent, 3 delivered (2 from the spool), 1 spooled";
        counters at zero are left out."""
        parts = [f"{self.sent} sent", f"{self.delivered} delivered"]
        if self.replayed:
            parts[-1] += f" ({self.replayed} from the spool)"
        for name, label in _SUMMARY_COUNTERS:
            value = getattr(self, name)
            if value:
                parts.append(f"{value} {label}")
        return ", ".join(parts)


#: DeliveryStats counters named in its summary line when not zero, in this order.
_SUMMARY_COUNTERS = (
    ("spooled", "spooled"),
    ("dropped", "dropped"),
    ("dropped_in_memory", "dropped in memory"),
    ("refused", "refused by Kafka"),
    ("failed_attempts", "failed attempts"),
    ("spool_corrupt_regions", "corrupt spool regions skipped"),
    ("worker_errors", "worker errors"),
    ("worker_restarts", "worker restarts"),
)
#: Delivery errors that may mean the topic does not exist (librdkafka waits for it to appear,
#: then gives up or is purged at close): the topic is looked up and named if missing.
_TOPIC_SUSPECT_ERRORS = frozenset({
    KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._MSG_TIMED_OUT,
    KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT,
})  # fmt: skip
_PURGED = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})


class Delivery:
    """Non-blocking, spooling Kafka delivery. Thread-safe ``send``; call :meth:`close` at the end."""

    def __init__(
        self,
        kafka: KafkaSettings,
        settings: DeliverySettings,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
        **producer_overrides: Any,
    ) -> None:
        self._config = producer_config(
            kafka,
            **{
                "message.timeout.ms": settings.message_timeout_ms,
                "queue.buffering.max.messages": settings.librdkafka_max_records,
                "error_cb": self._on_error,
                **producer_overrides,
            },
        )
        self._factory = producer_factory
        self._settings = settings
        self._queue: queue.Queue[SpooledRecord | None] = queue.Queue(settings.queue_max_records)
        self.stats = DeliveryStats()
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._overflow: list[SpooledRecord] = []
        self._overflow_lock = threading.Lock()
        # Worker-thread state.
        self._producer: Producer | None = None
        self._spool: Spool | None = None
        self._inflight = 0
        self._failed: list[SpooledRecord] = []
        self._suspects: list[SpooledRecord] = []
        self._held: list[SpooledRecord] = []
        self._spooling = False
        self._next_attempt = 0.0
        #: topics of records that failed in a way a missing topic explains; those named missing
        self._unplaced_topics: set[str] = set()
        self._missing_named: set[str] = set()
        #: The last error of the worker thread (None: none), for logs and health checks.
        self.last_error: str | None = None

    # -- caller side ----------------------------------------------------------------------------
    def start(self) -> Delivery:
        """Start the worker thread (connects lazily; never blocks on the broker)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="peerwatch-delivery", daemon=True
            )
            self._thread.start()
        return self

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        ts_ms: int = 0,
    ) -> None:
        """Queue one record for delivery; returns at once. Raises ServiceError when the worker
        thread is gone (it restarts itself after errors, so only something it cannot survive)
        and the in-memory queue is full: the caller stops instead of queueing into nothing."""
        with self._seq_lock:
            self._seq += 1
            rec = SpooledRecord(topic, key, value, tuple(headers), ts_ms, self._seq)
        try:
            self._queue.put_nowait(rec)
        except queue.Full:
            self._check_worker()
            with self._overflow_lock:  # the worker spools these in order at its next turn
                if len(self._overflow) < self._settings.queue_max_records:
                    self._overflow.append(rec)
                    return
                self.stats.dropped += 1  # memory stays bounded whatever the worker does
                self.stats.dropped_in_memory += 1
            if (
                self.stats.dropped_in_memory in (1, 10, 100)
                or not self.stats.dropped_in_memory % 10_000
            ):
                log.error("delivery: %d records dropped: the worker does not keep up (%s)",
                          self.stats.dropped_in_memory, self.last_error)  # fmt: skip

    @property
    def spooled_records(self) -> int:
        return len(self._spool) if self._spool is not None else 0

    @property
    def spooling(self) -> bool:
        return self._spooling

    def close(self, timeout_s: float = 10.0) -> DeliveryStats:
        """Deliver what can be delivered within ``timeout_s``; spool the rest; stop the worker."""
        self._close_timeout_s = timeout_s
        self._stopping.set()
        # A full queue (a worker gone for good) must not block close; a live worker stops once
        # it has emptied the queue anyway.
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=1.0)
        if self._thread is not None:
            self._thread.join(timeout_s + 30)
        return self.stats

    @property
    def worker_alive(self) -> bool:
        """Whether the worker thread runs (False before :meth:`start` and after :meth:`close`)."""
        return self._thread is not None and self._thread.is_alive()

    def _check_worker(self) -> None:
        if self._thread is not None and not self._thread.is_alive() and not self._stopping.is_set():
            raise ServiceError(f"the delivery worker stopped: {self.last_error or 'no error seen'}")

    # -- worker side ----------------------------------------------------------------------------
    def _run(self) -> None:
        """The worker thread: :meth:`_work`, restarted after any error (logged, counted in
        ``stats.worker_errors``/``worker_restarts``, the error in :attr:`last_error`) with a
        growing pause, until :meth:`close`; then :meth:`_shutdown`."""
        pause_s = 0.5
        while True:
            try:
                self._work()
                break
            except Exception as exc:
                self.stats.worker_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("delivery: the delivery worker failed; restarting in %.1f s", pause_s)
                if self._stopping.wait(pause_s):
                    break
                pause_s = min(pause_s * 2, 30.0)
                self.stats.worker_restarts += 1
            except BaseException as exc:  # cannot be survived: end, seen (send raises from now)
                self.stats.worker_errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.critical("delivery: the delivery worker stopped: %s", self.last_error)
                break
        try:
            self._shutdown()
        except Exception as exc:
            self.stats.worker_errors += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("delivery: shutting down the delivery worker failed")

    def _open(self) -> None:
        if self._spool is None:
            self._spool = Spool(
                self._settings.spool_dir,
                max_bytes=self._settings.spool_max_bytes,
                max_age_s=self._settings.spool_max_age_s,
            )
            found = {k: getattr(self._spool, k) for k in
                     ("bad_head", "bad_segments", "corrupt_regions", "corrupt_bytes",
                      "torn_tails")}  # fmt: skip
            self.stats.spool_corrupt_regions += found["corrupt_regions"]
            if any(found.values()):
                log.error("delivery: the spool was damaged and repaired: %s", found)
            if len(self._spool):
                log.info("delivery: %d records waiting in the spool from earlier", len(self._spool))
                self._spooling = True
        if self._producer is None:
            self._producer = self._factory(self._config)

    def _work(self) -> None:
        self._open()
        assert self._producer is not None
        while True:
            try:
                stop = self._drain_queue(timeout_s=0.05)
                self._producer.poll(0)
                if self._suspects:
                    self._isolate()
                self._settle()
                if self._spooling:
                    self._maybe_replay()
            except Exception:
                # The worker must outlive any surprise (a full disk, a client error): records
                # keep queueing in memory and the next turn tries again.
                log.exception("delivery: unexpected error in the delivery worker; continuing")
                stop = self._stopping.is_set()
                time.sleep(0.5)
            if stop:
                break

    def _drain_queue(self, timeout_s: float) -> bool:
        stop = False
        try:
            item = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            item = None
            if not self._stopping.is_set():
                return False
        batch = [] if item is None else [item]
        stop = item is None and self._stopping.is_set()
        while len(batch) < 10_000:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                stop = True
                continue
            batch.append(nxt)
        with self._overflow_lock:
            overflow, self._overflow = self._overflow, []
        for rec in batch:
            self._dispatch(rec)
        if overflow:
            self._enter_spooling("the in-memory queue is full")
            self._held.extend(overflow)
        return stop

    def _dispatch(self, rec: SpooledRecord) -> None:
        self.stats.sent += 1
        if self._spooling:
            self._held.append(rec)
            return
        if not self._produce(rec, replay=False):
            self._enter_spooling("librdkafka's queue is full")
            self._held.append(rec)

    def _produce(self, rec: SpooledRecord, replay: bool) -> bool:
        """Hand ``rec`` to librdkafka; False when its queue is full (spool it). A record the
        client refuses for good (larger than ``message.max.bytes``...) is dead-lettered."""
        assert self._producer is not None
        try:
            # timestamp 0 lets librdkafka stamp the record with the current time.
            self._producer.produce(
                rec.topic, rec.value, rec.key, headers=list(rec.headers) or None,
                on_delivery=functools.partial(self._on_delivery_cb, rec, replay),
                timestamp=rec.ts_ms,
            )  # fmt: skip
        except BufferError:
            return False
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is None or err.code() not in PERMANENT_ERRORS | SIZE_ERRORS:
                raise
            self._refuse(rec, err)
            return True
        self._inflight += 1
        return True

    def _isolate(self) -> None:
        """Send each record of a batch the broker refused as too large alone, waiting for its
        answer: refused alone, it is dead-lettered; delivered, done (later than the records
        sent after it: the one case of reordering besides message timeouts); any other error,
        spooled as usual."""
        assert self._producer is not None
        suspects, self._suspects = sorted(self._suspects, key=lambda r: r.seq), []
        self._producer.flush(self._settings.message_timeout_ms / 1000)  # nothing to batch with
        for rec in suspects:
            answer: list[KafkaError | None] = []
            try:
                self._producer.produce(
                    rec.topic, rec.value, rec.key, headers=list(rec.headers) or None,
                    on_delivery=functools.partial(_note_answer, answer), timestamp=rec.ts_ms,
                )  # fmt: skip
            except KafkaException as exc:
                answer.append(exc.args[0] if exc.args else None)
            except BufferError:
                answer.append(KafkaError(KafkaError._QUEUE_FULL))
            else:
                self._producer.flush(self._settings.message_timeout_ms / 1000)
            err = answer[0] if answer else KafkaError(KafkaError._TIMED_OUT)
            if err is None:
                self.stats.delivered += 1
            elif isinstance(err, KafkaError) and err.code() in PERMANENT_ERRORS | SIZE_ERRORS:
                self._refuse(rec, err)
            else:
                self._enter_spooling(f"not delivered ({err})")
                self._failed.append(rec)

    def _refuse(self, rec: SpooledRecord, err: KafkaError) -> None:
        """A record Kafka will never take: counted, logged and dead-lettered (its value when it
        fits, else none: the headers say where it came from, why, and its size); never
        retried or spooled."""
        self.stats.refused += 1
        reason = f"{err.name()}: {err.str()}"
        log.error("delivery: a record for %s (%d bytes) refused for good and dead-lettered: %s",
                  rec.topic, len(rec.value), reason)  # fmt: skip
        topic = self._settings.deadletter_topic
        if topic is None or self._producer is None:
            return
        keep = len(rec.value) <= DEADLETTER_VALUE_MAX_BYTES
        headers: list[tuple[str, str | bytes | None]] = [
            *dead_letter_headers("refused by Kafka", reason, stage="producer", topic=rec.topic,
                                 size=len(rec.value))
        ]  # fmt: skip
        for value in (rec.value, b"") if keep else (b"",):
            try:
                self._producer.produce(topic, value, rec.key, headers=headers)
                return
            except (BufferError, KafkaException) as exc:  # too large here too: without value
                log.error("delivery: dead-lettering failed%s: %s",
                          "; again without the value" if value else "", exc)  # fmt: skip

    def _on_delivery_cb(
        self, rec: SpooledRecord, replay: bool, err: KafkaError | None, _msg: object
    ) -> None:
        self._on_delivery(err, rec, replay)

    def _on_delivery(self, err: KafkaError | None, rec: SpooledRecord, replay: bool) -> None:
        self._inflight -= 1
        if err is None:
            self.stats.delivered += 1
            if replay:
                self._replay_ok += 1
            return
        self.stats.failed_attempts += 1
        if err.code() in _TOPIC_SUSPECT_ERRORS:
            self._unplaced_topics.add(rec.topic)
        if err.code() in SIZE_ERRORS:
            # The broker refuses a whole batch for one record too large: which one is only
            # known by sending each alone (see _isolate), never by retrying the batch.
            self._suspects.append(rec)
            if replay:
                self._replay_ok += 1  # out of the spool's chunk: _isolate settles it
            return
        if err.code() in PERMANENT_ERRORS:  # never taken however often it is sent
            self._refuse(rec, err)
            if replay:
                self._replay_ok += 1  # done with: not put back
            return
        if replay:
            self._replay_failures.append(rec)
            return
        if not self._spooling:
            purged = err.code() in _PURGED
            self._enter_spooling(
                "not delivered before close" if purged else f"not delivered ({err.str()})"
            )
        self._failed.append(rec)

    def _on_error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT):
            self._enter_spooling(f"Kafka unavailable ({err.str()})")
        else:
            log.debug("kafka client: %s", err.str())

    def _report_missing_topics(self) -> None:
        """Name, once each, the topics records failed for that the broker does not have (a
        missing topic otherwise looks like an unreachable broker). Needs the broker to answer:
        when it does not, nothing is said here (the spooling warning is)."""
        topics, self._unplaced_topics = self._unplaced_topics - self._missing_named, set()
        if not topics or self._producer is None:
            return
        try:
            md = self._producer.list_topics(timeout=1.0)
        except KafkaException:
            return
        if not any(b.id >= 0 for b in md.brokers.values()):
            return
        for topic in sorted(topics):
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None:
                self._missing_named.add(topic)
                log.error("delivery: topic %s does not exist on the broker; its records are "
                          "spooled until it does (create it: peerwatch topics create)", topic)  # fmt: skip

    def _enter_spooling(self, why: str) -> None:
        if not self._spooling:
            log.warning("delivery: %s; spooling to disk", why)
            self._spooling = True
            self._next_attempt = time.monotonic() + self._settings.retry_interval_s

    def _settle(self) -> None:
        """Move records librdkafka gave up on, then held-back records, to the spool (durable)."""
        if not (self._failed or self._held):
            return
        assert self._spool is not None
        records = sorted(self._failed, key=lambda r: r.seq) + self._held
        self._failed, self._held = [], []
        before = self._spool.dropped
        try:
            self._spool.append(records)
        except OSError:
            # The spool cannot take them (its directory gone, an I/O error): they are lost;
            # count them rather than let the worker retry a write that keeps failing.
            self.stats.dropped += len(records)
            log.exception("delivery: spool write failed; dropped %d records", len(records))
            return
        self.stats.spooled += len(records)
        self.stats.dropped += self._spool.dropped - before

    def _maybe_replay(self) -> None:
        assert self._spool is not None and self._producer is not None
        # Older records still inside librdkafka go first: replay only once it has delivered them.
        if self._inflight or time.monotonic() < self._next_attempt:
            return
        self._settle()
        # librdkafka reports "all brokers down" once per outage: spooling ends only once the
        # broker answers, even with nothing waiting, or later records would sit in librdkafka's
        # memory queue for the rest of the outage.
        if not self._broker_answers():
            self._next_attempt = time.monotonic() + self._settings.retry_interval_s
            return
        self._report_missing_topics()
        if not len(self._spool):
            if not self._held:
                log.info("delivery: spool drained; back to direct delivery")
                self._spooling = False
            return
        self._replay(closing_by_s=None)

    def _replay(self, closing_by_s: float | None) -> None:
        """Replay the spool chunk by chunk, in order, until it is empty or a chunk fails.
        Running (``closing_by_s`` None): also stops when :meth:`close` is called, and keeps
        accepting new records meanwhile. Closing: stops at the monotonic time ``closing_by_s``;
        records still unanswered then are purged from librdkafka and stay in the spool (they
        may have reached the broker: a later replay may deliver them twice)."""
        assert self._spool is not None and self._producer is not None
        while len(self._spool):
            if closing_by_s is None and self._stopping.is_set():
                return
            if closing_by_s is not None and time.monotonic() >= closing_by_s:
                return
            chunk = self._spool.peek(self._settings.replay_chunk_records)
            self._replay_ok, self._replay_failures = 0, []
            produced = 0
            for rec in chunk:
                if not self._produce(rec, replay=True):
                    break
                produced += 1
            if closing_by_s is None:
                wait_until = time.monotonic() + self._settings.message_timeout_ms / 1000 + 5
            else:
                wait_until = closing_by_s
            while self._inflight and time.monotonic() < wait_until:
                self._producer.poll(0.05)
                if closing_by_s is None:
                    self._drain_queue(timeout_s=0)  # keep accepting (held back) records
            if self._inflight:  # closing, out of time: their callbacks mark them failed
                self._producer.purge(in_queue=True, in_flight=True)
                self._producer.poll(0.5)
                self._inflight = 0
            # Remove what was produced; put back exactly the records that failed, in order.
            self._spool.pop(produced)
            self._spool.prepend(sorted(self._replay_failures, key=lambda r: r.seq))
            self.stats.replayed += self._replay_ok
            if self._replay_failures or produced < len(chunk):
                self._next_attempt = time.monotonic() + self._settings.retry_interval_s
                return
            self._settle()

    def _broker_answers(self, timeout_s: float = 1.0) -> bool:
        assert self._producer is not None
        try:
            md = self._producer.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return bool(md.brokers) and any(b.id >= 0 for b in md.brokers.values())

    def _shutdown(self) -> None:
        if self._producer is None or self._spool is None:
            # Never opened (the spool or the client could not be made): what is held is lost.
            with self._overflow_lock:
                lost = len(self._failed) + len(self._held) + len(self._overflow)
                lost += self._queue.qsize()
            self.stats.dropped += lost
            log.error("delivery closed without a spool or a client: %d records lost (%s)",
                      lost, self.last_error)  # fmt: skip
            return
        closing_by_s = time.monotonic() + self._close_timeout_s
        remaining = self._producer.flush(self._close_timeout_s)
        if remaining:
            # Undeliverable now: take them back from librdkafka (their callbacks mark them failed).
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.poll(0.5)
            if self._inflight:
                self._producer.purge(in_queue=True, in_flight=True)
                self._producer.flush(1)
            self._inflight = 0
        self._settle()
        self._report_missing_topics()
        # A short-lived process (a health check, a hook) must not leave its spool for the next
        # run: what the spool holds is replayed now, within what is left of the close timeout.
        left_s = closing_by_s - time.monotonic()
        if len(self._spool) and left_s > 0 and self._broker_answers(min(1.0, left_s)):
            self._replay(closing_by_s=closing_by_s)
            self._settle()
        if self._spool.dropped:
            self.stats.dropped = self._spool.dropped
        log.info("delivery closed: %s; the spool holds %d", self.stats.summary(), len(self._spool))

    _replay_ok = 0
    _close_timeout_s = 10.0
    _replay_failures: list[SpooledRecord] = []  # noqa: RUF012 - reset per chunk before use
