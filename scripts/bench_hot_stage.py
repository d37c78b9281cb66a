"""CPU of the live hot stage (stage 2) per GPU sample, without Kafka: the bench fleet's samples
decoded and aggregated (``HotStage._step_parts``) and the closed windows turned into channel
messages (``ClosedOutput.send``: WindowBatch and census encoding) by the input fuzzer's hot
stage (a recording producer instead of librdkafka), in batches of 2,000 samples, per round.

Compare two checkouts by running it with ``PYTHONPATH`` set to each (absolute), alternately:

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_hot_stage.py [--nodes 128] [--seconds 60]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

# The input fuzzer's Kafka fakes and its hot stage of one worker: the same set-up, not a copy.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from fuzz_inputs import FakeMessage, _hot_stage


def main() -> int:
    from peerwatch.schemas.codec import AvroCodec
    from peerwatch.streams.tools.bench_run import bench_fleet

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    codecs = {"samples": AvroCodec("NodeGpuSample"), "job-events": AvroCodec("JobEvent")}
    events: list[tuple[bytes, bytes, int]] = []
    samples: list[tuple[bytes, bytes, int]] = []
    for tick in bench_fleet(args.nodes, 8, args.seconds).ticks():
        for r in tick:
            if r.stream in codecs:
                value = codecs[r.stream].encode(r.value)
                out = events if r.stream == "job-events" else samples
                out.append((r.key.encode(), value, int(r.value["ts_ms"])))  # type: ignore[arg-type]
    gpu_samples = 8 * len(samples)
    for rnd in range(args.rounds):
        hot, _ = _hot_stage(lateness_s=5, job_partitions=1, batch_max=2000)
        for i, (key, value, ts) in enumerate(events):
            hot.jobs.apply_message(FakeMessage("je", 0, i, key, value, None, ts))
        aggregate = send = 0.0
        for lo in range(0, len(samples), 2000):
            batch = [FakeMessage("s", 0, lo + i, k, v, None, ts)
                     for i, (k, v, ts) in enumerate(samples[lo : lo + 2000])]  # fmt: skip
            t = time.process_time()
            part = hot.parts.parts[0]
            hot._step_parts(0, part, batch, *hot._decode(0, part, batch))
            aggregate += time.process_time() - t
            t = time.process_time()
            hot.output.send(hot._closed_until(), hot._idle_marks)
            send += time.process_time() - t
        print(f"round {rnd}: aggregate {aggregate * 1e6 / gpu_samples:.2f}, send_closed "
              f"{send * 1e6 / gpu_samples:.2f} CPU µs per GPU sample")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
