"""The C column decoder alone on an archive's sample blocks: CPU microseconds per node record.

Usage: .venv/bin/python scripts/bench_decode_blocks.py SAMPLES_FILE.avro [--blocks 300]
    [--rounds 3]

The first ``--blocks`` blocks are read and decompressed first (not timed), then decoded into
columns (``ColumnDecoder.block``, as a replay does) ``--rounds`` times; each round's process CPU
time per node record is printed, and the best. To compare two builds, run this alternately from
a folder outside both checkouts, the older with ``PYTHONPATH`` (docs/performance.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from peerwatch.io.archive.reader import raw_blocks
from peerwatch.streams.offline.sample_runs import sample_decoder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--blocks", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    _, blocks = raw_blocks(args.file)
    data = []
    for count, block in blocks:
        if len(data) >= args.blocks:
            break
        data.append((count, block))
    records = sum(c for c, _ in data)
    raw = sum(len(b) for _, b in data)
    print(f"{len(data)} blocks, {records:,} node records, {raw / records:,.0f} bytes a record")
    decoder = sample_decoder()
    strings: dict[str, int] = {}
    best = float("inf")
    for _ in range(args.rounds):
        t0 = time.process_time()
        for count, block in data:
            decoder.block(block, 0, count, strings)
        us = (time.process_time() - t0) / records * 1e6
        best = min(best, us)
        print(f"decode: {us:.2f} µs CPU per node record")
    print(f"best: {best:.2f} µs CPU per node record")


if __name__ == "__main__":
    main()
