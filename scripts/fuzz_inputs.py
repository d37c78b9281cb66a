"""Mutation fuzzing of the pure-Python readers of outside input: archive files, spool segments and
Slurm JSON documents (issue 12). A seeded random mutator damages valid inputs; each target checks
that the reader neither raises (beyond its documented errors) nor hangs, and that what it keeps
is right:

* archive: a file of numbered blocks with one block's bytes damaged is read by the decoded
  reader (``read_file``), the block reader (``raw_blocks``) and the span finder
  (``block_spans``); every record of every block but the damaged one and the one after it (whose
  sync marker a resync may skip) is kept, in order, no record is invented, and a loss is counted;
* spool: a segment with damage inside one frame (or random damage anywhere, or a damaged
  ``head``) opens; every record outside the damaged frame is kept in order, nothing invented;
* slurm: a ``squeue``/``sacct``/node document with hostile values put at random places (types
  swapped, numbers beyond a long, deep nesting, surrogates, control characters) is read entry
  by entry; every untouched entry is read as before, the watcher's diff of the result runs, and
  each event encodes or raises the codec's EncodeError (counted by the watcher).

    PYTHONPATH=. .venv/bin/python scripts/fuzz_inputs.py --seconds 60 [--seed 7] [--target T]

Exit status: 0 every input held, 1 a failure (each printed with its seed and input number).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

from peerwatch.errors import CodecError, PeerwatchError
from peerwatch.exporters.archive_files import (
    ContainerWriter,
    ReadStats,
    block_spans,
    body_encoder,
    raw_blocks,
    read_file,
)
from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.parse import (
    parse_sacct,
    parse_sacct_jobs,
    parse_sinfo,
    parse_sinfo_nodes,
    parse_squeue,
    parse_squeue_jobs,
)
from peerwatch.producers.slurm.watcher import WatchState, diff
from peerwatch.producers.spool import _FRAME, Spool, SpooledRecord
from peerwatch.schemas.codec import AvroCodec
from peerwatch.schemas.registry import current_schema, raw_schema, strip_logical_types

ROOT = Path(__file__).resolve().parent.parent
SLURM_DATA = ROOT / "tests" / "data" / "slurm"
#: One input taking longer than this is reported as a hang (the machine may be loaded: generous).
SLOW_S = 20.0


class Failure(Exception):
    """An input broke a property (message says which)."""


# -- the mutator -------------------------------------------------------------------------------
def mutate_bytes(data: bytes, rng: Random, lo: int = 0, hi: int | None = None,
                 inplace: bool = False) -> bytes:  # fmt: skip
    """One random damage inside ``data[lo:hi]``: a bit flip, a byte set, bytes removed or
    inserted, a run overwritten with 00/FF/random, or a varint made huge. ``inplace``: only
    damage that keeps the length (what a disk does; positions after it stay valid)."""
    hi = len(data) if hi is None else hi
    if hi <= lo:
        return data
    at = rng.randrange(lo, hi)
    kind = rng.choice([0, 1, 4, 6] if inplace else range(7))
    if kind == 0:
        return data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1 :]
    if kind == 1:
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    if kind == 2:
        n = rng.randint(1, min(16, hi - at))
        return data[:at] + data[at + n :]
    if kind == 3:
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))) + data[at:]
    if kind == 4:
        n = min(rng.randint(1, 32), hi - at)
        fill = rng.choice([b"\x00" * n, b"\xff" * n, bytes(rng.randrange(256) for _ in range(n))])
        return data[:at] + fill + data[at + n :]
    if kind == 5:  # a varint that never ends, or a long one
        return data[:at] + b"\xff" * rng.randint(1, 12) + b"\x7f" + data[at + 1 :]
    return data[:at] + b"\x01" + data[at + 1 :]  # zigzag -1


def _subsequence(got: list[Any], of: list[Any]) -> bool:
    it = iter(of)
    return all(any(g == x for x in it) for g in got)


def _timed(what: str, fn: Callable[[], Any]) -> Any:
    t0 = time.monotonic()
    out = fn()
    if time.monotonic() - t0 > SLOW_S:
        raise Failure(f"{what} took {time.monotonic() - t0:.1f} s (a hang?)")
    return out


# -- archive -----------------------------------------------------------------------------------
@dataclass
class ArchiveCase:
    records: list[dict[str, Any]]
    per_block: int
    data: bytes


def archive_case(rng: Random, codec: str) -> ArchiveCase:
    """A NodeStateEvent container file of 4 to 8 blocks (records numbered by ``event_id``)."""
    blocks, per_block = rng.randint(4, 8), rng.randint(1, 6)
    records = [
        {"event_id": f"e{i}", "node": f"gpu{i % 5:03d}", "ts_ms": 1_767_225_600_000 + i,
         "state": rng.choice(["IDLE", "DOWN"]), "flags": ["DRAIN"] * rng.randint(0, 2),
         "reason": rng.choice([None, "xid 79", "ü" * rng.randint(0, 5)]), "reason_user": None,
         "reason_set_ms": None, "partitions": None, "source": "WATCHER"}
        for i in range(blocks * per_block)
    ]  # fmt: skip
    name = "NodeStateEvent"
    with tempfile.SpooledTemporaryFile() as fh:
        w = ContainerWriter(fh, strip_logical_types(raw_schema(name)), body_encoder(name), codec,
                            bytes(rng.randrange(256) for _ in range(16)), block_bytes=1 << 30)  # fmt: skip
        for i, rec in enumerate(records):
            w.write(rec)
            if (i + 1) % per_block == 0:
                w.flush()
        fh.seek(0)
        data = fh.read()
    return ArchiveCase(records, per_block, data)


def fuzz_archive(rng: Random, tmp: Path) -> None:
    case = archive_case(rng, rng.choice(["null", "deflate", "zstandard"]))
    _, spans = block_spans(case.data)
    ids = [r["event_id"] for r in case.records]
    path = tmp / "f.avro"
    if rng.random() < 0.8:  # damage inside one block: the others must be kept
        k = rng.randrange(len(spans))
        data = case.data
        for _ in range(rng.randint(1, 3)):
            start, end = spans[k]
            end = min(end, len(data))
            data = mutate_bytes(data, rng, start, end)
        lost_blocks = {k, k + 1}
    else:  # damage anywhere, the header included: no crash, nothing invented
        data = case.data
        for _ in range(rng.randint(1, 4)):
            data = mutate_bytes(data, rng)
        lost_blocks = set(range(len(spans)))
    path.write_bytes(data)
    must = [ids[i] for i in range(len(ids)) if i // case.per_block not in lost_blocks]
    stats = ReadStats()
    schema = current_schema("NodeStateEvent")
    got = _timed("read_file", lambda: [r["event_id"] for r in read_file(path, schema, stats=stats)])
    # A damaged block may still decode (the null codec has no checksum): its records may come
    # out changed, never more of them than the damaged blocks held.
    if len(got) - len(must) > case.per_block * len(lost_blocks):
        raise Failure(f"read_file returned more records than the file holds: {got}")
    if not _subsequence(must, got):
        raise Failure(f"read_file lost records of undamaged blocks: {sorted(set(must) - set(got))}")
    lost = len(ids) - len(got)
    counted = stats.bad_records + stats.bad_blocks + stats.bad_files + stats.cut_tails
    if lost and not counted:
        raise Failure(f"read_file lost {lost} records without counting any ({stats})")
    try:
        _, blocks = raw_blocks(path, ReadStats())
        counts = _timed("raw_blocks", lambda: [c for c, _ in blocks])
    except ValueError:  # a header damaged beyond reading: refused, as documented
        counts = []
    if len(counts) < len(spans) - len(lost_blocks & set(range(len(spans)))):
        raise Failure(f"raw_blocks kept {len(counts)} of {len(spans)} blocks ({lost_blocks=})")
    with contextlib.suppress(ValueError):  # a header beyond reading: refused, as documented
        _timed("block_spans", lambda: block_spans(data, ReadStats()))


# -- spool -------------------------------------------------------------------------------------
def fuzz_spool(rng: Random, tmp: Path) -> None:
    folder = tmp / f"spool{rng.randrange(1 << 30)}"
    spool = Spool(folder)
    records = [
        SpooledRecord(rng.choice(["t", "peerwatch.gpu.samples"]),
                      None if rng.random() < 0.2 else b"k%d" % i,
                      bytes(rng.randrange(256) for _ in range(rng.randint(0, 60))),
                      tuple((f"h{j}", b"v") for j in range(rng.randint(0, 2))), i, i)
        for i in range(rng.randint(3, 15))
    ]  # fmt: skip
    spool.append(records)
    popped = rng.randint(0, 2)
    spool.pop(popped)
    seg = sorted(folder.glob("*.seg"))[0]
    data = seg.read_bytes()
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos += _FRAME.size + _FRAME.unpack_from(data, pos)[0]
    choice = rng.random()
    seqs = [r.seq for r in records[popped:]]
    if choice < 0.6:  # damage inside one frame
        k = rng.randrange(len(starts))
        end = starts[k + 1] if k + 1 < len(starts) else len(data)
        seg.write_bytes(mutate_bytes(data, rng, starts[k], end, inplace=True))
        must = [r.seq for i, r in enumerate(records) if i >= popped and i != k]
    elif choice < 0.8:  # the head file damaged
        head = folder / "head"
        head.write_bytes(mutate_bytes(head.read_bytes(), rng))
        must, seqs = seqs, [r.seq for r in records]  # read again from the start: allowed
    else:
        for _ in range(rng.randint(1, 4)):
            data = mutate_bytes(data, rng)
        seg.write_bytes(data)
        must, seqs = [], [r.seq for r in records]
    reopened = _timed("Spool()", lambda: Spool(folder))
    got = [r.seq for r in reopened.peek(1000)]
    if not _subsequence(got, [r.seq for r in records]) or len(set(got)) != len(got):
        raise Failure(f"spool invented or reordered records: {got}")
    if not _subsequence(must, got):
        raise Failure(f"spool lost records outside the damage: {sorted(set(must) - set(got))}")
    if len(reopened) != len(got):
        raise Failure(f"spool says {len(reopened)} records, holds {len(got)}")
    wanted = {r.seq: r for r in records}
    if any(r != wanted[r.seq] for r in reopened.peek(1000)):
        raise Failure("spool returned a record with other contents")
    reopened.append([SpooledRecord("t", None, b"after", (), 0, 10**6)])
    if Spool(folder).peek(10_000)[-1].seq != 10**6:
        raise Failure("appending after the repair lost the new record")
    del seqs


# -- slurm -------------------------------------------------------------------------------------
def _hostile_value(rng: Random) -> Any:
    depth = rng.choice([50, 300, 900])
    nested: Any = 1
    for _ in range(depth):
        nested = [nested] if rng.random() < 0.5 else {"a": nested}
    return rng.choice([
        None, True, 0, -1, 2**63, -(2**63) - 1, 2**200, 1.5, float("nan"), "", "\ud800",
        "a\nb\x00\x1b[31m", "\ufffd" * 3, "9" * 400, [], {}, [1, "x"], {"set": True},
        {"set": True, "number": 2**70}, {"number": "x"}, {"status": 3}, nested,
        ["RUNNING", 5], "gpu[0-99999999]", "gpu:1(IDX:0-99999)",
    ])  # fmt: skip


def _paths(doc: Any) -> Iterator[tuple[Any, ...]]:
    """Every path into ``doc``, depth first, parents before children. Iterative: an earlier
    mutation may have nested a value hundreds deep (the harness must not recurse on it)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(doc, ())]
    while stack:
        node, prefix = stack.pop()
        yield prefix
        if isinstance(node, dict):
            children = [(v, (*prefix, k)) for k, v in node.items()]
        elif isinstance(node, list):
            children = [(v, (*prefix, i)) for i, v in enumerate(node)]
        else:
            continue
        stack.extend(reversed(children))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


SLURM_DOCS: dict[
    str, tuple[str, Callable[[Any], list[Any]], Callable[[Any], tuple[list[Any], list[Any]]], str]
] = {
    "squeue": ("25.11/squeue.json", parse_squeue, parse_squeue_jobs, "jobs"),
    "squeue-22.05": ("22.05/squeue-running-pending.json", parse_squeue, parse_squeue_jobs, "jobs"),
    "sacct": ("24.05/sacct.json", parse_sacct, parse_sacct_jobs, "jobs"),
    "nodes": ("25.11/scontrol-show-nodes.json", parse_sinfo, parse_sinfo_nodes, "nodes"),
    "sinfo-22.05": ("22.05/sinfo-drained.json", parse_sinfo, parse_sinfo_nodes, "nodes"),
}
_CODECS: dict[str, AvroCodec] = {}


def fuzz_slurm(rng: Random, tmp: Path) -> None:
    name = rng.choice(sorted(SLURM_DOCS))
    file, strict, lenient, list_key = SLURM_DOCS[name]
    original = json.loads((SLURM_DATA / file).read_text())
    before = strict(original)
    doc = copy.deepcopy(original)
    touched: set[int] = set()
    whole = False
    for _ in range(rng.randint(1, 4)):
        path = rng.choice(list(_paths(doc)))
        if len(path) >= 2 and path[0] == list_key and isinstance(path[1], int):
            touched.add(path[1])
        else:
            whole = True  # the document's own shape or meta
        doc = _set(doc, path, _hostile_value(rng))
    try:
        items, skipped = _timed(name, lambda: lenient(doc))
    except SlurmParseError:
        if not whole:
            raise Failure("a damaged entry made the whole document unreadable") from None
        return
    untouched = [b for i, b in enumerate(before) if i not in touched]
    if not whole and not _subsequence(untouched, items):
        raise Failure(f"{name}: entries nobody touched were not read as before")
    if not whole and len(items) + len(skipped) != len(original[list_key]):
        raise Failure(f"{name}: {len(items)} read + {len(skipped)} skipped != entries")
    if list_key == "jobs":
        state, events = diff(WatchState(), items, None, 1_795_949_900_000)
    else:
        state, events = diff(WatchState(), [], items, 1_795_949_900_000)
    for event in events:
        codec = _CODECS.setdefault(event.schema, AvroCodec(event.schema))
        with contextlib.suppress(CodecError):  # run_watch counts it as unpublishable, goes on
            codec.encode(event.record)
    json.dumps(state.to_json())  # the state file can always be written


TARGETS: dict[str, Callable[[Random, Path], None]] = {
    "archive": fuzz_archive,
    "spool": fuzz_spool,
    "slurm": fuzz_slurm,
}


# -- driver ------------------------------------------------------------------------------------
@dataclass
class Result:
    inputs: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def run(seconds: float | None, seed: int, targets: list[str], inputs: int | None = None) -> Result:
    """Each target in turn, one input per turn, until ``seconds`` pass or each target has had
    ``inputs`` inputs. Input ``n`` of a target uses ``Random(f"{seed}/{target}/{n}")``: a failure
    is replayed with ``--seed``, ``--target`` and ``--input``."""
    result = Result({t: 0 for t in targets})
    deadline = None if seconds is None else time.monotonic() + seconds
    logging.disable(logging.CRITICAL)  # every input is damaged: the warnings say nothing new
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = Path(tmp_dir)
            while True:
                for target in targets:
                    n = result.inputs[target]
                    try:
                        run_one(target, seed, n, tmp)
                    except Exception as exc:
                        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                        if not isinstance(exc, Failure | PeerwatchError):
                            detail += "\n" + traceback.format_exc(limit=-3)
                        result.failures.append(f"{target} seed {seed} input {n}: {detail}")
                    result.inputs[target] = n + 1
                done = inputs is not None and all(v >= inputs for v in result.inputs.values())
                if done or (deadline is not None and time.monotonic() >= deadline):
                    return result
    finally:
        logging.disable(logging.NOTSET)


def run_one(target: str, seed: int, n: int, tmp: Path) -> None:
    TARGETS[target](Random(f"{seed}/{target}/{n}"), tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--target", action="append", choices=sorted(TARGETS))
    parser.add_argument("--input", type=int, help="replay one input of --target")
    args = parser.parse_args(argv)
    targets = args.target or sorted(TARGETS)
    if args.input is not None:
        with tempfile.TemporaryDirectory() as tmp:
            for target in targets:
                run_one(target, args.seed, args.input, Path(tmp))
        print("held")
        return 0
    t0 = time.monotonic()
    result = run(args.seconds, args.seed, targets)
    took = time.monotonic() - t0
    for failure in result.failures[:20]:
        print("FAIL", failure, file=sys.stderr)
    tried = ", ".join(f"{t} {n}" for t, n in result.inputs.items())
    print(f"fuzz_inputs: seed {args.seed}, {took:.0f} s, inputs: {tried}; "
          f"{len(result.failures)} failures")  # fmt: skip
    return 1 if result.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
