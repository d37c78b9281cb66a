"""One part of an archive replay, counted in instructions (callgrind) instead of timed.

Needs valgrind (Debian: ``apt-get install valgrind``). Usage: valgrind --tool=callgrind --instr-atstart=no --collect-atstart=no \\
           --toggle-collect=sys_call_tracing .venv/bin/python scripts/bench_instructions.py \\
           PART ARCHIVE --from MS --to MS
       (or ``bash scripts/bench_instructions.sh PART ARCHIVE --from MS --to MS``)

PART is ``decoder`` (the C column decoder over the archive's sample blocks) or ``replay`` (the
whole replay, the in-process runner over the column path, blocks read beforehand: ``replay``
less ``decoder`` is the stages' work). The measured part runs inside ``sys.call_tracing`` with
callgrind's instrumentation switched on around it (``callgrind_control``), so the count leaves
out start-up, imports and the setup. Run alone (no valgrind), it prints the part's CPU seconds.

Why: this machine's speed moves by a third from one minute to the next (the host takes CPU from
it), so two commits' CPU times differ by more than most changes do; instruction counts repeat to
the instruction (with ``PYTHONHASHSEED=0``). They are not time: a ``rep movsb`` copy counts a
byte an instruction, and cache misses count nothing. Compare commits with it, then confirm with
timed runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peerwatch.io.archive.layout import ReadStats
from peerwatch.io.archive.reader import raw_blocks
from peerwatch.streams.core import loops
from peerwatch.streams.core.pipeline import Pipeline
from peerwatch.streams.offline.replay import (
    TimeRange,
    column_archive_records,
    live_equivalent_settings,
    replay,
)
from peerwatch.streams.offline.sample_runs import decoded_here, sample_decoder


def measured(part: Callable[[], Any]) -> Any:
    """``part()`` with callgrind's instrumentation on around it (when run under callgrind)."""
    under = "valgrind" in os.environ.get("LD_PRELOAD", "") or os.environ.get("UNDER_CALLGRIND")
    toggle = ["callgrind_control", "-i"]
    if under:
        subprocess.run([*toggle, "on", str(os.getpid())], check=True, capture_output=True)
    t0 = time.process_time()
    out = sys.call_tracing(part, ())
    cpu_s = time.process_time() - t0
    if under:
        subprocess.run([*toggle, "off", str(os.getpid())], check=True, capture_output=True)
    print(f"part CPU {cpu_s:.3f} s", file=sys.stderr)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=["decoder", "replay"])
    p.add_argument("archive", type=Path)
    p.add_argument("--from", dest="from_ms", type=int, required=True)
    p.add_argument("--to", dest="to_ms", type=int, required=True)
    args = p.parse_args()
    settings = live_equivalent_settings()
    span = TimeRange(args.from_ms, args.to_ms)
    files = sorted((args.archive / "peerwatch.gpu.samples").glob("*.avro"))
    blocks = {f: (lambda h, b: (h, list(b)))(*raw_blocks(f)) for f in files}

    def blocks_of(path: Path, _stats: ReadStats | None = None) -> tuple[Any, Any]:
        header, items = blocks[Path(path)]
        return header, iter(items)

    def replayed() -> Any:
        pipeline = Pipeline(settings, emit_windows=False)
        records = column_archive_records(args.archive, span, pipeline.aggregator.strings, "",
                                         None, 30_000, ReadStats(),
                                         decoded_here(sample_decoder(), blocks_of))  # fmt: skip
        return replay(records, settings, pipeline=pipeline)

    if args.part == "decoder":
        decoder, strings = sample_decoder(), {}  # type: ignore[var-annotated]
        every = [b for f in files for b in blocks[f][1]]
        decoder.block(every[0][1], 0, every[0][0], strings)  # strings known, sizes hinted

        def part() -> Any:
            for count, data in every:
                decoder.block(data, 0, count, strings)

    else:
        loops.warm()

        def part() -> Any:
            return replayed()

    measured(part)


if __name__ == "__main__":
    main()
