"""The archiver's cost per record: simulated 8-GPU samples, encoded as on Kafka, through
``ArchiveLoop.handle`` (decode, check, write to the hour's file) and one commit (fsync).

Usage: .venv/bin/python scripts/bench_archiver.py [--nodes 64] [--duration 100]

No broker: the messages are handed to the loop directly, so this is the archiver's own CPU cost
(consuming from Kafka adds librdkafka's fetch, mostly off the GIL).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from peerwatch.exporters.archive import ArchiveWriter
from peerwatch.exporters.archive_loop import ArchiveLoop
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import default_scenario
from peerwatch.schemas import native
from peerwatch.schemas.codec import codec_for

TOPIC = "peerwatch.gpu.samples"


class _Message:
    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def key(self) -> None:
        return None

    def error(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, 0)

    def headers(self) -> list[Any]:
        return []


class _NoSource:
    def consume(self, **_kw: Any) -> list[Any]:
        return []

    def commit_offsets(self, _offsets: Any) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--duration", type=float, default=100.0)
    args = p.parse_args()
    codec = codec_for("NodeGpuSample")
    fleet = Fleet(default_scenario(args.nodes, 8, args.duration, 2))
    values = [
        codec.encode(r.value) for _, recs in fleet.timed_ticks() for r in recs
        if r.stream == "samples"
    ]  # fmt: skip
    messages = [_Message(v, i) for i, v in enumerate(values)]
    with tempfile.TemporaryDirectory() as tmp:
        writer = ArchiveWriter(Path(tmp), {TOPIC: "NodeGpuSample"})
        writer.recover()
        loop = ArchiveLoop(_NoSource(), writer, {TOPIC: "NodeGpuSample"})  # type: ignore[arg-type]
        t0 = time.perf_counter()
        for msg in messages:
            loop.handle(msg)  # type: ignore[arg-type]
        loop.commit()
        wall_s = time.perf_counter() - t0
    n = len(messages)
    print(f"{n:,} 8-GPU samples in {wall_s:.3f} s: {n / wall_s:,.0f} records/s, "
          f"{wall_s / n * 1e6:.1f} us each (C decoder: {native.available()})")  # fmt: skip


if __name__ == "__main__":
    main()
