"""Stage 2, the hot path, on a confluent-kafka consumer in its own thread of the faust worker.

Faust hands every Kafka record through its per-event machinery (aiokafka's Python fetch
parser, events, channels, acks): profiled, that cost more than decoding and aggregating the
record. The hot stage therefore reads the samples itself, with librdkafka (fetching and lz4
run in C, off the GIL), in batches of up to ``batch_max`` records, decodes each partition's
batch straight into columns (:class:`~peerwatch.schemas.columns.MessageColumns`: the C decoder
for the current schema version) and feeds them to the pure
:class:`~peerwatch.streams.core.windows.WindowAggregator` (one per samples partition). Closed
windows leave as one JSON record per (job, window) on ``<id>-window-batches`` keyed by job, with
watermark heartbeats to every stage-3 partition.

Allocations: a second consumer, outside any group, reads every partition of the job-events topic
from the beginning (14 days of retention) into one :class:`AllocationTable` for the whole
cluster (JobEvents are few). Before a batch of samples is aggregated it is brought up to the
job-events' end offsets as asked *after* the samples were fetched: every JobEvent appended to
the log before those samples is applied first. So a job's start and end are never raced by its
own samples, however fast the input comes (the offline pipeline sees them in the same order).

Offsets: see :mod:`peerwatch.streams.live.hot_progress` (commit at the oldest open window, so a
crash loses no open window and duplicates no emitted one). Commits follow a producer flush,
so every output of the committed input is acknowledged first.

Undecodable samples go to the dead-letter topic (reason ``undecodable``), late ones (reason
``late``), with their original bytes. If this thread fails, the worker is stopped (SIGTERM to
itself): a worker that no longer reads samples must not look healthy.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from peerwatch.errors import CodecError
from peerwatch.kafka_config import admin_config, consumer_config, producer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.schemas.columns import MessageColumns, select_rows
from peerwatch.settings import Settings
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.windows import SAMPLE_SPEC, WindowAggregator
from peerwatch.streams.live.hot_progress import PartitionProgress

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HotTopics:
    samples: str
    job_events: str
    batches: str
    deadletter: str
    job_partitions: int


class _Partition:
    """One assigned samples partition: its aggregator and its offsets."""

    def __init__(self, aggregator: WindowAggregator, progress: PartitionProgress) -> None:
        self.aggregator = aggregator
        self.progress = progress
        self.dirty = False  # windows closed since the last commit


class HotStage:
    """The hot stage of one worker; :meth:`start` runs it in a daemon thread."""

    def __init__(
        self,
        settings: Settings,
        app_id: str,
        topics: HotTopics,
        counters: Any,
        *,
        window_s: int,
        lateness_s: float,
        batch_max: int,
        batch_within_s: float,
        allocation_retention_s: int,
    ) -> None:
        self.settings = settings
        self.group = f"{app_id}-hot"
        self.topics = topics
        self.counters = counters
        self.window_ms = window_s * 1000
        self.window_s, self.lateness_s = window_s, lateness_s
        self.batch_max, self.batch_within_s = batch_max, batch_within_s
        self.retention_ms = allocation_retention_s * 1000
        self.columns = MessageColumns("NodeGpuSample", SAMPLE_SPEC)
        self.job_codec = AvroCodec("JobEvent")
        self.alloc = AllocationTable(self.retention_ms)
        self.parts: dict[int, _Partition] = {}
        self.job_events_seen = self.job_events_bad = 0
        self.last_prune_ms = -(1 << 62)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._jobs: Any = None  # the job-events consumer
        self._admin: Any = None
        self._job_tps: list[Any] = []
        self._job_next: dict[int, int] = {}  # job-events partition -> next offset to apply
        self._producer: Any = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_or_die, name="peerwatch-hot", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run_or_die(self) -> None:
        try:
            self.run()
        except Exception:
            log.critical("hot stage failed; stopping the worker", exc_info=True)
            os.kill(os.getpid(), signal.SIGTERM)

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
        from confluent_kafka.admin import AdminClient

        kafka = self.settings.kafka
        self._admin = AdminClient(admin_config(kafka))
        self._producer = Producer(producer_config(kafka, **{"linger.ms": 5}))
        self._jobs = Consumer(consumer_config(kafka, f"{self.group}-job-events", **{
            "enable.partition.eof": False,
        }))  # fmt: skip
        meta = self._jobs.list_topics(self.topics.job_events, timeout=30).topics
        partitions = sorted(meta[self.topics.job_events].partitions)
        self._job_tps = [TopicPartition(self.topics.job_events, p) for p in partitions]
        self._jobs.assign(
            [TopicPartition(self.topics.job_events, p, OFFSET_BEGINNING) for p in partitions]
        )
        self._consumer = Consumer(consumer_config(kafka, self.group, **{
            "partition.assignment.strategy": "range",
            "enable.partition.eof": False,
        }))  # fmt: skip
        self._consumer.subscribe(
            [self.topics.samples],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        try:
            while not self._stop.is_set():
                messages = self._consumer.consume(self.batch_max, timeout=self.batch_within_s)
                if messages:
                    self._sync_job_events()
                    self._process(messages)
                self._producer.poll(0)
            self._commit(list(self.parts))
        finally:
            self._producer.flush(10)
            self._consumer.close()
            self._jobs.close()

    # -- allocations -----------------------------------------------------------------------------
    def _sync_job_events(self, limit_s: float = 30.0) -> None:
        """Apply every JobEvent appended before now (end offsets asked now, then read up to
        them). Gives up after ``limit_s`` with a warning (a broker that cannot serve them)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

        # Asked through the admin client: on the consumer's own connection the request would
        # queue behind its long-polling fetch (up to fetch.wait.max.ms, per partition).
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        ends: dict[int, int] = {}
        while not self._stop.is_set():
            # Samples wait while the end offsets cannot be asked (a broker outage): aggregating
            # them against allocations that may be missing would attribute them wrongly.
            try:
                futures = self._admin.list_offsets(
                    {tp: latest for tp in self._job_tps}, request_timeout=10
                )
                highs = {tp.partition: f.result().offset for tp, f in futures.items()}
                break
            except KafkaException as exc:
                log.warning("hot stage: job-events end offsets unavailable (%s); retrying", exc)
                # A fresh client: after a broker restart the partitions' leader epoch moved on,
                # and this client kept asking with the old one (FENCED_LEADER_EPOCH) forever,
                # so the worker stayed alive but processed nothing (tests/integration/
                # test_chaos.py). A new client starts from fresh metadata.
                self._admin = AdminClient(admin_config(self.settings.kafka))
                self._stop.wait(1.0)
        else:
            return
        ends = {p: h for p, h in highs.items() if h > self._job_next.get(p, 0)}
        deadline = time.monotonic() + limit_s
        while ends:
            if time.monotonic() > deadline:
                log.warning("hot stage: job events not read up to %s in %.0f s; going on",
                            ends, limit_s)  # fmt: skip
                return
            messages = self._jobs.consume(1000, timeout=0.5)
            for m in messages:
                if m.error() is not None:
                    log.warning("hot stage job-events error: %s", m.error())
                    continue
                self._job_next[m.partition()] = m.offset() + 1
                self._apply_job_event(m)
            if not messages:  # offsets can have gaps: ask where the consumer stands
                for tp in self._jobs.position(self._job_tps):
                    if tp.offset >= 0:
                        self._job_next[tp.partition] = max(
                            self._job_next.get(tp.partition, 0), tp.offset
                        )
            ends = {p: h for p, h in ends.items() if self._job_next.get(p, 0) < h}

    def _apply_job_event(self, m: Any) -> None:
        self.job_events_seen += 1
        try:
            self.alloc.apply_event(self.job_codec.decode(m.value() or b""))
        except (CodecError, InvalidRecordError, KeyError, ValueError, TypeError) as exc:
            # Stage 3 dead-letters the same record; here it is only counted.
            self.job_events_bad += 1
            log.warning("hot stage: job event %d@%d not applied: %s",
                        m.partition(), m.offset(), exc)  # fmt: skip

    # -- assignment ----------------------------------------------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        from confluent_kafka import KafkaException

        try:
            committed = {tp.partition: tp for tp in consumer.committed(partitions, timeout=30)}
        except KafkaException as exc:
            # The consumer still starts from the committed offsets; only the skip metadata is
            # missing, so windows emitted just before are re-emitted (stage 3 drops them).
            log.warning("hot stage: committed offsets unreadable (%s); resuming without "
                        "skip metadata", exc)  # fmt: skip
            committed = {}
        for tp in partitions:
            progress = PartitionProgress(self.window_ms)
            c = committed.get(tp.partition)
            if c is not None and c.offset >= 0:
                progress.resume(c.metadata)
            agg = WindowAggregator(self.alloc, self.window_s, self.lateness_s, idle_jobs=True)
            agg.closed_until_ms = progress.resumed_closed_until_ms
            self.parts[tp.partition] = _Partition(agg, progress)
        log.info("hot stage assigned samples partitions %s", sorted(self.parts))

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._commit([tp.partition for tp in partitions])
        self._on_lost(consumer, partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:  # not ours any more (after a lost assignment: no commit)
            self.parts.pop(tp.partition, None)

    # -- the hot path ----------------------------------------------------------------------------
    def _process(self, messages: list[Any]) -> None:
        start_wall, start_cpu = time.time(), time.process_time()
        by_partition: dict[int, list[Any]] = {}
        for m in messages:
            if m.error() is not None:
                log.warning("hot stage consume error: %s", m.error())
                continue
            if m.partition() in self.parts:  # else revoked within this batch
                by_partition.setdefault(m.partition(), []).append(m)
        records = readings = 0
        for p, batch in sorted(by_partition.items()):
            n_records, n_readings = self._aggregate(p, self.parts[p], batch)
            records += n_records
            readings += n_readings
        if records:
            self.counters.batch_done(records, readings, start_wall, start_cpu)
        dirty = [p for p, part in self.parts.items() if part.dirty]
        if dirty:
            self._commit(dirty)

    def _aggregate(self, p: int, part: _Partition, batch: list[Any]) -> tuple[int, int]:
        """Decode one partition's messages into columns and aggregate them; returns (samples,
        GPU readings) aggregated."""
        agg = part.aggregator
        tables, rows, bad = self.columns.decode([m.value() or b"" for m in batch], agg.strings)
        reasons = dict(bad)
        ts = tables[""].values["ts_ms"].tolist()
        keep = np.ones(len(rows), np.bool_)
        row = 0
        for i, m in enumerate(batch):  # in offset order, as the progress wants them
            if i in reasons:
                part.progress.skip(m.offset())
                self._dead(m, "undecodable", reasons[i])
                continue
            if part.progress.already_handled(m.offset(), ts[row]):
                part.progress.skip(m.offset())
                keep[row] = False
            else:
                part.progress.read(m.offset(), ts[row])
            row += 1
        if not keep.all():
            tables, rows = select_rows(tables, keep), rows[keep]
        unattributed_before = agg.unattributed
        result = agg.add_columns(tables)
        self.counters.unattributed += agg.unattributed - unattributed_before
        for r in result.late.tolist():
            self.counters.late += 1
            self._dead(batch[rows[r]], "late", "sample for a window already closed")
        for r in result.invalid.tolist():
            self._dead(batch[rows[r]], "invalid", "sample time outside [0, 2**53) ms")
        closed_before = agg.closed_until_ms
        closed_wall_ms = time.time() * 1000.0
        batches = self.topics.batches
        for b in agg.close_ready():
            value = {
                "kind": "windows", "src": p, "job_id": b.job_id,
                "window_start_ms": b.window_start_ms, "window_end_ms": b.window_end_ms,
                "windows": b.windows, "closed_wall_ms": closed_wall_ms,
            }  # fmt: skip
            self._send(batches, b.job_id.encode(), json.dumps(value).encode())
        if agg.closed_until_ms is not None and agg.closed_until_ms != closed_before:
            part.progress.closed(agg.closed_until_ms)
            part.dirty = True
            mark = json.dumps({
                "kind": "watermark", "src": p, "closed_until_ms": agg.closed_until_ms,
            }).encode()  # fmt: skip
            for q in range(self.topics.job_partitions):
                self._send(batches, b"~watermark", mark, partition=q)
        # Pruning walks every node's table: once per window of event time is plenty; by the
        # slowest partition, which may still need the allocations of jobs that ended.
        marks = [q.aggregator.watermark_ms for q in self.parts.values()]
        slowest = min((w for w in marks if w is not None), default=None)
        if slowest is not None and slowest >= self.last_prune_ms + self.window_ms:
            self.last_prune_ms = slowest
            self.alloc.prune(slowest - self.retention_ms)
        return tables[""].n, tables["gpus."].n

    def _send(self, topic: str, key: bytes, value: bytes, **kw: Any) -> None:
        while True:
            try:
                self._producer.produce(topic, value, key, **kw)
                return
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.2)

    def _dead(self, m: Any, reason: str, detail: str) -> None:
        if reason != "late":  # late samples have their own counter
            self.counters.count_deadletter()
        headers = [
            ("peerwatch.reason", reason.encode()),
            ("peerwatch.error", detail[:1000].encode(errors="replace")),
            ("peerwatch.topic", str(m.topic()).encode()),
            ("peerwatch.partition", str(m.partition()).encode()),
            ("peerwatch.offset", str(m.offset()).encode()),
        ]
        self._send(self.topics.deadletter, m.key(), m.value() or b"", headers=headers)

    def _commit(self, partitions: list[int]) -> None:
        """Flush the outputs, then commit each partition's resume point (see hot_progress)."""
        from confluent_kafka import KafkaException, TopicPartition

        offsets = []
        for p in partitions:
            part = self.parts.get(p)
            point = part.progress.commit_point() if part else None
            if part is not None:
                part.dirty = False
            if point is not None:
                offsets.append(TopicPartition(self.topics.samples, p, point[0], metadata=point[1]))
        if not offsets:
            return
        left = self._producer.flush(30)
        if left:
            log.warning("hot stage: %d outputs not acknowledged; not committing", left)
            for p in partitions:
                if p in self.parts:
                    self.parts[p].dirty = True
            return
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("hot stage commit failed (will retry at the next close): %s", exc)
