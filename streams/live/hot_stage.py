"""Stage 2, the hot path, on a confluent-kafka consumer in its own thread of the faust worker.

Faust hands every Kafka record through its per-event machinery (aiokafka's Python fetch
parser, events, channels, acks): profiled, that cost more than decoding and aggregating the
record. The hot stage therefore reads the samples itself, with librdkafka (fetching and lz4
run in C, off the GIL), in batches of up to ``batch_max`` records, decodes each partition's
batch straight into columns (:class:`~peerwatch.schemas.columns.MessageColumns`: the C decoder
for the current schema version) and feeds them to the pure
:class:`~peerwatch.streams.core.windows.WindowAggregator` (one per samples partition). Closed
windows leave as one JSON record per (job, window) and batch, holding each samples partition's
windows, on ``<id>-window-batches`` keyed by job, then one watermark heartbeat per batch to every stage-3 partition (the closed-until of each samples
partition that closed windows in it).

Allocations: a second consumer, outside any group, reads every partition of the job-events topic
from the beginning (14 days of retention) into one :class:`AllocationTable` for the whole
cluster (JobEvents are few). Before a batch of samples is aggregated it is brought up to the
job-events' end offsets as asked *after* the samples were fetched: every JobEvent appended to
the log before those samples is applied first. So a job's start and end are never raced by its
own samples, however fast the input comes (the offline pipeline sees them in the same order).

Offsets: see :mod:`peerwatch.streams.live.hot_progress` (commit at the oldest open window, so a
crash loses no open window and duplicates no emitted one). Commits follow a producer flush,
so every output of the committed input is acknowledged first.

Beside the windows, on the same decoded columns: the pure
:class:`~peerwatch.streams.core.hard_watch.HardWatch` of each partition fires hard rules on the
sample that shows them, and one :class:`~peerwatch.streams.core.silence.SilenceWatch` per worker
notices allocated nodes of its partitions that stopped sending. Their findings go out at once,
Avro on the public findings topic (key job) and, when they name a node, JSON on the internal
``<id>-findings`` topic (key node) that the policy agent reads. The silence watch looks when
:class:`~peerwatch.streams.core.silence.SilenceClock` says, as replay does: at each multiple of
``silent_check_s`` of event time that every assigned partition reached (see
:meth:`HotStage.silence_due` for partitions that hold no node or went quiet). Fleet context is
stage 3's: each partition's census of the window starts it closes goes to the stage-3 channel
whose fleet watch judges, before the heartbeats (:mod:`~peerwatch.streams.core.fleet`).

Undecodable samples go to the dead-letter topic (reason ``undecodable``), late ones (reason
``late``), with their original bytes. If this thread fails, the worker is stopped (SIGTERM to
itself): a worker that no longer reads samples must not look healthy.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from peerwatch.errors import CodecError, ServiceError
from peerwatch.io.deadletter import DEADLETTER_KEY_MAX_BYTES, dead_letter_headers, without_payload
from peerwatch.kafka_config import admin_config, consumer_config, producer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.schemas.columns import MessageColumns, select_rows
from peerwatch.settings import Settings
from peerwatch.streams.core import loops
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.clock_offset import ClockOffsets
from peerwatch.streams.core.fleet import FLEET_CHANNEL, censuses_closed
from peerwatch.streams.core.hard_watch import HardWatch
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.network_stage import NetworkStage
from peerwatch.streams.core.pipeline import PRUNE_EVERY_MS
from peerwatch.streams.core.silence import SilenceClock, SilenceWatch
from peerwatch.streams.core.windows import SAMPLE_SPEC, VALUE_LIMIT, WindowAggregator
from peerwatch.streams.live.hot_progress import PartitionProgress
from peerwatch.streams.live.window_batches import WindowBatchCodec

log = logging.getLogger(__name__)
#: The stage named in this stage's dead letters.
STAGE = "stream"
#: Clock offsets: a batch's newest sample time may run ahead of the wall time since the last
#: batch by this much (a tick, jitter) and the partition still counts as read live (ms).
LIVE_SLACK_MS = 2000
#: A heartbeat goes to stage 3 at least this often while windows close (or not) (s).
HEARTBEAT_EVERY_S = 1.0
#: Nodes newly past the clock-skew threshold logged one by one per refresh (then a count).
CLOCK_WARNINGS_AT_ONCE = 10


@functools.lru_cache(maxsize=1 << 16)
def samples_partition(node: str, partitions: int) -> int:
    """The samples partition of ``node``: Kafka's default keyed partitioner (murmur2), which the
    producers (librdkafka ``murmur2_random``) and faust (aiokafka) both use."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(node.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class HotTopics:
    samples: str
    job_events: str
    batches: str
    deadletter: str
    job_partitions: int
    #: The public findings topic (Avro, key job) and the internal one the policy reads (JSON,
    #: key node).
    findings: str = ""
    node_findings: str = ""
    #: The NIC samples topic (NodeNicSample, key node); "" reads none.
    nic_samples: str = ""


@dataclass(frozen=True)
class HotSpec:
    """Everything a worker's hot stage is built from (picklable: a hot process gets it)."""

    settings: Settings
    app_id: str
    topics: HotTopics
    #: Partitions of the samples topic (the producers' partitioner, for the silence watch).
    node_partitions: int

    def build(self, counters: Any) -> HotStage:
        """The hot stage, counting into ``counters``."""
        cfg = self.settings.stream
        return HotStage(
            self.settings, self.app_id, self.topics, counters,
            window_s=self.settings.detector.window_s, lateness_s=cfg.lateness_s,
            batch_max=cfg.batch_max, batch_within_s=cfg.batch_within_s,
            allocation_retention_s=cfg.allocation_retention_s,
            partition_of=functools.partial(samples_partition, partitions=self.node_partitions),
        )  # fmt: skip


class _Partition:
    """One assigned samples partition: its aggregator and its offsets."""

    def __init__(
        self, aggregator: WindowAggregator, progress: PartitionProgress, hard: HardWatch
    ) -> None:
        self.aggregator = aggregator
        self.progress = progress
        self.hard = hard
        self.dirty = False  # windows closed since the last commit
        self.max_ts_ms: int | None = None  # latest sample time (the silence clock's)
        self.arrival_wall_s = time.time()  # when its latest samples arrived
        #: (newest sample time, receive time) of the last batch read at the head (clocks).
        self.clock_prev: tuple[int, int] | None = None


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
        partition_of: Callable[[str], int] | None = None,
    ) -> None:
        """``partition_of``: the samples partition of a node (the producers' partitioner), so
        the silence watch looks only at the nodes of the assigned partitions (None: none)."""
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
        self.finding_codec = AvroCodec("StragglerFinding")
        self.partition_of = partition_of
        stream = settings.stream
        self.silence = SilenceWatch(
            int(stream.silent_after_s * 1000), int(stream.silent_group_s * 1000),
            stream.silent_fleet_min_nodes, window_s * 1000, settings.detector.id_hex_chars,
            held=True,
        )  # fmt: skip
        self.silence_clock = SilenceClock(max(1, int(stream.silent_check_s * 1000)))
        #: A partition with nothing to read that received nothing for this long (wall s) does
        #: not hold the silence checks back (its nodes are as quiet as the others' say).
        self.quiet_after_s = max(1.0, stream.silent_group_s)
        self._watched: dict[str, tuple[str, int]] = {}
        self._watched_key: tuple[int, frozenset[int]] | None = None
        self.alloc = AllocationTable(self.retention_ms)
        self.parts: dict[int, _Partition] = {}
        #: The network's link rules over the NIC samples (the same object replay feeds).
        #: Link rules only: the job comparison runs where stage 3 is, not here (no readings).
        self.network = NetworkStage(self.alloc, settings.network, settings.detector, readings_ms=0)
        self.nic_codec = AvroCodec("NodeNicSample")
        self._nic: Any = None  # the NIC samples consumer (None: no NIC topic)
        #: NIC partition -> next offset to commit (committed with the samples, after a flush).
        self._nic_offsets: dict[int, int] = {}
        #: Samples partition -> its new closed-until (ms), sent after the batch (_process).
        self._marks: dict[int, int] = {}
        #: (job, window start, end) -> (samples partition -> the windows it closed in this
        #: batch, wall ms when the last of them closed it): one message each, after the batch.
        self._out: dict[tuple[str, int, int], tuple[dict[int, Sequence[Any]], float]] = {}
        self.batch_codec = WindowBatchCodec()
        #: Fleet censuses of the window starts closed in this batch (sent after the batch's
        #: windows, before its heartbeats, on every stage-3 channel).
        self._census: list[dict[str, Any]] = []
        self._heartbeat_due_s = 0.0  # monotonic s of the next heartbeat without closed windows
        self.job_events_seen = self.job_events_bad = 0
        self.last_prune_ms = -(1 << 62)
        self._stop = threading.Event()
        #: The first output that failed to arrive (see _delivered); None while all did.
        self._undelivered: str | None = None
        #: Outputs refused in a batch, to send again alone: (topic, key, value, headers); True
        #: while one is sent alone.
        self._refused: list[tuple[str, Any, Any, list[Any]]] = []
        self._alone = False
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self._jobs: Any = None  # the job-events consumer
        self._lag_due_s = 0.0
        #: Samples behind the head per assigned partition, as last measured (_measure_lag).
        self._lags: dict[int, int] = {}
        self._admin: Any = None
        self._job_tps: list[Any] = []
        self._job_next: dict[int, int] = {}  # job-events partition -> next offset to apply
        self._producer: Any = None
        #: Node clock offsets: sample times against receive times (see clock_offset).
        self.clocks = ClockOffsets()
        self.clock_skew_warn_ms = int(stream.clock_skew_warn_s * 1000)
        self._clocks_due_s = 0.0
        self._clock_warned: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run_or_die, name="peerwatch-hot", daemon=True)
        self._thread.start()

    def stopped(self) -> bool:
        """Whether a stop was asked."""
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Ask :meth:`run` to end after its batch (with its final commit); returns at once."""
        self._stop.set()

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

        loops.warm()  # compiled (or loaded) before the group join, not in the first assignment
        kafka = self.settings.kafka
        self._admin = AdminClient(admin_config(kafka))
        self._producer = Producer(
            producer_config(kafka, **{"linger.ms": 5, "on_delivery": self._delivered})
        )
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
        if self.topics.nic_samples:
            # A group of its own: the NIC state is per node and the allocation view fleet-wide,
            # so the NIC partitions need not match the samples partitions.
            self._nic = Consumer(consumer_config(kafka, f"{self.group}-nic", **{
                "enable.partition.eof": False,
            }))  # fmt: skip
            self._nic.subscribe([self.topics.nic_samples], on_revoke=self._on_nic_revoke)
        try:
            while not self._stop.is_set():
                messages = self._consumer.consume(self.batch_max, timeout=self.batch_within_s)
                if messages:
                    self._sync_job_events()
                    self._process(messages)
                self._process_nic()
                self._measure_lag()
                self._check_silence()
                self._heartbeat_when_idle()
                self._producer.poll(0)
                self._resend_refused()
            self._commit(list(self.parts))
            self._commit_nic()
        finally:
            self._producer.flush(10)
            self._consumer.close()
            self._jobs.close()
            if self._nic is not None:
                self._nic.close()

    def _measure_lag(self) -> None:
        """``counters.consumer_lag``: high watermark - position over the assigned partitions, from
        the consumer's cached watermarks (no broker request), at most once a second."""
        now_s = time.monotonic()
        if now_s < self._lag_due_s or not self.parts:
            return
        self._lag_due_s = now_s + 1.0
        from confluent_kafka import KafkaException, TopicPartition

        tps = [TopicPartition(self.topics.samples, p) for p in sorted(self.parts)]
        try:
            lags: dict[int, int] = {}
            for tp in self._consumer.position(tps):
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                if high >= 0 and tp.offset >= 0:
                    lags[tp.partition] = max(high - tp.offset, 0)
        except KafkaException as exc:
            log.debug("hot stage: lag not measured (%s)", exc)
            return
        self._lags = lags
        self.counters.consumer_lag = sum(lags.values())

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
            hard = HardWatch(self.alloc, agg.name, self.settings.detector)
            self.parts[tp.partition] = _Partition(agg, progress, hard)
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
        self._send_closed()
        if records:
            self.counters.batch_done(records, readings, start_wall, start_cpu)
        dirty = [p for p, part in self.parts.items() if part.dirty]
        if dirty:
            self._commit(dirty)

    def _send_closed(self) -> None:
        """Send what the batch closed: one message per job and window (every partition's
        windows of it), then one heartbeat per stage-3 partition for every source that closed
        windows, after their window batches (same producer, same partition: in order)."""
        for (job_id, start, end), (parts, closed_wall_ms) in self._out.items():
            try:
                values = self.batch_codec.encode_batches(job_id, start, end, parts,
                                                         closed_wall_ms)  # fmt: skip
            except CodecError as exc:  # a value the aggregator should never make: seen, skipped
                self._unencodable(job_id, start, exc)
                continue
            for value in values:  # a big job's window: several messages, whole sources each
                self._send(self.topics.batches, job_id.encode(), value)
        self._out.clear()
        for census in self._census:  # to the channel whose fleet watch judges (one decision)
            value = json.dumps(census).encode()
            self._send(self.topics.batches, b"~census", value, partition=FLEET_CHANNEL)
        self._census.clear()
        if self._marks:
            self._heartbeat()

    def _heartbeat(self) -> None:
        """One JSON ``watermark`` heartbeat to every stage-3 partition: the closed-until of
        every assigned partition, not only those that moved (the fleet watches wait for all of
        them: a restarted stage 3 knows none, and a partition at the end of its input closes
        nothing more), and of those that hold no node (:meth:`_idle_marks`)."""
        for p, part in self.parts.items():
            until = part.aggregator.closed_until_ms
            if until is not None:
                self._marks.setdefault(p, until)
        if not self._marks:
            return
        self._marks.update(self._idle_marks(max(self._marks.values())))
        marks = {str(p): until for p, until in sorted(self._marks.items())}
        mark = json.dumps({"kind": "watermark", "marks": marks}).encode()
        self._marks.clear()
        self._heartbeat_due_s = time.monotonic() + HEARTBEAT_EVERY_S
        for q in range(self.topics.job_partitions):
            self._send(self.topics.batches, b"~watermark", mark, partition=q)

    def _heartbeat_when_idle(self) -> None:
        """A heartbeat every :data:`HEARTBEAT_EVERY_S` without one: input that came in one
        batch, a partition found empty after it, or a stage 3 that forgot its watermarks in a
        rebalance after the last one, must not leave windows waiting for the next input."""
        if time.monotonic() >= self._heartbeat_due_s:
            self._heartbeat_due_s = time.monotonic() + HEARTBEAT_EVERY_S
            self._heartbeat()

    def _idle_marks(self, latest: int) -> dict[int, int]:
        """Heartbeats for assigned samples partitions that hold no node: nothing to read and no
        sample since the assignment (an empty log). They follow the worker's ``latest``
        closed-until, so the fleet watches, which wait for every samples partition, are not
        held back by a partition without nodes (a node that appears there later sends its
        censuses for windows the fleet may have judged already: those are ignored)."""
        empty = [p for p, q in self.parts.items()
                 if q.aggregator.closed_until_ms is None and q.max_ts_ms is None]  # fmt: skip
        if not empty:
            return {}
        caught_up = self._caught_up()
        return {p: latest for p in empty if p in caught_up}

    def _unencodable(self, job_id: str, start: int, exc: Exception) -> None:
        """A window batch that does not fit its schema: counted as refused, logged and
        dead-lettered with the reason (its windows are lost; the job's others are not)."""
        self.counters.outputs_refused += 1
        self.counters.count_deadletter()
        log.error("hot stage: window batch of job %s at %d not encodable: %s", job_id, start, exc)
        dead = dead_letter_headers("unencodable", str(exc), stage=STAGE, topic=self.topics.batches)
        self._send(self.topics.deadletter, job_id.encode()[:DEADLETTER_KEY_MAX_BYTES], b"",
                   headers=dead)  # fmt: skip

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
        self._arrivals(p, part, tables)
        self._clock_leads(p, part, batch, tables)
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
        watermark = agg.watermark_ms
        ready = agg.pop_ready(watermark) if watermark is not None else []
        # Fleet context: this source's census of each window start it closed, on the columns,
        # to the stage-3 channel whose fleet watch merges every source's (one decision).
        cap_frac = self.settings.detector.fleet_cap_frac
        for start, end, seen in censuses_closed(ready, cap_frac):
            self._census.append({"kind": "census", "src": p, "start": start, "end": end,
                                 "census": {n: c.to_json() for n, c in seen.items()}})  # fmt: skip
        for b in agg.group(ready):  # sent after the whole batch, one message per job and window
            key = (b.job_id, b.window_start_ms, b.window_end_ms)
            parts = self._out[key][0] if key in self._out else {}
            parts[p] = b.windows  # the aggregator's lazy windows: encoded from their columns
            self._out[key] = (parts, closed_wall_ms)
        if agg.closed_until_ms is not None and agg.closed_until_ms != closed_before:
            part.progress.closed(agg.closed_until_ms)
            part.dirty = True
            self._marks[p] = agg.closed_until_ms
        # Pruning walks every node's table: once a minute of event time, as replay; by the
        # slowest partition, which may still need the allocations of jobs that ended.
        marks = [q.aggregator.watermark_ms for q in self.parts.values()]
        slowest = min((w for w in marks if w is not None), default=None)
        if slowest is not None and slowest >= self.last_prune_ms + PRUNE_EVERY_MS:
            self.last_prune_ms = slowest  # as replay: once a minute of event time
            self.alloc.prune(slowest)
            for other in self.parts.values():
                other.hard.prune(slowest - self.retention_ms)
            self.network.prune(slowest - self.retention_ms)
        return tables[""].n, tables["gpus."].n

    # -- hard rules on arrival, silence ----------------------------------------------------------
    def _arrivals(self, p: int, part: _Partition, tables: Any) -> None:
        """Hard rules on arrival over one partition's decoded batch; the silence watch's last
        sample time of each node in it, and the partition's for the silence clock."""
        for f in part.hard.add_columns(tables):
            self.counters.hard_findings += 1
            self._publish_finding(f)
        top = tables[""]
        seen = self.silence.saw_columns(
            top.values["node"], top.values["ts_ms"], part.aggregator.names()
        )
        if seen is None:
            return
        top_ms = seen[1]
        part.max_ts_ms = top_ms if part.max_ts_ms is None else max(part.max_ts_ms, top_ms)
        part.arrival_wall_s = time.time()
        self.silence_clock.saw(p, top_ms)

    def _clock_leads(self, p: int, part: _Partition, batch: list[Any], tables: Any) -> None:
        """Feed the clock-offset estimate the kept samples of a batch read live (see
        :meth:`_live`), against the time the batch was received; at most once a second,
        refresh the offsets in the counters and log nodes newly past the warning threshold."""
        received_ms = int(time.time() * 1000)
        top = tables[""]
        ts = top.values["ts_ms"]
        ok = (ts >= 0) & (ts < VALUE_LIMIT)  # the rest is dead-lettered as invalid (counted)
        if ok.any() and self._live(p, part, batch, int(ts[ok].max()), received_ms):
            self.clocks.observe(
                part.aggregator.name, top.values["node"][ok], ts[ok],
                np.full(int(ok.sum()), received_ms, np.int64),
            )  # fmt: skip
        now = time.monotonic()
        if now < self._clocks_due_s:
            return
        self._clocks_due_s = now + 1.0
        offsets = self.clocks.offsets_ms()
        warn = self.clock_skew_warn_ms
        skewed = {n: v for n, v in offsets.items() if abs(v) >= warn}
        new = sorted(skewed.keys() - self._clock_warned)
        for node in new[:CLOCK_WARNINGS_AT_ONCE]:
            log.warning("node %s: its clock runs %+.1f s from the fleet's median clock",
                        node, skewed[node] / 1000.0)  # fmt: skip
        if len(new) > CLOCK_WARNINGS_AT_ONCE:
            log.warning("... and %d more nodes 1 s or more off the fleet's clock "
                        "(peerwatch_node_clock_offset_seconds)", len(new) - CLOCK_WARNINGS_AT_ONCE)  # fmt: skip
        self._clock_warned = set(skewed) | {
            n for n in self._clock_warned if abs(offsets.get(n, 0)) >= warn // 2
        }
        self.counters.clock_offsets_ms = offsets
        self.counters.clock_skewed_nodes = len(skewed)

    def _live(self, p: int, part: _Partition, batch: list[Any], top_ms: int, received_ms: int
              ) -> bool:  # fmt: skip
        """Whether partition ``p`` is read live: it was at most one batch length behind its head
        when its lag was last measured (:meth:`_measure_lag`, once a second; asking librdkafka
        on every batch stalled the worker), and its newest sample time moved on from the
        previous such batch's by no more than the wall time between them (plus a tick's slack).
        A backlog, or input published faster than real time (a catch-up, a benchmark), says
        nothing of the nodes' clocks through its receive times."""
        lag = self._lags.get(p)
        if lag is None or lag > len(batch):
            part.clock_prev = None
            return False
        prev, part.clock_prev = part.clock_prev, (top_ms, received_ms)
        return prev is not None and top_ms - prev[0] <= received_ms - prev[1] + LIVE_SLACK_MS

    # -- the network ------------------------------------------------------------------------------
    def _process_nic(self) -> None:
        """The NIC samples that arrived (none waited for): decoded, undecodable ones
        dead-lettered, the rest through :class:`NetworkStage` (allocations synced first), its
        findings published as the hard rules' are."""
        if self._nic is None:
            return
        messages = self._nic.consume(self.batch_max, timeout=0)
        samples = []
        for m in messages:
            if m.error() is not None:
                log.warning("hot stage NIC consume error: %s", m.error())
                continue
            self._nic_offsets[m.partition()] = m.offset() + 1
            try:
                samples.append(self.nic_codec.decode(m.value() or b""))
            except CodecError as exc:
                self._dead(m, "undecodable", str(exc))
        if not samples:
            return
        self._sync_job_events()
        for f in self.network.add_nic(samples):
            self.counters.hard_findings += 1
            self._publish_finding(f)
        if not self.parts:  # no samples partition: no samples commit to ride on
            self._commit_nic()

    def _commit_nic(self) -> None:
        """Commit the NIC offsets read (after a flush: their findings are out first)."""
        if self._nic is None or not self._nic_offsets:
            return
        from confluent_kafka import KafkaException, TopicPartition

        if self._producer.flush(30) or self._undelivered is not None:
            return  # not all out: read again after a restart
        offsets = [TopicPartition(self.topics.nic_samples, p, o)
                   for p, o in sorted(self._nic_offsets.items())]  # fmt: skip
        self._nic_offsets = {}
        try:
            self._nic.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("hot stage NIC commit failed (will retry): %s", exc)

    def _on_nic_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self._commit_nic()
        for tp in partitions:
            self._nic_offsets.pop(tp.partition, None)

    def _publish_finding(self, f: Any) -> None:
        self._send(self.topics.findings, str(f["job_id"]).encode(), self.finding_codec.encode(f))
        if f.get("node") is not None:
            self._send(self.topics.node_findings, str(f["node"]).encode(), json.dumps(f).encode())

    def silence_due(self, wall_s: float | None = None) -> list[int]:
        """The silence checks due now (:class:`~peerwatch.streams.core.silence.SilenceClock`):
        every check time that all assigned partitions reached, as replay has it. A partition
        with nothing to read that received nothing since the assignment, or for
        :attr:`quiet_after_s`, does not hold them back (it holds no node, or its nodes
        stopped). When all are so quiet, event time is the latest sample of any, moved on by
        the wall clock where the samples came in real time: a fleet gone quiet is still seen
        (the one rule a replay cannot follow)."""
        wall = time.time() if wall_s is None else wall_s
        # quiet candidates: no sample since the assignment (an empty partition holds no
        # node), or none for quiet_after_s; they hold nothing back once caught up
        busy = [p for p, q in self.parts.items()
                if q.max_ts_ms is not None and wall - q.arrival_wall_s < self.quiet_after_s]  # fmt: skip
        quiet = [p for p in self.parts if p not in busy]
        if quiet:
            caught_up = self._caught_up()
            busy += [p for p in quiet if p not in caught_up]
        if busy:
            return self.silence_clock.due(busy)
        # Every partition read to its end and quiet: the fleet's event time is the latest
        # sample (the stopped nodes are as quiet as the others say), moved on by the wall
        # clock where the samples came in real time.
        after_ms = self.silence.silent_after_ms
        clocks = [q.max_ts_ms + (int((wall - q.arrival_wall_s) * 1000)
                                 if q.max_ts_ms >= q.arrival_wall_s * 1000 - after_ms else 0)
                  for q in self.parts.values() if q.max_ts_ms is not None]  # fmt: skip
        return self.silence_clock.due(now_ms=max(clocks)) if clocks else []

    def _caught_up(self) -> set[int]:
        """Assigned samples partitions with nothing left to read (local: the consumer's
        position against the high watermark librdkafka caches from its fetches)."""
        from confluent_kafka import KafkaException, TopicPartition

        out: set[int] = set()
        try:
            tps = [TopicPartition(self.topics.samples, p) for p in self.parts]
            for tp in self._consumer.position(tps):
                marks = self._consumer.get_watermark_offsets(tp, cached=True)
                if not marks:
                    continue
                low, high = marks
                if high >= 0 and (tp.offset >= high or (tp.offset < 0 and high == low)):
                    out.add(tp.partition)
        except KafkaException as exc:  # not known yet: no partition counts as caught up
            log.debug("hot stage: positions unavailable (%s)", exc)
        return out

    def _check_silence(self) -> None:
        """The silence checks due (:meth:`silence_due`), each at its own event time."""
        if self.partition_of is None or not self.parts:
            return
        for now in self.silence_due():
            key = (self.alloc.generation, frozenset(self.parts))
            if key != self._watched_key:
                self._watched_key = key
                part_of, open_nodes = self.partition_of, self.alloc.open_nodes()
                self._watched = {n: v for n, v in open_nodes.items() if part_of(n) in self.parts}
            for f in self.silence.check(self._watched, now):
                self.counters.silence_findings += 1
                self._publish_finding(f)

    def _send(self, topic: str, key: bytes | None, value: bytes, **kw: Any) -> None:
        from confluent_kafka import KafkaError, KafkaException

        while True:
            try:
                self._producer.produce(topic, value, key, **kw)
                return
            except BufferError:  # local queue full: let deliveries drain
                self._producer.poll(0.2)
            except KafkaException as exc:  # larger than message.max.bytes: that record only
                err = exc.args[0] if exc.args else None
                if not isinstance(err, KafkaError) or err.code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise
                if topic == self.topics.deadletter:  # an input's: sent without its bytes
                    log.error("hot stage: a dead letter of %d bytes refused (%s); sent without "
                              "its value", len(value) + len(key or b""), err.str())  # fmt: skip
                    if value or len(key or b"") > DEADLETTER_KEY_MAX_BYTES:
                        short_key, sizes = without_payload(key, value)
                        headers = [*(kw.get("headers") or []), *sizes]
                        self._send(topic, short_key, b"", headers=headers)
                    return
                self.counters.count_deadletter()
                log.error("hot stage: a %d-byte record for %s refused (%s); dead-lettered",
                          len(value), topic, err.str())  # fmt: skip
                headers = dead_letter_headers("too large", err.str(), stage=STAGE, topic=topic,
                                              size=len(value))  # fmt: skip
                self._send(self.topics.deadletter, key, b"", headers=headers)
                return

    def _delivered(self, err: Any, msg: Any) -> None:
        """Delivery report of one output (on this thread, from poll/flush).

        The broker refuses a whole produce batch for one record over the topic's
        ``max.message.bytes``, so a refused record is first sent again on its own
        (:meth:`_resend_refused`); refused alone, it is dead-lettered and counted. Any other
        failure (e.g. timed out through a long outage) is remembered, and the next commit stops
        the stage instead of committing past an output that never arrived (the worker exits, and
        its restart redoes the windows from the last committed point)."""
        from confluent_kafka import KafkaError

        if err is None:
            return
        topic = str(msg.topic())
        permanent = err.code() in (
            KafkaError.MSG_SIZE_TOO_LARGE,
            KafkaError.INVALID_RECORD,
            KafkaError.RECORD_LIST_TOO_LARGE,
        )
        if permanent and topic != self.topics.deadletter:
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
            self._send(self.topics.deadletter, msg.key(), b"", headers=dead)
            return
        self.counters.outputs_failed += 1
        log.error("hot stage: an output to %s was not delivered (%s)", topic, err.str())
        if self._undelivered is None:
            self._undelivered = f"{topic}: {err.str()}"

    def _resend_refused(self) -> None:
        """Send each refused record again alone: everything in flight is delivered first, then
        each is sent and flushed by itself, so the broker's verdict on it is final (see
        :meth:`_delivered`)."""
        if not self._refused:
            return
        self._producer.flush(30)
        while self._refused:
            topic, key, value, headers = self._refused.pop(0)
            self._alone = True
            try:
                self._send(topic, key, value, headers=headers)
                self._producer.flush(30)
            finally:
                self._alone = False

    def _dead(self, m: Any, reason: str, detail: str) -> None:
        if reason != "late":  # late samples have their own counter
            self.counters.count_deadletter()
        headers = dead_letter_headers(reason, detail, stage=STAGE, topic=str(m.topic()),
                                      partition=m.partition(), offset=m.offset())  # fmt: skip
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
        self._resend_refused()
        if self._undelivered is not None:
            raise ServiceError(
                f"hot stage: an output was not delivered ({self._undelivered}); stopping "
                "without committing past it"
            )
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
        self._commit_nic()
