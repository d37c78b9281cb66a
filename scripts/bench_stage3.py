"""CPU of stage 3's message handling per GPU window, without Kafka: the bench fleet's samples
through the live hot stage (a recording producer instead of librdkafka), then its window batches
through stage 3's handler (plain dicts for the faust tables), twice per round:

- ``avro``: the WindowBatch messages as the hot stage sends them (C reader; each scored window
  written as its received head + the re-encoded tail);
- ``json``: the same batches in the JSON form older workers sent (decoded by ``json``, each
  scored window encoded whole), which is what stage 3 did before the WindowBatch message.

Both must write the same bytes (checked). The job table serialises each value to JSON when it is
set, as faust's table does for its changelog; faust's other costs (consumer, changelog produce)
are not in these figures: ``peerwatch bench stream`` measures the whole worker.

.venv/bin/python scripts/bench_stage3.py [--nodes 256] [--seconds 300] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any


class Message:
    """The part of ``confluent_kafka.Message`` the hot stage reads."""

    def __init__(self, topic: str, offset: int, key: bytes, value: bytes, ts_ms: int) -> None:
        self._topic, self._offset, self._key, self._value = topic, offset, key, value
        self._ts_ms = ts_ms

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts_ms)

    def error(self) -> None:
        return None


class RecordingProducer:
    """What the hot stage produces, kept in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []

    def produce(self, topic: str, value: Any = None, key: Any = None, **_: Any) -> None:
        self.sent.append((topic, key, value))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        return 0


class JsonTable(dict):  # type: ignore[type-arg]
    """A dict that serialises each value set, as faust's changelog-backed table (JSON schema)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        json.dumps(value)
        super().__setitem__(key, value)


class NoCommits:
    def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]


def window_batches(nodes: int, seconds: int) -> tuple[list[tuple[bytes, bytes]], list[Any], int]:
    """(job events, window-batch messages, node records) of the bench fleet through the hot
    stage, in batches of 2,000 samples."""
    from confluent_kafka import TopicPartition

    from peerwatch.schemas.codec import AvroCodec
    from peerwatch.settings import Settings
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.hot_stage import HotStage, HotTopics
    from peerwatch.streams.tools.bench_run import bench_fleet

    codecs = {"samples": AvroCodec("NodeGpuSample"), "job-events": AvroCodec("JobEvent")}
    events: list[tuple[bytes, bytes]] = []
    samples: list[tuple[bytes, bytes, int]] = []
    for tick in bench_fleet(nodes, 8, seconds).ticks():
        for r in tick:
            if r.stream in codecs:
                value = codecs[r.stream].encode(r.value)
                out = events if r.stream == "job-events" else samples
                out.append((r.key.encode(), value, int(r.value["ts_ms"])))  # type: ignore[arg-type]
    hot = HotStage(Settings(), "bench", HotTopics("s", "je", "b", "dead", 1, "f", "nf"),
                   StreamCounters(), window_s=5, lateness_s=5, batch_max=2000,
                   batch_within_s=0.1, allocation_retention_s=3600)  # fmt: skip
    producer = RecordingProducer()
    hot._producer = producer
    hot._on_assign(NoCommits(), [TopicPartition("s", 0)])
    for i, (key, value, ts) in enumerate(events):
        hot._apply_job_event(Message("je", i, key, value, ts))
    for start in range(0, len(samples), 2000):
        batch = [Message("s", start + i, k, v, ts)
                 for i, (k, v, ts) in enumerate(samples[start : start + 2000])]  # fmt: skip
        hot._aggregate(0, hot.parts[0], batch)
        hot._send_closed()
    batches = [(key, value) for topic, key, value in producer.sent if topic == "b"]
    return [(k, v) for k, v, _ in events], batches, len(samples)


def as_json(batches: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The same messages in the JSON form of older workers."""
    from peerwatch.streams.live.window_batches import WindowBatchCodec, is_window_batch

    codec = WindowBatchCodec()
    out = []
    for key, value in batches:
        if is_window_batch(value):
            message, _ = codec.decode_batch(value)
            message["parts"] = {str(src): ws for src, ws in message["parts"].items()}
            value = json.dumps(message).encode()
        out.append((key, value))
    return out


def handle_all(events: list[tuple[bytes, bytes]], batches: list[tuple[bytes, bytes]]) -> tuple[
    float, list[bytes]
]:  # fmt: skip
    """CPU seconds of a fresh stage-3 handler over ``batches``, and the windows it wrote."""
    from peerwatch.settings import Settings
    from peerwatch.streams.core.allocation import AllocationTable
    from peerwatch.streams.core.job_stage import JobReleaser
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.handlers import JobsHandler

    settings = Settings()
    meta = AllocationTable(3_600_000)
    handler = JobsHandler(
        JobReleaser(settings.detector, meta, grace_ms=int(settings.stream.job_grace_s * 1000)), meta,
        JsonTable(), {}, job_events_topic="je", step_times_topic="st", retention_ms=3_600_000,
        counters=StreamCounters(),
    )  # fmt: skip
    for key, value in events:
        handler.handle("je", 0, key, value)
    windows: list[bytes] = []
    start = time.process_time()
    for key, value in batches:
        windows += [o.value for o in handler.handle("b", 0, key, value) if o.topic == "windows"]
    return time.process_time() - start, windows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--seconds", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    events, avro, node_records = window_batches(args.nodes, args.seconds)
    forms = {"avro": avro, "json": as_json(avro)}
    cpu: dict[str, list[float]] = {name: [] for name in forms}
    written: dict[str, list[bytes]] = {}
    for _ in range(args.rounds):
        for name, batches in forms.items():
            seconds, windows = handle_all(events, batches)
            cpu[name].append(seconds)
            written[name] = windows
    if written["avro"] != written["json"]:
        raise SystemExit("the two forms wrote different GpuWindow bytes")
    n = len(written["avro"])
    report = {
        "node_records": node_records, "messages": len(avro), "gpu_windows": n,
        **{f"{name}_us_per_gpu_window": round(statistics.median(s) / n * 1e6, 2)
           for name, s in cpu.items()},
    }  # fmt: skip
    report["json_over_avro"] = round(
        report["json_us_per_gpu_window"] / report["avro_us_per_gpu_window"], 2
    )
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:28} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
