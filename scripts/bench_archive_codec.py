"""Archive codecs on real archive blocks: bytes written and seconds to compress and decompress.

Usage: .venv/bin/python scripts/bench_archive_codec.py ARCHIVE_FILE.avro [--block-bytes N]

The file's blocks are decompressed, joined, cut into blocks of ``--block-bytes`` (the archive
writes 1 MiB) and compressed with each codec the archive can write.
"""

from __future__ import annotations

import argparse
import importlib
import time
import zlib
from pathlib import Path

from peerwatch.io.archive.reader import raw_blocks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file", type=Path)
    p.add_argument("--block-bytes", type=int, default=1 << 20)
    args = p.parse_args()
    _, blocks = raw_blocks(args.file)
    raw = b"".join(data for _, data in blocks)
    size = args.block_bytes
    parts = [raw[i : i + size] for i in range(0, len(raw), size)]
    try:
        zstd = importlib.import_module("compression.zstd")
    except ImportError:
        zstd = importlib.import_module("backports.zstd")
    codecs = {
        "zstandard": (zstd.compress, zstd.decompress),
        "deflate": (lambda b: zlib.compress(b, 6)[2:-4], lambda b: zlib.decompress(b, -15)),
    }
    print(f"{len(raw):,} bytes in {len(parts)} blocks of {size:,}")
    print(f"{'codec':<10} {'written':>14} {'compress s':>11} {'decompress s':>13}")
    for name, (compress, decompress) in codecs.items():
        t0 = time.perf_counter()
        packed = [compress(b) for b in parts]
        t1 = time.perf_counter()
        for b in packed:
            decompress(b)
        t2 = time.perf_counter()
        print(f"{name:<10} {sum(map(len, packed)):>14,} {t1 - t0:>11.3f} {t2 - t1:>13.3f}")


if __name__ == "__main__":
    main()
