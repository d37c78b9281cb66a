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
import pathlib
import statistics
import sys
import time
from typing import Any

# The input fuzzer's Kafka fakes (a message, a recording producer) and its hot stage of one
# worker with samples partition 0 assigned: the same set-up, not a copy of it.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fuzz_inputs import FakeMessage, _hot_stage


class JsonTable(dict):  # type: ignore[type-arg]
    """A dict that serialises each value set, as faust's changelog-backed table (JSON schema)."""

    def __setitem__(self, key: Any, value: Any) -> None:
        json.dumps(value)
        super().__setitem__(key, value)


def window_batches(nodes: int, seconds: int) -> tuple[list[tuple[bytes, bytes]], list[Any], int]:
    """(job events, window-batch messages, node records) of the bench fleet through the hot
    stage, in batches of 2,000 samples."""
    from peerwatch.schemas.codec import AvroCodec
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
    hot, producer = _hot_stage(lateness_s=5, job_partitions=1, batch_max=2000)
    for i, (key, value, ts) in enumerate(events):
        hot.jobs.apply_message(FakeMessage("je", 0, i, key, value, None, ts))
    for start in range(0, len(samples), 2000):
        batch = [FakeMessage("s", 0, start + i, k, v, None, ts)
                 for i, (k, v, ts) in enumerate(samples[start : start + 2000])]  # fmt: skip
        hot.take(batch)
    batches = [(p.key, p.value) for p in producer.sent if p.topic == "b"]
    return [(k, v) for k, v, _ in events], batches, len(samples)


def as_json(batches: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The same messages in the JSON form of older workers."""
    from peerwatch.streams.live.window_batches import WindowBatchCodec, is_window_batch, older_json

    codec = WindowBatchCodec()
    out = []
    for key, value in batches:
        if is_window_batch(value):
            value = older_json(codec.decode_batch(value))
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
        counters=StreamCounters(), hold_s=settings.stream.pending_hold_s,
    )  # fmt: skip
    for key, value in events:
        handler.handle("je", 0, key, value)
    windows: list[bytes] = []
    start = time.process_time()
    for offset, (key, value) in enumerate(batches):  # with offsets: batches wait in memory, as live
        out = handler.handle("b", 0, key, value, offset=offset)
        windows += [o.value for o in out if o.topic == "windows"]
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
