"""Chaos on real services (issue 12): a broker restarted under a running stream worker, stream
workers scaled 1 -> 3 -> 1 mid-run, and the agent spool's disk filling while the broker is away.

The tests that stop a broker start their own real Kafka (``peerwatch.local.kafka``, free
ports, its own state directory) and never touch the shared one; it is stopped at the end.
Outcomes are asserted (every expected window exactly once, every record delivered or counted as
dropped), never durations: the timeouts only guard against hangs.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerwatch.local.kafka import LocalKafka
from peerwatch.producers.delivery import Delivery, DeliverySettings
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec, decode_any
from peerwatch.settings import KafkaSettings, Settings, expand
from peerwatch.streams.core.pipeline import WINDOW, Pipeline
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings
from peerwatch.streams.live.hot_spec import samples_partition
from peerwatch.streams.tools.bench_run import WorkerProcess, produce_raw, read_topic, wait_stable
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import JOB_WINDOWS, SAMPLES, TopicSpec, catalogue

WINDOW_S, LATENESS_S, INTERVAL_S = 10, 5.0, 2.0
WORKER_ARGS = ["--window-s", str(WINDOW_S), "--lateness-s", str(LATENESS_S),
               "--loglevel", "warning"]  # fmt: skip
#: Against hangs only: a worker needs 10-60 s to start and join on a loaded machine.
HANG_S = 150.0

Raw = tuple[str, bytes | None, bytes, int | None]
WindowKey = tuple[str, str, int, int]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A real broker of this module's own, on free ports: the tests stop and start it."""
    kafka = LocalKafka(
        cache_dir=expand(os.environ.get("PEERWATCH_CACHE_DIR", "~/.cache/peerwatch")),
        state_dir=tmp_path_factory.mktemp("chaos-kafka"),
        port=free_port(),
        controller_port=free_port(),
    )
    kafka.start(timeout_s=180)
    try:
        yield kafka
    finally:
        kafka.stop()


def restart(kafka: LocalKafka) -> None:
    """Start a stopped broker again (same ports, same data), ready for clients."""
    assert kafka.start(timeout_s=180) == "started"


# -- the simulated input and its expected windows --------------------------------------------------
class Input:
    """A small fleet (8 nodes x 8 GPUs, 2 s samples; one 64-GPU job, or ``jobs`` jobs of the
    listed ids sharing the nodes) as records in publishing order, and the GpuWindows the offline
    pipeline makes of them."""

    def __init__(
        self, duration_s: int, seed: int, jobs: tuple[str, ...] = ("4001",), nodes: int = 8
    ) -> None:
        now_ms = int(time.time() * 1000) - (duration_s + 60) * 1000
        start_ms = now_ms - now_ms % (WINDOW_S * 1000)
        doc = {
            "fleet": {"nodes": nodes, "gpus_per_node": 8, "interval_s": INTERVAL_S,
                      "duration_s": duration_s, "seed": seed, "start_ms": start_ms},
            "jobs": [{"job_id": job, "gpus": 8 * nodes // len(jobs),
                      "first_node": i * nodes // len(jobs), "warmup_s": 0, "duration_s": 7200}
                     for i, job in enumerate(jobs)],
        }  # fmt: skip
        self.start_ms = start_ms
        self.records: list[tuple[int, str, str, dict[str, Any]]] = []
        for tick, recs in Fleet(parse_scenario(doc)).timed_ticks():
            self.records += [(tick, r.stream, r.key, r.value) for r in recs]

    def raw(self, prefix: str, since_s: float = 0, until_s: float = 1e12) -> list[Raw]:
        codecs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
        lo, hi = self.start_ms + since_s * 1000, self.start_ms + until_s * 1000
        return [
            (prefix + STREAM_TOPICS[stream].name, key.encode(), codecs[stream].encode(value),
             int(value.get("ts_ms", tick)))
            for tick, stream, key, value in self.records
            if lo <= tick < hi
        ]  # fmt: skip

    def expected_windows(self) -> set[WindowKey]:
        """The offline pipeline (streams/core) on the same records, fed without ``finish()``:
        windows close on the same watermark rule as the live hot stage."""
        pipeline = Pipeline(Settings(detector=DetectorSettings(window_s=WINDOW_S),
                                     stream=StreamSettings(lateness_s=LATENESS_S,
                                                           fan_out_job_wide=True)))  # fmt: skip
        keys = [window_key(o.value) for _, s, k, v in self.records
                for o in pipeline.feed(s, k, v) if o.kind == WINDOW]  # fmt: skip
        assert len(keys) == len(set(keys))
        return set(keys)


def window_key(w: dict[str, Any]) -> WindowKey:
    return (w["job_id"], w["node"], w["gpu_index"], w["window_start_ms"])


def live_windows(kafka: KafkaSettings, prefix: str) -> list[WindowKey]:
    return [window_key(decode_any(r.value)[1])
            for r in read_topic(kafka, prefix + JOB_WINDOWS.name)]  # fmt: skip


def assert_windows(got: list[WindowKey], expected: set[WindowKey]) -> None:
    """Every expected window exactly once. On failure the message names what differs, grouped by
    window start and node (a plain ``==`` on sets this size makes pytest diff them for minutes)."""
    dupes = len(got) - len(set(got))
    missing, unexpected = expected - set(got), set(got) - expected
    first_ms = min((k[3] for k in expected), default=0)

    def summary(keys: set[WindowKey]) -> str:
        by: dict[tuple[int, str], int] = {}
        for _, node, _, start_ms in keys:
            by[(start_ms - first_ms, node)] = by.get((start_ms - first_ms, node), 0) + 1
        return ", ".join(f"+{start} ms/{node}: {n}" for (start, node), n in sorted(by.items())[:40])

    if dupes or missing or unexpected:
        pytest.fail(
            f"{dupes} window(s) emitted twice; {len(missing)} missing "
            f"[{summary(missing)}]; {len(unexpected)} unexpected [{summary(unexpected)}]"
            f" (of {len(expected)} expected)",
            pytrace=False,
        )


def samples_in(raw: list[Raw]) -> int:
    return sum(t.endswith(SAMPLES.name) for t, *_ in raw)


def wait_for_windows(
    kafka: KafkaSettings, prefix: str, want: int, workers: list[WorkerProcess]
) -> list[WindowKey]:
    """Poll the windows topic until it holds ``want`` windows (or more) and stopped growing;
    every worker stays alive throughout."""

    def poll() -> int:
        for w in workers:
            assert w.alive(), f"{w.name} died:\n{w.log_tail()}"
        return len(live_windows(kafka, prefix))

    wait_stable(poll, lambda n: n >= want, HANG_S, settle_s=8)
    return live_windows(kafka, prefix)


def new_worker(
    bootstrap: str, prefix: str, tmp: Path, name: str, app: str, env: dict[str, str] | None = None
) -> WorkerProcess:
    return WorkerProcess(bootstrap, prefix, app, tmp, name=name, args=WORKER_ARGS, env=env or {})


def wait_joined(*workers: WorkerProcess) -> None:
    """Until each worker wrote its counters file (its app started)."""
    got = wait_stable(lambda: all(w.counters() for w in workers) and all(w.alive() for w in workers),
                      bool, HANG_S, settle_s=0)  # fmt: skip
    assert got, "\n".join(f"{w.name}:\n{w.log_tail()}" for w in workers)


def wait_processed(worker: WorkerProcess, samples: int) -> None:
    n = wait_stable(lambda: int(worker.counters().get("samples", 0)),
                    lambda n: n >= samples, HANG_S, settle_s=3)  # fmt: skip
    assert worker.alive(), worker.log_tail()
    assert n >= samples, f"{worker.name} processed {n} of {samples}:\n{worker.log_tail()}"


# -- a. the broker restarted under a running worker -------------------------------------------------
def test_broker_restart_under_a_running_worker_loses_no_window(
    own_kafka: LocalKafka, tmp_path: Path
) -> None:
    kafka = KafkaSettings(bootstrap_servers=own_kafka.bootstrap, client_id="chaos")
    data = Input(duration_s=160, seed=21)
    expected = data.expected_windows()
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka, catalogue(prefix))
    first, second = data.raw(prefix, until_s=80), data.raw(prefix, since_s=80)
    produce_raw(kafka, first)
    app = f"app-{uuid.uuid4().hex[:6]}"
    with new_worker(own_kafka.bootstrap, prefix, tmp_path, "worker", app) as worker:
        wait_processed(worker, samples_in(first))
        pid = worker.pid
        assert own_kafka.stop() in ("stopped", "killed")
        time.sleep(5)  # the worker runs on without a broker for a while
        assert worker.alive(), f"the worker died when the broker went away:\n{worker.log_tail()}"
        restart(own_kafka)
        produce_raw(kafka, second)
        got = wait_for_windows(kafka, prefix, len(expected), [worker])
        # The same process throughout: it survived the outage rather than being restarted.
        assert worker.alive() and worker.pid == pid
        assert int(worker.counters().get("samples", 0)) >= samples_in(first) + samples_in(second)
    assert_windows(got, expected)


# -- b. workers scaled 1 -> 3 -> 1 mid-run ----------------------------------------------------------
def test_scaling_workers_1_3_1_loses_and_duplicates_no_window(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    # Four jobs on four of the six stage-3 partitions: some move to the added workers and come
    # back when those stop (stage 3 must then read them from its tables, not from memory).
    data = Input(duration_s=180, seed=22, jobs=("4001", "4002", "4003", "4005"))
    expected = data.expected_windows()
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka_settings, catalogue(prefix))
    bootstrap = kafka_settings.bootstrap_servers
    thirds = [data.raw(prefix, 0, 60), data.raw(prefix, 60, 120), data.raw(prefix, 120)]
    app = f"app-{uuid.uuid4().hex[:6]}"
    with new_worker(bootstrap, prefix, tmp_path, "w1", app) as w1:
        produce_raw(kafka_settings, thirds[0])
        wait_processed(w1, samples_in(thirds[0]))
        with (
            new_worker(bootstrap, prefix, tmp_path, "w2", app) as w2,
            new_worker(bootstrap, prefix, tmp_path, "w3", app) as w3,
        ):
            wait_joined(w2, w3)
            produce_raw(kafka_settings, thirds[1])
            # Until the second third was processed, by whichever workers own the partitions
            # after the rebalance (a new owner may re-read records: offsets trail open windows).
            wait_stable(
                lambda: sum(int(w.counters().get("samples", 0)) for w in (w1, w2, w3)),
                lambda n: n >= samples_in(thirds[0]) + samples_in(thirds[1]), HANG_S, settle_s=8,
            )  # fmt: skip
            helped = [int(w.counters().get("samples", 0)) for w in (w2, w3)]
            for w in (w1, w2, w3):
                assert w.alive(), f"{w.name} died:\n{w.log_tail()}"
            w2.stop(timeout_s=60)  # scaled down: a clean stop (SIGTERM), as an operator does
            w3.stop(timeout_s=60)
        produce_raw(kafka_settings, thirds[2])
        got = wait_for_windows(kafka_settings, prefix, len(expected), [w1])
    assert sum(helped) > 0, "the added workers never took part: no rebalance happened"
    assert_windows(got, expected)


# -- b2. a worker restarted while stage 3 holds windows pending ------------------------------------
@pytest.mark.parametrize("held_in", ["table", "memory"])
def test_windows_pending_in_stage_3_survive_a_worker_restart(
    kafka_settings: KafkaSettings, tmp_path: Path, held_in: str
) -> None:
    """One 24-GPU job on three nodes; one node's samples partition gets only that node's first
    sample at first (a partition the worker has seen nothing of counts as holding no node and
    would not hold the windows back), so the job's later windows wait in stage 3 for that node
    when the worker goes. ``table``: written to its pending table (a changelog-backed faust
    table) at the first heartbeat (``stream.pending_hold_s`` 0), then a clean stop; the next
    worker recovers the table and releases each window whole once the late node's samples come.
    (faust read the table's raw entries as JSON, failed on each, and the recovery never
    completed: no window at all was released.) ``memory``: kept in memory only (hold 600 s),
    their messages' offsets uncommitted, and the worker killed (SIGKILL): the next worker reads
    the window batches again from the committed offset, and releases the same windows."""
    data = Input(duration_s=120, seed=23, nodes=3)
    expected = data.expected_windows()
    late_node = "gpu00002"
    parts = SAMPLES.partitions
    assert samples_partition(late_node, parts) != samples_partition("gpu00000", parts)
    assert samples_partition("gpu00001", parts) == samples_partition("gpu00000", parts)
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka_settings, catalogue(prefix))

    first_minute = data.raw(prefix, 0, 60)
    late_first_ms = min(r[3] or 0 for r in first_minute
                        if r[0].endswith(SAMPLES.name) and r[1] == late_node.encode())  # fmt: skip

    def held(r: Raw) -> bool:
        return (r[0].endswith(SAMPLES.name) and r[1] == late_node.encode()
                and (r[3] or 0) > late_first_ms)  # fmt: skip

    first = [r for r in first_minute if not held(r)]
    app = f"app-{uuid.uuid4().hex[:6]}"
    hold = {"PEERWATCH_STREAM_PENDING_HOLD_S": "0" if held_in == "table" else "600"}
    with new_worker(kafka_settings.bootstrap_servers, prefix, tmp_path, "before", app, hold) as w:
        produce_raw(kafka_settings, first)
        wait_processed(w, samples_in(first))
        assert int(w.counters().get("windows", 0)) == 0  # all wait for the late node
        if held_in == "table":
            pending = wait_stable(
                lambda: read_topic(kafka_settings, f"{prefix}{app}-pending-changelog"),
                bool, HANG_S, settle_s=0,
            )  # fmt: skip
            assert pending, f"no pending window in stage 3:\n{w.log_tail()}"
            w.stop(timeout_s=60)
        else:
            assert w.counters().get("last_window_batch_wall_s"), w.log_tail()  # batches came
            w.kill()  # SIGKILL: the batches held in memory are gone with it
            pending = read_topic(kafka_settings, f"{prefix}{app}-pending-changelog")
            assert not pending, "a batch reached the pending table within its hold time"
    # Damaged entries in the three state tables' changelogs (of a job and a node that are not
    # in the input): each is dropped and counted when read; none may stop the recovery.
    changelog, now_ms = f"{prefix}{app}-{{}}-changelog".format, int(time.time() * 1000)
    produce_raw(kafka_settings, [
        (changelog("jobs"), b"9999", b"\xff\xfe not JSON", now_ms),
        (changelog("policy"), b"gpu09999", b"[1]", now_ms),
        (changelog("pending"), b"9999|0|0", b"0\n\xff not a batch", now_ms),
        (changelog("pending"), b"not|a|key", b"0\n{}", now_ms),
    ])  # fmt: skip
    produce_raw(kafka_settings, [r for r in first_minute if held(r)] + data.raw(prefix, 60))
    with new_worker(kafka_settings.bootstrap_servers, prefix, tmp_path, "after", app) as w:
        got = wait_for_windows(kafka_settings, prefix, len(expected), [w])
        counters = w.counters()
    assert_windows(got, expected)
    assert counters.get("pending_damaged") == 2 and counters.get("state_damaged") == 1, counters
    recovery = [line for line in w.log_path.read_text(errors="replace").splitlines()
                if "Error in recovery" in line]  # fmt: skip
    assert not recovery, f"{len(recovery)} changelog entries not recovered: {recovery[0]}"


# -- c. the spool's disk fills while the broker is away ---------------------------------------------
SPOOL_DISK_BYTES = 1 << 20
#: An upper bound of one spooled test record on disk: 1,008 bytes of value, key, topic, framing.
RECORD_DISK_BYTES = 1100


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (the spool's whole filesystem), unmounted at the end."""
    mount = tmp_path / "disk"
    mount.mkdir()
    tool = shutil.which("mount")
    assert tool is not None and os.geteuid() == 0, "mounting a tmpfs needs root and mount(8)"
    subprocess.run([tool, "-t", "tmpfs", "-o", f"size={SPOOL_DISK_BYTES}", "tmpfs", str(mount)],
                   check=True, timeout=30)  # fmt: skip
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False, timeout=30)


def test_spool_disk_full_is_bounded_counted_and_delivery_resumes(
    own_kafka: LocalKafka, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="peerwatch.producers.spool")
    kafka = KafkaSettings(bootstrap_servers=own_kafka.bootstrap, client_id="chaos-spool")
    topic = TopicSpec(f"t{uuid.uuid4().hex[:10]}.samples", "node", None, 3, "delete",
                      3_600_000, "test")  # fmt: skip
    ensure_topics(kafka, [topic])
    assert own_kafka.stop() in ("stopped", "killed")
    spool_dir = small_disk / "spool"
    delivery = Delivery(kafka, DeliverySettings(spool_dir=spool_dir, retry_interval_s=0.5))
    delivery.start()
    total, pad = 4000, b"x" * 1000  # about 4 MiB: four times the disk
    try:

        def send(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                node = f"gpu{i % 7:03d}".encode()
                delivery.send(topic.name, node, f"{i:08d}".encode() + pad)

        send(0, 20)
        # librdkafka holds the first records until it reports every broker down; from then on
        # records go to the spool.
        assert wait_stable(lambda: delivery.spooling, bool, HANG_S, settle_s=0)
        send(20, total)
        stats = delivery.stats
        wait_stable(lambda: (stats.sent, stats.spooled, stats.dropped),
                    lambda s: s[0] == total, HANG_S, settle_s=3)  # fmt: skip
        on_disk = sum(p.stat().st_size for p in spool_dir.iterdir())
        # Bounded: the disk is full and nothing raised; counted: dropped records are known.
        assert stats.dropped > 0 and on_disk <= SPOOL_DISK_BYTES
        assert delivery.spooled_records + stats.dropped <= total
        assert any("disk full" in r.getMessage() for r in caplog.records)
        # Oldest first, a segment at a time: the disk stays mostly used by the newest records
        # (not emptied wholesale when it fills).
        kept = delivery.spooled_records
        assert kept * RECORD_DISK_BYTES >= SPOOL_DISK_BYTES // 2, kept
        dropped_before = stats.dropped
        restart(own_kafka)
        wait_stable(lambda: (delivery.spooling, delivery.spooled_records),
                    lambda s: s == (False, 0), HANG_S, settle_s=2)  # fmt: skip
        assert not delivery.spooling and delivery.spooled_records == 0
    finally:
        final = delivery.close(timeout_s=30)
    assert final.dropped == dropped_before, "records were dropped after the broker came back"
    got = [int(r.value[:8]) for r in read_topic(kafka, topic.name)]
    assert len(got) == len(set(got)), "a record was delivered twice"
    # Everything not counted as dropped arrived: sent = delivered + dropped, nothing unaccounted.
    assert len(got) == total - final.dropped
    assert final.delivered == len(got)
    assert set(got) <= set(range(total))
    assert set(range(total - kept, total)) <= set(got), "the newest spooled records were lost"
