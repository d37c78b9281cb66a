"""The edges of ``peerwatch bench stream`` (also used by the stream integration tests): pre-produce
a simulated fleet into a real broker, run ``peerwatch stream`` workers as subprocesses, read
output topics back, and the floor (a plain consume + decode loop). The arithmetic is in
:mod:`peerwatch.streams.tools.bench`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peerwatch.kafka_config import consumer_config, producer_config
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.schemas.codec import AvroCodec, decode_any
from peerwatch.settings import KafkaSettings
from peerwatch.streams.tools.bench import FloorResult, ProcSnapshot, read_proc_tree
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import JOB_EVENTS, RECOMMENDATIONS, SAMPLES, catalogue

#: (topic, key, value, timestamp ms or None): one record to publish as it is.
Raw = tuple[str, bytes | None, bytes, int | None]


@dataclass(frozen=True)
class TopicRecord:
    """One record read back: key and value bytes, headers, partition, offset, create time (ms)."""

    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    partition: int
    offset: int
    ts_ms: int


def _headers(raw: Any) -> dict[str, bytes]:
    return {str(k): bytes(v or b"") for k, v in (raw or [])}


class _ConfluentSink:
    """``BytesSink`` over a confluent-kafka Producer (the publisher's record sink)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        from confluent_kafka import Producer

        self.failed = 0
        self.producer = Producer(producer_config(kafka, **{"linger.ms": 50}))

    def _on_delivery(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed += 1

    def send(
        self, topic: str, key: bytes | None, value: bytes, headers: tuple[()] = (), ts_ms: int = 0
    ) -> None:
        while True:
            try:
                self.producer.produce(
                    topic, value, key, timestamp=ts_ms, on_delivery=self._on_delivery
                )
                return
            except BufferError:  # local queue full: let deliveries drain
                self.producer.poll(0.5)

    def flush(self, timeout_s: float = 120.0) -> None:
        left = self.producer.flush(timeout_s)
        if left or self.failed:
            raise RuntimeError(f"{left} records not flushed, {self.failed} failed")


def produce_raw(kafka: KafkaSettings, records: Sequence[Raw]) -> None:
    """Publish ``(topic, key, value, timestamp_ms or None)`` records as they are (test input).

    A job event is at the broker before any record after it is sent (flushed), as the Slurm
    prolog's is before the job's GPUs are used: otherwise one producer's batching (a lone job
    event waits out ``linger.ms`` while the samples' batches fill and go) puts a job's first
    samples on the broker before its start, and the hot stage, which applies the job events
    appended before each batch, counts them idle where a replay in event order does not."""
    sink = _ConfluentSink(kafka)
    for topic, key, value, ts_ms in records:
        sink.send(topic, key, value, (), ts_ms or 0)
        if topic.endswith(JOB_EVENTS.name):
            sink.flush()
    sink.flush()


def read_topic(kafka: KafkaSettings, topic: str, timeout_s: float = 30.0) -> list[TopicRecord]:
    """Every record of ``topic`` up to its current end (the high watermarks when called), in
    partition and offset order; [] if the topic does not exist. Raises TimeoutError if the end
    is not reached within ``timeout_s``."""
    from confluent_kafka import Consumer

    from peerwatch.io.topic_reader import TopicRange, read_to_end

    consumer = Consumer(consumer_config(kafka, f"read-{time.time_ns()}"))
    try:
        out = [
            TopicRecord(
                key if isinstance(key := m.key(), bytes) else None,
                bytes(m.value() or b""),
                _headers(m.headers()),
                int(m.partition() or 0),
                int(m.offset() or 0),
                int(m.timestamp()[1]),
            )
            for m in read_to_end(
                consumer, [TopicRange(topic)], idle_timeout_s=timeout_s, deadline_s=timeout_s
            )
        ]
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def wait_stable(
    poll: Callable[[], Any],
    done: Callable[[Any], bool],
    timeout_s: float,
    settle_s: float = 6.0,
    interval_s: float = 1.0,
) -> Any:
    """Call ``poll`` until ``done(result)`` holds and the result stayed equal for ``settle_s``,
    or until ``timeout_s``; returns the last result either way (callers assert on it)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    since = time.monotonic()
    while True:
        result = poll()
        if result != last:
            last, since = result, time.monotonic()
        elif done(result) and time.monotonic() - since >= settle_s:
            return result
        if time.monotonic() > deadline:
            return result
        time.sleep(interval_s)


#: ``peerwatch stream`` without the rest of the CLI (so a worker never depends on other commands).
_STREAM_MAIN = (
    "import argparse, logging, sys\n"
    "from peerwatch.commands import stream\n"
    "parser = argparse.ArgumentParser(prog='peerwatch')\n"
    "stream.register(parser.add_subparsers(required=True))\n"
    "args = parser.parse_args()\n"
    "logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(name)s: %(message)s')\n"
    "sys.exit(args.func(args))\n"
)


@dataclass
class WorkerProcess:
    """One ``peerwatch stream`` worker as a subprocess (its own process group, so a kill takes
    every child). Use as a context manager: leaving it always kills the worker."""

    bootstrap: str
    topic_prefix: str
    app_id: str
    workdir: Path
    name: str = "worker"
    args: Sequence[str] = ()
    counters_interval_s: float = 1.0
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def counters_path(self) -> Path:
        return self.workdir / f"{self.name}.counters.json"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def start(self) -> WorkerProcess:
        """Start the worker (returns at once; it needs seconds to join its group)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.counters_path.unlink(missing_ok=True)
        env = {
            **os.environ,
            "PEERWATCH_KAFKA_BOOTSTRAP": self.bootstrap,
            "PEERWATCH_TOPIC_PREFIX": self.topic_prefix,
            **self.env,
        }
        cmd = [
            sys.executable, "-c", _STREAM_MAIN, "stream", "--app-id", self.app_id,
            "--counters-file", str(self.counters_path),
            "--counters-interval-s", str(self.counters_interval_s), *self.args,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("worker not started")
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def counters(self) -> dict[str, Any]:
        """The worker's last counters file ({} before the first write)."""
        try:
            data: dict[str, Any] = json.loads(self.counters_path.read_text())
        except (OSError, ValueError):
            return {}
        return data

    def proc_snapshot(self) -> ProcSnapshot:
        """CPU seconds and peak RSS of the running worker and its hot process, from /proc.
        Raises OSError if gone."""
        return read_proc_tree(self.pid)

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (no clean shutdown, no final commit)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.kill()


def measure_floor(
    kafka: KafkaSettings,
    topic: str,
    expected: int,
    timeout_s: float = 600.0,
    *,
    gpus_per_record: int | None = None,
) -> FloorResult:
    """Consume ``expected`` records of ``topic`` from the start with a plain confluent Consumer
    and decode each body with fastavro (the issue's floor: consume + fastavro decode); wall and
    CPU time from the first record to the last. With ``gpus_per_record`` nothing is decoded:
    the *raw consume limit* (what librdkafka alone costs for these records; GPU samples counted
    as that many per record). Raises TimeoutError if fewer arrive within ``timeout_s``."""
    import io

    from confluent_kafka import Consumer, TopicPartition
    from fastavro import schemaless_reader

    from peerwatch.schemas.codec import HEADER_LEN
    from peerwatch.schemas.registry import current_schema

    schema = current_schema("NodeGpuSample")

    def gpus_of(value: bytes) -> int:
        if gpus_per_record is not None:
            return gpus_per_record
        record: Any = schemaless_reader(io.BytesIO(value[HEADER_LEN:]), schema, None)
        return len(record["gpus"])

    consumer = Consumer(consumer_config(kafka, f"floor-{time.time_ns()}"))
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        records = gpus = 0
        deadline = time.monotonic() + timeout_s
        t0 = c0 = 0.0
        while records < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"floor: {records} of {expected} records in {timeout_s} s")
            batch = consumer.consume(1000, timeout=1.0)
            if batch and not records:
                t0, c0 = time.perf_counter(), time.process_time()
            for m in batch:
                if m.error() is not None:
                    continue
                gpus += gpus_of(m.value() or b"")
                records += 1
        return FloorResult(records, gpus, time.perf_counter() - t0, time.process_time() - c0)
    finally:
        consumer.close()


def bench_fleet(
    nodes: int,
    gpus_per_node: int,
    duration_s: float,
    seed: int = 1,
    paced_s: float = 0.0,
    start_ms: int | None = None,
) -> Fleet:
    """A busy fleet stamped in the recent past: jobs of up to 512 GPUs side by side, each with
    an 8% SM-clock drop on one GPU from 60 s (so the benchmark sees findings and latencies).
    ``paced_s`` more seconds follow, with a second drop on another GPU 5 s into them (findings
    for the paced phase, see :func:`run_worker_over`), and hard faults on other nodes, one
    every :data:`HARD_EVERY_S` seconds from 10 s into them (see :func:`paced_hard_faults`).
    ``start_ms``: the first tick's time (default: so that the whole fleet lies in the past)."""
    from peerwatch.producers.sim.scenario import parse_scenario

    total_s = duration_s + paced_s
    now_ms = int(time.time() * 1000) - int(total_s * 1000) - 60_000
    per_job = max(1, 512 // gpus_per_node)
    jobs, faults = [], []
    for j, first in enumerate(range(0, nodes, per_job)):
        count = min(per_job, nodes - first)
        jobs.append({"job_id": f"{9000 + j}", "gpus": count * gpus_per_node, "first_node": first,
                     "warmup_s": 0, "duration_s": total_s + 3600})  # fmt: skip
        if count * gpus_per_node >= 16 and duration_s > 90:
            faults.append({"name": "sm_clock_drop", "node": first + count // 2, "gpu_index": 0,
                           "start_s": 60, "params": {"pct": 8}})  # fmt: skip
        if count * gpus_per_node >= 16 and paced_s >= 60:
            faults.append({"name": "sm_clock_drop", "node": first, "gpu_index": 1,
                           "start_s": duration_s + 5, "params": {"pct": 8}})  # fmt: skip
    if paced_s >= 20:
        taken = {f["node"] for f in faults}
        free = [n for n in range(nodes) if n not in taken]
        for i, at_s in enumerate(range(10, int(paced_s) - 5, HARD_EVERY_S)):
            if i >= len(free):
                break
            name, params = HARD_KINDS[i % len(HARD_KINDS)]
            faults.append({"name": name, "node": free[i], "gpu_index": 2 % gpus_per_node,
                           "start_s": duration_s + at_s, "params": dict(params)})  # fmt: skip
    doc = {
        "fleet": {"nodes": nodes, "gpus_per_node": gpus_per_node, "interval_s": 1.0,
                  "duration_s": total_s, "seed": seed,
                  "start_ms": now_ms - now_ms % 30_000 if start_ms is None else start_ms},
        "jobs": jobs,
        "faults": faults,
    }  # fmt: skip
    return Fleet(parse_scenario(doc))


#: Hard faults of the paced phase (none fails its job: the input stays the same size).
HARD_KINDS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("xid", {"xid": 48}), ("xid", {"xid": 94}), ("pcie_downtrain", {"width": 8}),
    ("xid", {"xid": 63}), ("nvlink_error_storm", {}), ("xid", {"xid": 64}),
    ("xid", {"xid": 95}), ("xid", {"xid": 74}),
)  # fmt: skip
#: One hard fault every this many seconds of the paced phase.
HARD_EVERY_S = 2


def paced_hard_faults(fleet: Fleet) -> list[tuple[str, int]]:
    """(node, first tick showing it, epoch ms) of every hard fault of the fleet's scenario."""
    spec = fleet.spec
    out = []
    for inj in fleet.scenario.faults:
        if inj.name in ("xid", "pcie_downtrain", "nvlink_error_storm") and inj.node is not None:
            onset_ms = round(inj.start_s * 1000)
            tick_ms = -(-onset_ms // spec.interval_ms) * spec.interval_ms
            out.append((spec.node_name(inj.node), spec.start_ms + tick_ms))
    return out


def hard_latencies(
    faults: Sequence[tuple[str, int]],
    published_ms: dict[int, float],
    recommendations: Sequence[tuple[dict[str, Any], int]],
) -> tuple[list[float], int]:
    """Per hard fault whose sample was published paced: wall ms from publishing the tick that
    shows it to the first hard DRAIN recommendation for its node on the topic (the broker's
    timestamp); and how many such faults got none."""
    first: dict[str, int] = {}
    for rec, ts_ms in recommendations:
        if rec.get("action") == "DRAIN" and rec.get("hard"):
            node = str(rec["node"])
            first[node] = min(first.get(node, ts_ms), ts_ms)
    out: list[float] = []
    missing = 0
    for node, tick_ms in faults:
        sent = published_ms.get(tick_ms)
        if sent is None:
            continue
        if node in first:
            out.append(first[node] - sent)
        else:
            missing += 1
    return out, missing


def encoded_ticks(fleet: Fleet, topic_prefix: str) -> Iterator[tuple[int, list[Raw]]]:
    """The fleet's ticks as they are simulated, (tick ms, its records Avro-encoded, each
    stamped with its event time)."""
    codecs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
    topics = {s: topic_prefix + t.name for s, t in STREAM_TOPICS.items()}
    for tick_ms, records in fleet.timed_ticks():
        yield tick_ms, [
            (topics[rec.stream], rec.key.encode(), codecs[rec.stream].encode(rec.value),
             int(rec.value.get("ts_ms", tick_ms)))
            for rec in records
        ]  # fmt: skip


def _is_sample(record: Raw) -> bool:
    return record[0].endswith(SAMPLES.name)


def encode_fleet(fleet: Fleet, topic_prefix: str) -> tuple[list[Raw], list[Raw], int]:
    """Every record of ``fleet`` Avro-encoded, split into the first tick (job events and one
    sample per node: it opens the worker's start-up gate) and the rest; plus the node-record
    count of all of it."""
    first: list[Raw] = []
    rest: list[Raw] = []
    samples = 0
    for _tick_ms, records in encoded_ticks(fleet, topic_prefix):
        # ``first`` ends with the first tick that has samples.
        (rest if samples else first).extend(records)
        samples += sum(map(_is_sample, records))
    return first, rest, samples


@dataclass(frozen=True)
class WorkerRun:
    """One benchmark worker: its counters, /proc at the end, when the timed input began."""

    counters: dict[str, Any]
    proc: ProcSnapshot
    timed_since_wall_s: float
    topic_prefix: str
    #: Node records of the whole input (the first tick included).
    node_records: int
    #: Window close -> finding latencies (ms) of findings made during the paced phase.
    paced_latency_ms: list[float] = field(default_factory=list)
    #: Node records published paced (included in ``node_records``).
    paced_records: int = 0
    #: Hard faults of the paced phase: sample published -> hard DrainRecommendation on the
    #: topic (wall ms), and how many got none.
    hard_latency_ms: list[float] = field(default_factory=list)
    hard_missing: int = 0
    #: The burst: CPU seconds of the worker's processes from its start to stage 3's last
    #: window batch, and that batch's wall time (None if it never took one).
    burst_cpu_s: float | None = None
    burst_done_wall_s: float | None = None
    #: The floor measured just before the worker started, over a copy of its samples topic
    #: (None unless asked for).
    floor_before: FloorResult | None = None
    #: The raw consume limit measured just before the worker started, likewise.
    raw_before: FloorResult | None = None
    #: What ``before_worker`` returned (called once the archive is written, before the floor
    #: and the worker; None without one).
    before_worker: Any = None


#: Where the floor measured before the worker reads its copy of the samples (under the run's
#: prefix, so the run's clean-up removes it too).
FLOOR_PREFIX = "floor."


def floor_before(
    kafka: KafkaSettings,
    records: Sequence[Raw],
    prefix: str,
    log: Callable[[str], None],
    gpus_per_record: int,
) -> tuple[FloorResult, FloorResult]:
    """The floor and the raw consume limit over a copy of the samples of ``records``
    (published to a topic of its own under ``prefix`` + :data:`FLOOR_PREFIX`, with the samples
    topic's partitions), measured before the worker starts: with those measured after it,
    they bracket the worker's run in time, so a machine whose speed drifts moves both sides of
    the ratios alike."""
    copy_prefix = prefix + FLOOR_PREFIX
    ensure_topics(kafka, [t for t in catalogue(copy_prefix) if t.name.endswith(SAMPLES.name)])
    topic = copy_prefix + SAMPLES.name
    samples = [(topic, *r[1:]) for r in records if _is_sample(r)]
    log(f"floor and raw consume over a copy of the {len(samples):,} sample records, before "
        "the worker ...")  # fmt: skip
    produce_raw(kafka, samples)
    floor = measure_floor(kafka, topic, len(samples))
    return floor, measure_floor(kafka, topic, len(samples), gpus_per_record=gpus_per_record)


def archive_raw(records: Sequence[Raw], root: Path, topic_prefix: str) -> int:
    """Write encoded records (topics under ``topic_prefix``; ``encode_fleet`` stamps each with
    its event time) as the archiver would: their Avro bodies, under their topic names without
    the prefix; returns how many were written."""
    from peerwatch.io.archive.writer import AvroFileSink

    topics = {topic_prefix + t.name: t for t in STREAM_TOPICS.values()}
    codecs = {name: AvroCodec(t.value_schema or "") for name, t in topics.items()}
    sink = AvroFileSink(root, {t.name: t.value_schema or "" for t in topics.values()})
    try:
        for topic, _key, value, ts_ms in records:
            body = codecs[topic].current_body(value)
            if body is None:
                raise ValueError(f"{topic}: a record not encoded with the current schema")
            sink.write_body(topics[topic].name, body, int(ts_ms or 0))
    finally:
        sink.close()
    return sink.records


def measure_replay(archive: Path, from_ms: int, to_ms: int) -> dict[str, Any]:
    """``peerwatch replay --archive`` over ``[from_ms, to_ms)`` in a subprocess: its JSON
    summary (node records, wall time, rate; the replay times itself, start-up excluded).
    Raises RuntimeError if it fails."""
    cmd = [sys.executable, "-m", "peerwatch.cli", "replay", "--archive", str(archive),
           "--from", str(from_ms), "--to", str(to_ms), "--no-progress"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"replay failed ({done.returncode}): {done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return summary


#: Replays of the benchmark's archive before the worker runs and after it (the floor's reason:
#: they bracket the worker's run in time, so a machine whose speed drifts moves both sides of
#: the ratio alike); the report gives the median run's figures.
REPLAY_RUNS_BEFORE = 2
REPLAY_RUNS_AFTER = 3


def median_run(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The run of median ``node_records_per_s`` (the lower middle of an even count; a run
    without a rate counts as the slowest)."""
    if not runs:
        raise ValueError("no replay runs")
    ranked = sorted(runs, key=lambda r: r.get("node_records_per_s") or 0.0)
    return dict(ranked[(len(ranked) - 1) // 2])


def delete_prefixed_topics(kafka: KafkaSettings, prefix: str) -> int:
    """Delete every topic named ``prefix…`` (a benchmark's input, outputs and the worker's
    internal topics): a long-lived broker would otherwise collect thousands of partitions, one
    open file each and more. Returns how many were asked to be deleted; failures are ignored."""
    from confluent_kafka.admin import AdminClient

    from peerwatch.kafka_config import admin_config

    admin = AdminClient(admin_config(kafka))
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    if not names:
        return 0
    for future in admin.delete_topics(names, operation_timeout=30).values():
        with contextlib.suppress(Exception):
            future.result()
    return len(names)


@dataclass
class PacedProgress:
    """How a paced publication is going: ticks handed to the producer, node records among them,
    and how late (s) the latest and the latest-worst tick were past their slots."""

    ticks: int = 0
    samples: int = 0
    late_s: float = 0.0
    max_late_s: float = 0.0


def publish_ticks(
    kafka: KafkaSettings,
    ticks: Iterable[tuple[int, Sequence[Raw]]],
    interval_s: float,
    progress: PacedProgress | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> dict[int, float]:
    """Publish ``(tick ms, records)`` in order, one tick every ``interval_s`` of wall time from
    now (each tick flushed, like an agent's send); ``ticks`` may be generated as it goes (a
    tick taking longer than its slot to make is late, which ``progress`` shows). Stops early
    when ``stop()``. Returns, per tick, the wall time (ms) its first record was handed to the
    producer. Raises RuntimeError if a record is not acked."""
    sink = _ConfluentSink(kafka)
    progress = progress if progress is not None else PacedProgress()
    sent: dict[int, float] = {}
    t0 = time.monotonic()
    for i, (tick_ms, records) in enumerate(ticks):
        if stop():
            break
        delay = t0 + i * interval_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        progress.late_s = max(0.0, -delay)
        progress.max_late_s = max(progress.max_late_s, progress.late_s)
        sent[tick_ms] = time.time() * 1000.0
        for topic, key, value, ts_ms in records:
            sink.send(topic, key, value, (), ts_ms or 0)
        sink.flush(30)
        progress.ticks += 1
        progress.samples += sum(map(_is_sample, records))
    return sent


def publish_paced(
    kafka: KafkaSettings, records: Sequence[Raw], interval_s: float
) -> dict[int, float]:
    """Publish ``records`` grouped by their timestamp's tick, one tick every ``interval_s`` of
    wall time from now (see :func:`publish_ticks`). Returns, per tick (its start, epoch ms of
    event time), the wall time (ms) its first record was handed to the producer. Raises
    RuntimeError if a record is not acked."""
    step_ms = int(interval_s * 1000)
    ticks: dict[int, list[Raw]] = {}
    for r in records:
        ticks.setdefault(int((r[3] or 0) // step_ms), []).append(r)
    return publish_ticks(kafka, ((t * step_ms, ticks[t]) for t in sorted(ticks)), interval_s)


def run_worker_over(
    kafka: KafkaSettings,
    fleet: Fleet,
    workdir: Path,
    args: Sequence[str] = (),
    paced_s: float = 0.0,
    timeout_s: float = 900.0,
    log: Callable[[str], None] = lambda _m: None,
    archive: Path | None = None,
    floor_first: bool = False,
    before_worker: Callable[[], Any] | None = None,
) -> WorkerRun:
    """Publish the fleet's first tick under a fresh prefix, start one worker and wait until it
    processed it (start-up and group join are then behind it), then publish the rest as fast as
    the broker takes it (pre-encoded) and wait until the worker took every node record. The
    last ``paced_s`` seconds of event time are then published paced, one tick per second of
    wall time, as agents would (the finding latencies of that phase are kept apart).
    Snapshots /proc, kills the worker. ``archive``: also write every record there as archive
    files (before the worker starts), for the replay phase. ``floor_first``: measure the floor
    over a copy of the samples first (:func:`floor_before`). ``before_worker``: called once the
    archive is written, before the floor and the worker (its result is kept in the run).
    Raises TimeoutError."""
    import uuid

    prefix = f"bench{uuid.uuid4().hex[:8]}."
    ensure_topics(kafka, catalogue(prefix))
    first, rest, total = encode_fleet(fleet, prefix)
    if archive is not None:
        log(f"archiving the same records under {archive} ...")
        archive_raw([*first, *rest], archive, prefix)
    before_result = before_worker() if before_worker is not None else None
    end_ms = fleet.spec.start_ms + fleet.spec.duration_ms
    paced_from_ms = end_ms - int(paced_s * 1000) if paced_s > 0 else None
    paced = [r for r in rest if paced_from_ms is not None and (r[3] or 0) >= paced_from_ms]
    rest = [r for r in rest if paced_from_ms is None or (r[3] or 0) < paced_from_ms]
    paced_samples = sum(t.endswith(SAMPLES.name) for t, *_ in paced)
    first_samples = sum(t.endswith(SAMPLES.name) for t, *_ in first)
    floors = (
        floor_before(kafka, [*first, *rest, *paced], prefix, log, fleet.spec.gpus_per_node)
        if floor_first
        else (None, None)
    )
    produce_raw(kafka, first)
    app_id = f"bench-{uuid.uuid4().hex[:8]}"
    with WorkerProcess(
        kafka.bootstrap_servers, prefix, app_id, workdir, name=app_id,
        args=["--loglevel", "warning", *args], counters_interval_s=0.5,
    ) as worker:  # fmt: skip

        def poll() -> tuple[int, int, int]:
            if not worker.alive():
                raise RuntimeError(f"worker died:\n{worker.log_tail()}")
            c = worker.counters()
            return int(c.get("samples", 0)), int(c.get("findings", 0)), int(c.get("windows", 0))

        state = wait_stable(poll, lambda s: s[0] >= first_samples, 120, settle_s=0)
        if state[0] < first_samples:
            raise TimeoutError(f"worker did not start:\n{worker.log_tail()}")
        log(f"worker ready; publishing {total - first_samples} node records ...")
        cpu_before = worker.proc_snapshot().cpu_s
        since = time.time()
        produce_raw(kafka, rest)
        burst = total - paced_samples
        # Done when the hot stage took every sample and stage 3 every window (their counts
        # settled): the rate is the whole worker's, not only its hot stage's.
        state = wait_stable(poll, lambda s: s[0] >= burst, timeout_s, settle_s=3.0)
        if state[0] < burst:
            raise TimeoutError(f"worker took {state[0]} of {burst}:\n{worker.log_tail()}")
        burst_cpu_s = worker.proc_snapshot().cpu_s - cpu_before
        burst_done = worker.counters().get("last_window_batch_wall_s")
        paced_latency: list[float] = []
        hard: tuple[list[float], int] = ([], 0)
        if paced:
            log(f"publishing {paced_samples} node records paced over {paced_s:g} s ...")
            before = len(worker.counters().get("finding_latency_ms") or [])
            sent = publish_paced(kafka, paced, interval_s=1.0)
            state = wait_stable(poll, lambda s: s[0] >= total, timeout_s, settle_s=5.0)
            paced_latency = list(worker.counters().get("finding_latency_ms") or [])[before:]
            recs = [(decode_any(r.value)[1], r.ts_ms)
                    for r in read_topic(kafka, prefix + RECOMMENDATIONS.name)]  # fmt: skip
            hard = hard_latencies(paced_hard_faults(fleet), sent, recs)
        snapshot = worker.proc_snapshot()
        return WorkerRun(
            worker.counters(), snapshot, since, prefix, total, paced_latency, paced_samples,
            hard[0], hard[1], burst_cpu_s, burst_done, floors[0], floors[1], before_result,
        )  # fmt: skip


def run_stream_bench(
    kafka: KafkaSettings,
    nodes: int,
    gpus_per_node: int,
    duration_s: float,
    workdir: Path,
    rss_nodes: int = 12_500,
    rss_duration_s: float = 10.0,
    paced_s: float = 0.0,
    worker_args: Sequence[str] = (),
    keep_topics: bool = False,
    log: Callable[[str], None] = lambda _m: None,
    replay: bool = True,
) -> dict[str, Any]:
    """The whole benchmark (see :mod:`peerwatch.streams.tools.bench`); returns the report dict.
    ``rss_nodes`` = 0 skips the RSS-at-scale run; ``replay`` False skips the replay phase."""
    from peerwatch.streams.tools.bench import (
        cpu_ratio,
        floor_summary,
        latency_summary,
        verdicts,
        worker_metrics,
    )

    fleet = bench_fleet(nodes, gpus_per_node, duration_s, paced_s=paced_s)
    log(
        f"worker over {nodes} x {gpus_per_node} GPUs x {duration_s:g} s (+ {paced_s:g} s paced) ..."
    )
    archive = workdir / "archive" if replay else None

    def replays(count: int) -> list[dict[str, Any]]:
        assert archive is not None
        log(f"replay of the same records from the archive, {count} runs ...")
        start_ms = fleet.spec.start_ms
        return [
            measure_replay(archive, start_ms, start_ms + fleet.spec.duration_ms + 60_000)
            for _ in range(count)
        ]

    run = run_worker_over(
        kafka, fleet, workdir, worker_args, paced_s=paced_s, log=log, archive=archive,
        floor_first=True,
        before_worker=(lambda: replays(REPLAY_RUNS_BEFORE)) if archive is not None else None,
    )  # fmt: skip
    # Rates over the burst only (the paced phase is idle most of the time).
    worker = worker_metrics(
        run.counters, run.timed_since_wall_s, run.node_records - run.paced_records,
        done_wall_s=run.burst_done_wall_s, cpu_s=run.burst_cpu_s,
    )  # fmt: skip
    every = list(run.counters.get("finding_latency_ms") or [])
    worker["finding_latency_ms"] = latency_summary(every[: len(every) - len(run.paced_latency_ms)])
    prefix = run.topic_prefix
    log("floor over the same samples topic, after the worker ...")
    after = measure_floor(kafka, prefix + SAMPLES.name, run.node_records)
    log("raw consume over the same samples topic, after the worker ...")
    raw_after = measure_floor(
        kafka, prefix + SAMPLES.name, run.node_records, gpus_per_record=gpus_per_node
    )
    if not keep_topics:
        delete_prefixed_topics(kafka, prefix)
    floor = floor_summary(run.floor_before, after)
    floor_rate = floor["gpu_samples_per_s"]
    raw = floor_summary(run.raw_before, raw_after)
    report: dict[str, Any] = {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "duration_s": duration_s,
        "topic_prefix": prefix,
        "worker": worker,
        "worker_cpu_s_total": run.proc.cpu_s,
        "worker_peak_rss_bytes": run.proc.peak_rss_bytes,
        "floor": floor,
        "processor_over_floor": worker["gpu_samples_per_s"] / floor_rate
        if worker["gpu_samples_per_s"] and floor_rate
        else None,
        "raw_consume": raw,
        "worker_cpu_over_raw_consume": cpu_ratio(worker, raw),
        "rss_at_scale": None,
        "paced": {
            "seconds": paced_s,
            "node_records": run.paced_records,
            "finding_latency_ms": latency_summary(run.paced_latency_ms),
            "hard_to_recommendation_ms": latency_summary(run.hard_latency_ms),
            "hard_faults_without_recommendation": run.hard_missing,
        },
    }
    report["replay"] = None
    if archive is not None:
        # A replay of these records takes about a second, the worker's burst several: one
        # second of this machine is too easily a slow one. The median of the runs before the
        # worker and after it.
        runs = [*(run.before_worker or []), *replays(REPLAY_RUNS_AFTER)]
        shutil.rmtree(archive, ignore_errors=True)
        summary = median_run(runs)
        rate = summary.get("node_records_per_s")
        report["replay"] = {
            **summary,
            "runs_node_records_per_s": [r.get("node_records_per_s") for r in runs],
            "over_worker": rate / worker["node_records_per_s"]
            if rate and worker.get("node_records_per_s")
            else None,
        }
    if rss_nodes > 0:
        log(f"RSS run: {rss_nodes} x {gpus_per_node} GPUs x {rss_duration_s:g} s ...")
        big = bench_fleet(rss_nodes, gpus_per_node, rss_duration_s)
        big_run = run_worker_over(kafka, big, workdir, worker_args, log=log)
        if not keep_topics:
            delete_prefixed_topics(kafka, big_run.topic_prefix)
        report["rss_at_scale"] = {
            "nodes": rss_nodes,
            "gpus_tracked": rss_nodes * gpus_per_node,
            "node_records": big_run.node_records,
            "peak_rss_bytes": big_run.proc.peak_rss_bytes,
            "worker": worker_metrics(
                big_run.counters,
                big_run.timed_since_wall_s,
                done_wall_s=big_run.burst_done_wall_s,
                cpu_s=big_run.burst_cpu_s,
            ),
        }
    report["verdicts"] = verdicts(report)
    return report
