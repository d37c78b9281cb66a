"""The edges of ``peerwatch bench soak``: the benchmark's fleet published into a real broker at
one tick per second of wall time (simulated and encoded as it goes) for ``minutes``, with one
real ``peerwatch stream`` worker on it, its RSS and its hot stage's consumer lag sampled on the
way. The arithmetic and the verdict are in :mod:`peerwatch.streams.tools.bench_soak`; the fleet,
the worker and the publisher are ``peerwatch bench stream``'s
(:mod:`peerwatch.streams.tools.bench_run`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from peerwatch.kafka_config import consumer_config
from peerwatch.settings import KafkaSettings
from peerwatch.streams.tools.bench import parse_status_kib
from peerwatch.streams.tools.bench_run import (
    PacedProgress,
    Raw,
    WorkerProcess,
    bench_fleet,
    delete_prefixed_topics,
    encoded_ticks,
    produce_raw,
    publish_ticks,
    wait_stable,
)
from peerwatch.streams.tools.bench_soak import SoakSample, soak_report
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import SAMPLES, catalogue

#: ``peerwatch stream``'s default ``stream.app_id``; the hot stage's group is
#: ``<topic prefix><app id>-hot`` (see hot_stage.HotStage).
HOT_GROUP_SUFFIX = "-hot"


def read_rss_bytes(pid: int) -> int:
    """``VmRSS`` of a live process (Linux). Raises OSError if it is gone."""
    with open(f"/proc/{pid}/status") as fh:
        return parse_status_kib(fh.read(), "VmRSS")


class GroupLag:
    """The committed-offset lag of a consumer group over one topic, read with a consumer of
    that group that never subscribes (so it never joins the group or moves its offsets)."""

    def __init__(self, kafka: KafkaSettings, group: str, topic: str) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self._consumer = Consumer(consumer_config(kafka, group, **{"enable.auto.commit": False}))

    def read(self, timeout_s: float = 10.0) -> int | None:
        """Sum over the topic's partitions of high watermark - committed offset (the low
        watermark where nothing is committed); None when the broker does not answer."""
        from confluent_kafka import KafkaException, TopicPartition

        try:
            meta = self._consumer.list_topics(self.topic, timeout=timeout_s).topics[self.topic]
            tps = [TopicPartition(self.topic, p) for p in sorted(meta.partitions)]
            lag = 0
            for tp in self._consumer.committed(tps, timeout=timeout_s):
                low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout_s)
                lag += max(0, high - (tp.offset if tp.offset >= 0 else low))
        except (KafkaException, KeyError):
            return None
        return lag

    def close(self) -> None:
        self._consumer.close()


def _ticks_after_first(
    ticks: Iterator[tuple[int, list[Raw]]],
) -> tuple[list[Raw], Iterator[tuple[int, list[Raw]]]]:
    """The records up to the first tick with samples (job events and one sample per node: the
    worker's start-up gate), and the ticks after it."""
    first: list[Raw] = []
    for _tick_ms, records in ticks:
        first.extend(records)
        if any(r[0].endswith(SAMPLES.name) for r in records):
            break
    return first, ticks


def run_soak(
    kafka: KafkaSettings,
    nodes: int,
    gpus_per_node: int,
    minutes: float,
    workdir: Path,
    *,
    sample_s: float = 30.0,
    keep_topics: bool = False,
    worker_args: tuple[str, ...] = (),
    log: Callable[[str], None] = lambda _m: None,
    **limits: Any,
) -> dict[str, Any]:
    """The soak (module docstring); returns :func:`~peerwatch.streams.tools.bench_soak
    .soak_report`'s report. Raises TimeoutError when the worker does not start."""
    duration_s = minutes * 60.0
    prefix = f"soak{uuid.uuid4().hex[:8]}."
    ensure_topics(kafka, catalogue(prefix))
    now_ms = int(time.time() * 1000)
    # Event time starts now: ticks go out about when their samples were taken, as agents do.
    fleet = bench_fleet(nodes, gpus_per_node, duration_s + 1.0, start_ms=now_ms - now_ms % 1000)
    first, ticks = _ticks_after_first(encoded_ticks(fleet, prefix))
    first_samples = sum(r[0].endswith(SAMPLES.name) for r in first)
    produce_raw(kafka, first)
    app_id = f"soak-{uuid.uuid4().hex[:8]}"
    samples: list[SoakSample] = []
    progress = PacedProgress()
    with WorkerProcess(
        kafka.bootstrap_servers, prefix, app_id, workdir, name=app_id,
        args=["--loglevel", "warning", *worker_args], counters_interval_s=1.0,
    ) as worker:  # fmt: skip

        def processed() -> int:
            return int(worker.counters().get("samples", 0))

        if wait_stable(processed, lambda n: n >= first_samples, 180, settle_s=0) < first_samples:
            raise TimeoutError(f"worker did not start:\n{worker.log_tail()}")
        lag = GroupLag(kafka, prefix + app_id + HOT_GROUP_SUFFIX, prefix + SAMPLES.name)
        stop = threading.Event()
        t0 = time.monotonic()

        def take() -> None:
            try:
                rss = read_rss_bytes(worker.pid)
            except OSError:
                return  # the worker is gone: the run says so
            counters = worker.counters()
            own = counters.get("consumer_lag")
            sample = SoakSample(
                round(time.monotonic() - t0, 1), rss, lag.read(),
                None if own is None else int(own), int(counters.get("samples", 0)),
                progress.ticks, round(progress.late_s, 3),
            )  # fmt: skip
            samples.append(sample)
            log(f"t={sample.t_s:.0f}s RSS {rss / (1 << 20):.1f} MiB, lag {sample.lag_records}, "
                f"{sample.ticks} ticks")  # fmt: skip

        def sampler() -> None:
            take()
            while not stop.wait(sample_s):
                take()

        thread = threading.Thread(target=sampler, name="soak-sampler", daemon=True)
        log(f"worker ready; {nodes} nodes x {gpus_per_node} GPUs at 1 tick/s for {minutes:g} "
            f"min, a sample every {sample_s:g} s ...")  # fmt: skip
        thread.start()
        try:
            publish_ticks(kafka, ticks, 1.0, progress, stop=lambda: not worker.alive())
            time.sleep(min(sample_s, 5.0))  # the last ticks reach the worker
        finally:
            stop.set()
            thread.join(60)
        take()  # the end of the run
        alive = worker.alive()
        if not alive:
            log(f"the worker died:\n{worker.log_tail()}")
        lag.close()
    if not keep_topics:
        delete_prefixed_topics(kafka, prefix)
    return soak_report(
        samples, nodes=nodes, gpus_per_node=gpus_per_node, duration_s=duration_s,
        worker_alive=alive, max_late_s=progress.max_late_s, **limits,
    )  # fmt: skip
