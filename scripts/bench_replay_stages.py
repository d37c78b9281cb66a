"""CPU of a split replay's stages process (stages 3 and 4: window dicts, the detector, the fleet
watch, the policy) alone, on the very messages its reading process sends for an archive.

The first run records the messages (``FrontPipeline`` of ``--archive``, pickled to
``--messages``); every run then feeds them to a fresh ``BackPipeline`` ``--rounds`` times and
prints the CPU seconds of each round and a digest of every output (scored windows included with
``--windows``), so two commits can be compared on the same input: run both at once, each on
its own core, swapping the cores each round (the machine's speed moves too much between runs
for one after the other):

    taskset -c 0 env PYTHONPATH=OLD python scripts/bench_replay_stages.py --messages M &
    taskset -c 1 env PYTHONPATH=NEW python scripts/bench_replay_stages.py --messages M; wait

    .venv/bin/python scripts/bench_replay_stages.py --archive DIR --messages FILE
        [--rounds 1] [--windows]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from peerwatch import gc_tuning
from peerwatch.settings import Settings
from peerwatch.streams.core import loops
from peerwatch.streams.offline.replay import TimeRange, column_archive_records
from peerwatch.streams.offline.split import BackPipeline, FrontPipeline


def record(archive: Path, out: Path) -> int:
    """The reading process's messages for ``archive``, pickled to ``out``; how many."""
    messages: list[Any] = []
    front = FrontPipeline(Settings(), messages.append)
    strings = front.aggregator.strings
    for stream, key, value in column_archive_records(archive, TimeRange(0, 1 << 62), strings):
        if stream == "sample-run":
            front.feed_columns(value)
        else:
            front.feed(stream, key, value)
    front.finish()
    with out.open("wb") as f:
        pickle.dump(messages, f, protocol=5)
    return len(messages)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archive", type=Path, help="record the messages of this archive first")
    ap.add_argument("--messages", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--windows", action="store_true", help="score and digest every window too")
    args = ap.parse_args()
    if not args.messages.exists():
        if args.archive is None:
            ap.error("--messages does not exist: give --archive to record it")
        print(f"recorded {record(args.archive, args.messages)} messages", file=sys.stderr)
    with args.messages.open("rb") as f:
        messages = pickle.load(f)  # noqa: S301 - written by this script, a local file
    loops.warm()
    gc_tuning.tune()
    for r in range(args.rounds):
        back = BackPipeline(Settings(), emit_windows=args.windows)
        digest = hashlib.sha256()
        outputs = 0
        t0 = time.process_time()
        for message in messages:
            for out in back.handle(message):
                outputs += 1
                digest.update(json.dumps(out, sort_keys=True, default=str).encode())
        cpu_s = time.process_time() - t0
        print(f"round {r}: {cpu_s:.2f} CPU-s, {outputs} outputs, digest {digest.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
