"""The live runner of stage 2: a confluent-kafka consumer in its own thread of the faust worker.

Faust hands every Kafka record through its per-event machinery (aiokafka's Python fetch
parser, events, channels, acks): profiled, that cost more than decoding and aggregating the
record. The hot stage therefore reads the samples itself, with librdkafka (fetching and lz4
run in C, off the GIL), in batches of up to ``batch_max`` records, decodes each partition's
batch straight into columns (:class:`~peerwatch.schemas.columns.MessageColumns`: the C decoder
for the current schema version) and hands them to the pure
:class:`~peerwatch.streams.core.sample_stage.SampleStage`, the same object replay runs (one
source per samples partition). It decides nothing itself: the stage owns the allocation view,
the windows, the hard, silence and link watches, the censuses and every cadence. This runner
owns the Kafka side only:

* the source: the samples consumer (partitions assigned as sources), the job events
  (:mod:`~peerwatch.streams.live.job_event_sync`, applied before each batch) and the NIC
  samples (:mod:`~peerwatch.streams.live.nic_join`: joined in event time, each partition's
  batch stepped in the parts the in-process runner cuts);
* the clock: event time, as replay; when every assigned partition is quiet, the wall clock
  moves the silence checks on (:meth:`HotStage.silence_due`, the one rule a replay cannot
  follow);
* the channel to stage 3: :mod:`~peerwatch.streams.live.closed_output` (window batches,
  censuses, heartbeats), findings made on arrival published at once (Avro on the public
  findings topic, key job; JSON on the internal ``<id>-findings`` topic, key node, for the
  policy);
* delivery and dead letters (:mod:`~peerwatch.streams.live.delivery`: undecodable, late and
  invalid samples with their bytes), and commits: see
  :mod:`peerwatch.streams.live.hot_progress` (commit at the oldest open window, so a crash loses
  no open window and duplicates no emitted one), after a flush, so every output of the
  committed input is acknowledged first.

If this thread fails, the worker is stopped (SIGTERM to itself): a worker that no longer reads
samples must not look healthy.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from peerwatch.kafka_config import consumer_config, producer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.schemas.columns import MessageColumns, select_rows, slice_rows
from peerwatch.settings import Settings
from peerwatch.streams.core import loops
from peerwatch.streams.core.sample_stage import SampleStage
from peerwatch.streams.core.topology import live_topology
from peerwatch.streams.core.windows import SAMPLE_SPEC
from peerwatch.streams.live.closed_output import ClosedOutput
from peerwatch.streams.live.delivery import OutputDelivery
from peerwatch.streams.live.hot_clocks import HotClocks
from peerwatch.streams.live.hot_partitions import Partition, Partitions
from peerwatch.streams.live.hot_spec import HotTopics
from peerwatch.streams.live.job_event_sync import JobEventSync
from peerwatch.streams.live.nic_input import NicInput
from peerwatch.streams.live.nic_join import NicJoin

log = logging.getLogger(__name__)


def _admin_client(settings: Settings) -> Any:
    """An admin client of the worker's Kafka settings."""
    from confluent_kafka.admin import AdminClient

    from peerwatch.kafka_config import admin_config

    return AdminClient(admin_config(settings.kafka))


#: A step of the hot stage's stop that takes longer than this is logged (s): a worker whose
#: hot stage stops slowly is killed (:class:`~.hot_process.HotProcess`), and its partitions then
#: wait for the group's session timeout.
SLOW_STOP_STEP_S = 5.0


@contextlib.contextmanager
def _slow_step(what: str) -> Iterator[None]:
    """Log ``what`` when it takes longer than :data:`SLOW_STOP_STEP_S`."""
    started = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - started
        if took > SLOW_STOP_STEP_S:
            log.warning("hot stage stop: %s took %.1f s", what, took)


class HotStage:
    """The hot stage of one worker; :meth:`start` runs it in a daemon thread."""

    def __init__(
        self,
        settings: Settings,
        app_id: str,
        topics: HotTopics,
        counters: Any,
        *,
        partition_of: Callable[[str], int] | None = None,
    ) -> None:
        """``partition_of``: the samples partition of a node (the producers' partitioner), so
        the silence watch looks only at the nodes of the assigned partitions (None: none)."""
        stream = settings.stream
        self.settings = settings
        self.group = f"{app_id}-hot"
        self.topics = topics
        self.counters = counters
        self.batch_max, self.batch_within_s = stream.batch_max, stream.batch_within_s
        #: Stage 2 (with the network: link rules on arrival, each job's ports per closed window
        #: for stage 3, the leaf-switch grouping over the nodes of this worker's NIC partitions).
        self.stage = SampleStage(settings, partition_of=partition_of,
                                 topology=live_topology(settings.network.topology))  # fmt: skip
        self.columns = MessageColumns("NodeGpuSample", SAMPLE_SPEC)
        self.finding_codec = AvroCodec("StragglerFinding")
        #: A partition with nothing to read that received nothing for this long (wall s) does
        #: not hold the silence checks back (its nodes are as quiet as the others say).
        self.quiet_after_s = max(1.0, stream.silent_group_s)
        self._stop = threading.Event()
        self.delivery = OutputDelivery(topics.deadletter, counters)
        self.parts = Partitions(topics.samples, settings.detector.window_ms, self.delivery,
                                admin=functools.partial(_admin_client, settings))  # fmt: skip
        self.output = ClosedOutput(self.delivery, topics.batches, topics.job_partitions)
        self.jobs = JobEventSync(settings.kafka, topics.job_events, self.group,
                                 self.stage.apply_job_event, self._stop)  # fmt: skip
        #: the NIC samples, joined with the samples in event time (None: no NIC topic)
        self.nic: NicJoin | None = None
        if topics.nic_samples:
            nic = NicInput(settings.kafka, topics.nic_samples, self.group, self.delivery)
            self.nic = NicJoin(nic, self.parts, self._add_nic, counters,
                               int(stream.lateness_s * 1000), stream.batch_max)  # fmt: skip
            self.parts.after_commit = nic.commit
        self.clocks = HotClocks(counters, int(stream.clock_skew_warn_s * 1000))
        self._thread: threading.Thread | None = None
        self._consumer: Any = None

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
        from confluent_kafka import Consumer, Producer

        loops.warm()  # compiled (or loaded) before the group join, not in the first assignment
        kafka = self.settings.kafka
        self.delivery.producer = Producer(
            producer_config(kafka, **{"linger.ms": 5, "on_delivery": self.delivery.delivered})
        )
        self.jobs.start()
        self._consumer = self.parts.consumer = Consumer(consumer_config(kafka, self.group, **{
            "partition.assignment.strategy": "range",
            "enable.partition.eof": False,
        }))  # fmt: skip
        self._consumer.subscribe([self.topics.samples], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)  # fmt: skip
        if self.nic is not None:
            self.nic.start()
        try:
            while not self._stop.is_set():
                messages = self._consumer.consume(self.batch_max, timeout=self.batch_within_s)
                if messages:  # the NIC samples up to their time first (take)
                    self.jobs.sync()
                    self._process(messages)
                elif self.nic is not None:
                    self.nic.idle()
                self.clocks.measure_lag(self._consumer, self.topics.samples, self.parts)
                self._check_silence()
                self.output.heartbeat_when_idle(self._closed_until(), self._idle_marks)
                self.delivery.producer.poll(0)
                self.delivery.resend_refused()
            with _slow_step("final commit"):
                self.parts.commit(list(self.parts))
                if self.nic is not None:
                    self.nic.nic.commit()
        finally:
            with _slow_step("flush"):
                self.delivery.producer.flush(10)
            with _slow_step("samples consumer close (leaves its group)"):
                self._consumer.close()
            with _slow_step("job-events consumer close"):
                self.jobs.close()
            if self.nic is not None:
                with _slow_step("NIC consumer close (leaves its group)"):
                    self.nic.nic.close()

    # -- assignment ----------------------------------------------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        for p, closed_until_ms in self.parts.assign(consumer, partitions).items():
            self.stage.open_source(p, closed_until_ms)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.parts.commit([tp.partition for tp in partitions])
        self._on_lost(consumer, partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        for p in self.parts.drop(partitions):  # not ours any more (lost: no commit)
            self.stage.close_source(p)
            self.clocks.forget(p)
            if self.nic is not None:
                self.nic.forget(p)

    # -- the source ----------------------------------------------------------------------------
    def _process(self, messages: list[Any]) -> None:
        """One consumed batch through stage 2 and its outputs sent (:meth:`take`), then the
        partitions that closed windows committed."""
        self.take(messages)
        self.parts.commit_dirty()

    def take(self, messages: list[Any]) -> None:
        """One consumed batch: each assigned partition's messages through :meth:`_step`, then
        what they closed sent on to stage 3."""
        start_wall, start_cpu = time.time(), time.process_time()
        by_partition: dict[int, list[Any]] = {}
        for m in messages:
            if m.error() is not None:
                log.warning("hot stage consume error: %s", m.error())
                continue
            if m.partition() in self.parts:  # else revoked within this batch
                by_partition.setdefault(m.partition(), []).append(m)
        for p in by_partition:
            self.parts.parts[p].arrived()
        decoded = [(p, batch, *self._decode(p, self.parts.parts[p], batch))
                   for p, batch in sorted(by_partition.items())]  # fmt: skip
        if self.nic is not None:  # NIC samples read up to the batch's times (nic_join)
            self.nic.before_batch([(p, tables) for p, _, tables, _ in decoded])
        records = readings = 0
        for p, batch, tables, rows in decoded:
            n_records, n_readings = self._step_parts(p, self.parts.parts[p], batch, tables, rows)
            records += n_records
            readings += n_readings
        self.output.send(self._closed_until(), self._idle_marks)
        if records:
            self.counters.batch_done(records, readings, start_wall, start_cpu)

    def _decode(self, p: int, part: Partition, batch: list[Any]) -> tuple[Any, np.ndarray]:
        """One partition's messages as columns (those handled before a restart skipped, the
        undecodable dead-lettered); returns (tables, message index of each row)."""
        agg = self.stage.aggregator(p)
        tables, rows, bad = self.columns.decode([m.value() or b"" for m in batch], agg.strings)
        reasons = dict(bad)
        ts = tables[""].values["ts_ms"].tolist()
        keep = np.ones(len(rows), np.bool_)
        row = 0
        for i, m in enumerate(batch):  # in offset order, as the progress wants them
            if i in reasons:
                part.progress.skip(m.offset())
                self.delivery.dead(m, "undecodable", reasons[i])
                continue
            if part.progress.already_handled(m.offset(), ts[row]):
                part.progress.skip(m.offset())
                keep[row] = False
            else:
                part.progress.read(m.offset(), ts[row])
            row += 1
        if not keep.all():
            tables, rows = select_rows(tables, keep), rows[keep]
        return tables, rows

    def _step_parts(
        self, p: int, part: Partition, batch: list[Any], tables: Any, rows: np.ndarray
    ) -> tuple[int, int]:
        """Step stage 2 with one partition's decoded samples in the parts the in-process runner
        cuts (each ends with the first sample at or past the stage's next close), each after
        the NIC readings of its partition up to its newest time: the windows a part closes are
        summarised from the NIC readings the in-process runner has at that point (one step
        over a backlog batch spanning many windows gave the first of them readings from far
        past their end, which stage 2 had dropped by then). Returns (samples, GPU readings)."""
        # the node clocks from the whole batch, once (its receive time is the batch's)
        self.clocks.observe(p, len(batch), tables, self.stage.aggregator(p).name)
        n = tables[""].n
        ts = tables[""].values["ts_ms"]
        records = readings = start = 0
        while start < n:
            hits = np.flatnonzero(ts[start:] >= self.stage.next_close_ms(p))
            end = n if not hits.size else start + int(hits[0]) + 1
            piece = tables if start == 0 and end == n else slice_rows(tables, start, end)
            if self.nic is not None:
                self.nic.before_part(p, piece)
            n_records, n_readings = self._step(p, part, batch, piece, rows[start:end])
            records += n_records
            readings += n_readings
            start = end
        return records, readings

    def _step(
        self, p: int, part: Partition, batch: list[Any], tables: Any, rows: np.ndarray
    ) -> tuple[int, int]:
        """Step stage 2 with one partition's decoded samples (:meth:`_decode`); returns
        (samples, GPU readings) taken."""
        agg = self.stage.aggregator(p)
        unattributed_before = agg.unattributed
        closed_before = agg.closed_until_ms
        result = self.stage.step(tables, p)
        closed_wall_ms = time.time() * 1000.0
        self.counters.unattributed += agg.unattributed - unattributed_before
        for f in (*result.hard, *result.switches):  # switch findings name no node
            self.counters.hard_findings += 1
            self._publish_finding(f)
        part.heard(result.newest_ms)
        for r in result.late.tolist():
            self.counters.late += 1
            self.delivery.dead(batch[rows[r]], "late", "sample for a window already closed")
        for r in result.invalid.tolist():
            self.delivery.dead(batch[rows[r]], "invalid", "sample time outside [0, 2**53) ms")
        self.output.add(p, result.closed, result.censuses, result.ports, closed_wall_ms)
        if agg.closed_until_ms is not None and agg.closed_until_ms != closed_before:
            part.progress.closed(agg.closed_until_ms)
            part.dirty = True
            self.output.marks[p] = agg.closed_until_ms
        return tables[""].n, tables["gpus."].n

    def _add_nic(self, samples: list[Any]) -> None:
        """NIC samples into stage 2's link rules (allocations synced first), their findings
        published as the hard rules' are."""
        self.jobs.sync()
        for f in self.stage.add_nic(samples):
            self.counters.hard_findings += 1
            self._publish_finding(f)

    def _closed_until(self) -> dict[int, int | None]:
        return {p: self.stage.aggregator(p).closed_until_ms for p in self.parts}

    def _idle_marks(self, latest: int) -> dict[int, int]:
        return self.parts.idle_marks(latest, self._closed_until())

    # -- the clock: silence checks -------------------------------------------------------------
    def silence_due(self, wall_s: float | None = None) -> list[int]:
        """The silence checks due now (:meth:`SampleStage.silence_due`): every check time that
        all assigned partitions reached, as replay has it, or the event time of a worker whose
        partitions are all quiet (:meth:`Partitions.event_clock`)."""
        wall = time.time() if wall_s is None else wall_s
        busy, now_ms = self.parts.event_clock(
            wall, self.quiet_after_s, self.stage.silence.silent_after_ms
        )
        if busy:
            return self.stage.silence_due(busy)
        return [] if now_ms is None else self.stage.silence_due(now_ms=now_ms)

    def _check_silence(self) -> None:
        """The silence checks due (:meth:`silence_due`), each at its own event time."""
        if self.stage.partition_of is None or not self.parts:
            return
        for now in self.silence_due():
            for f in self.stage.check_silence(now):
                self.counters.silence_findings += 1
                self._publish_finding(f)

    # -- the channel: findings ----------------------------------------------------------
    def _publish_finding(self, f: Any) -> None:
        send = self.delivery.send
        send(self.topics.findings, str(f["job_id"]).encode(), self.finding_codec.encode(f))
        if f.get("node") is not None:
            send(self.topics.node_findings, str(f["node"]).encode(), json.dumps(f).encode())
