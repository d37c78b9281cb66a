"""Mutation fuzzing of the pure-Python readers of outside input: archive files, spool segments,
Slurm JSON documents and Kafka messages (issue 12), step times and topic folders (issue 39). A seeded random mutator damages valid
inputs; each target checks that the reader neither raises (beyond its documented errors) nor
hangs, and that what it keeps is right:

* archive: a file of numbered blocks with one block's bytes damaged is read by the decoded
  reader (``read_file``), the block reader (``raw_blocks``) and the span finder
  (``block_spans``); every record of every block but the damaged one and the one after it (whose
  sync marker a resync may skip) is kept, in order, no record is invented, and a loss is counted;
* spool: a segment with damage inside one frame (or random damage anywhere, or a damaged
  ``head``) opens; every record outside the damaged frame is kept in order, nothing invented;
* slurm: a ``squeue``/``sacct``/node document with hostile values put at random places (types
  swapped, numbers beyond a long, deep nesting, surrogates, control characters) is read entry
  by entry; every untouched entry is read as before, the watcher's diff of the result runs, and
  each event encodes or raises the codec's EncodeError (counted by the watcher);
* kafka: 1 to 40 hostile Kafka messages (keys missing, empty, not UTF-8, with NULs, 1 MiB;
  headers missing, duplicated, not bytes, huge, oddly named; values valid for the topic's
  schema, mutated, empty or framed wrongly) for one consumer, through what its consume loop
  calls: the hot stage's batch and job-events reader, the faust agents' handlers (stages 3 and
  4), the OTLP and Alertmanager exporters' loop, the archiver's loop (its files read back), the
  drain controller, replay from Kafka and its reader of the published settings. Each message is processed, or skipped and counted, or
  dead-lettered with a reason (the original key and value kept, or their sizes when too large
  to send); nothing else escapes;
* step-times: StepTime records with hostile durations (NaN, infinities, 1e308, negative, any
  double's bits, huge ints, not numbers) added to a job's step times: replay counts each one the
  input check refuses invalid (and finds exactly what it found without them when all are), the
  live stage-3 handler refuses the same ones (dead-lettered), no window gets a non-finite step;
* topic-folders: entries planted in an archive's topic folders (impossible or pre-1970 hours,
  folders and dangling links named like hours, garbage under a real hour's name, Unicode digits,
  near misses): both replay readers keep exactly the archive's records and count each misnamed
  entry (and each unreadable file), the job view reads it, and the archiver's recovery and
  retention run beside them and delete none.
* sysfs: the recorded NIC tree (tests/data/sysfs/hgx) with counter, state and rate files
  damaged, removed or replaced by a folder, read by the agent's NIC sampler and judged by the
  health check's IB counter check: untouched values read as before, damaged counters are null
  (and counted) or valid, nothing raises.
* alertmanager: the Alertmanager sender against a hostile HTTP peer on 127.0.0.1 (random
  bytes, damaged answers, headers up to 300 KiB, short or lying bodies, endless bodies, one
  byte at a time, silence): the tick returns, a failure keeps the alert for the retry.
* config: the printed settings tree with hostile values on random settings (out of range,
  NaN, 4,301-digit integers, NULs, 3,000-deep nesting) or damaged bytes, and hostile
  environment values: loaded within every declared range, or a ConfigError naming the setting.

    PYTHONPATH=. .venv/bin/python scripts/fuzz_inputs.py --seconds 60 [--seed 7] [--target T]

Exit status: 0 every input held, 1 a failure (each printed with its seed and input number).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import json
import logging
import math
import os
import re
import shutil
import struct
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
from peerwatch.io.archive.layout import ReadStats
from peerwatch.io.archive.reader import block_spans, raw_blocks, read_file
from peerwatch.io.archive.writer import ContainerWriter, body_encoder
from peerwatch.producers.health.infiniband import check_ib_counters
from peerwatch.producers.nic.counters import IB_COUNTERS
from peerwatch.producers.nic.ports import discover_ports
from peerwatch.producers.nic.sampler import NicSampler
from peerwatch.producers.nic.sysfs import Reader as NicReader
from peerwatch.producers.nic.sysfs import SysfsTree
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
# The test helpers (the hostile HTTP peer, the fake clock) are shared with the tests.
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))
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
    _check_spool(reopened, records, must)
    del seqs


def fuzz_spool_segments(rng: Random, tmp: Path) -> None:
    """A spool of several segments, some popped, then: a ``head`` naming another segment at
    any offset (a frame boundary or not), or a segment path (existing, next or before) that is
    a folder or a dangling link. It opens, deletes nothing on the head's word (every undelivered
    record kept, in order), sets the bad path aside, and takes new records after."""
    folder = tmp / f"spool{rng.randrange(1 << 30)}"
    spool = Spool(folder, segment_bytes=rng.choice([200, 400, 1000]))
    records = [SpooledRecord("t", b"k%d" % i, rng.randbytes(rng.randint(0, 80)), (), i, i)
               for i in range(rng.randint(5, 60))]  # fmt: skip
    spool.append(records)
    popped = rng.randint(0, len(records) // 2)
    spool.pop(popped)
    segments = sorted(folder.glob("*.seg"))
    numbers = [int(p.stem) for p in segments]
    must = [r.seq for r in records[popped:]]
    if rng.random() < 0.5:
        target = rng.choice([*numbers, numbers[-1] + rng.randint(1, 3), numbers[0] - 1])
        size = (folder / f"{target:012d}.seg").stat().st_size if target in numbers else 100
        offset = rng.choice([0, rng.randint(0, size), size, size + rng.randint(1, 10**6)])
        true_segment, true_offset = map(int, (folder / "head").read_text().split())
        if target == true_segment and offset > true_offset:
            # Another frame boundary of the head's own segment is a head like the true one:
            # the records before it may be taken as delivered (no reader could tell).
            frames = _segment_frames(segments[0].read_bytes())
            if offset in {start for start, _ in frames} | {size}:
                skipped = {seq for start, seq in frames if true_offset <= start < offset}
                must = [m for m in must if m not in skipped]
        (folder / "head").write_text(f"{target} {offset}\n")
    else:
        target = rng.choice([*numbers, numbers[-1] + 1, numbers[0] - 1])
        path = folder / f"{target:012d}.seg"
        if path.exists():  # its records go with it (set aside): they need not come
            lost = {seq for _, seq in _segment_frames(path.read_bytes())}
            must = [m for m in must if m not in lost]
            path.unlink()
        if rng.random() < 0.5:
            path.mkdir()
        else:
            os.symlink(folder / "no-such", path)
    reopened = _timed("Spool()", lambda: Spool(folder))
    _check_spool(reopened, records, must)


def _segment_frames(data: bytes) -> list[tuple[int, int]]:
    """(start, record ``seq``) of each frame of an undamaged segment's bytes."""
    frames, pos = [], 0
    while pos < len(data):
        end = pos + _FRAME.size + _FRAME.unpack_from(data, pos)[0]
        frames.append((pos, SpooledRecord.decode(data[pos + _FRAME.size : end]).seq))
        pos = end
    return frames


def _check_spool(reopened: Spool, records: list[SpooledRecord], must: list[int]) -> None:
    """What a reopened spool holds: records of ``records`` only, in order, none twice, every
    one of ``must``; it then takes a new record after them."""
    folder = reopened.directory
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


# -- slurm -------------------------------------------------------------------------------------
def _hostile_value_slurm(rng: Random) -> Any:
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
        doc = _set(doc, path, _hostile_value_slurm(rng))
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


# -- kafka -------------------------------------------------------------------------------------
# Every consumer of a Kafka message's key, headers or value bytes, called the way its consume
# loop calls it, with hostile messages: keys missing, empty, not UTF-8, with NULs or 1 MiB long;
# headers missing, duplicated, not bytes, huge or oddly named; values that are valid records of
# the topic's schema, those damaged by mutate_bytes, empty, or framed wrongly. Each message must
# be processed, or skipped and counted, or dead-lettered with a reason: no exception escapes.
# The fakes stand for the client below the Kafka boundary (messages, a producer that checks
# what librdkafka checks), never for the logic under test.
KAFKA_LIMIT_BYTES = 1_000_000  # librdkafka's message.max.bytes default: produce() refuses more


@dataclass
class FakeMessage:
    """The part of ``confluent_kafka.Message`` the consumers read."""

    _topic: str
    _partition: int
    _offset: int
    _key: Any
    _value: Any
    _headers: Any = None
    _ts_ms: int = 1_767_225_600_000

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> Any:
        return self._key

    def value(self) -> Any:
        return self._value

    def headers(self) -> Any:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts_ms)

    def error(self) -> None:
        return None


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: dict[str, bytes]
    partition: int | None = None


class FakeProducer:
    """Records what is produced; refuses what ``confluent_kafka.Producer.produce`` refuses (a
    key or value of another type: TypeError; more than message.max.bytes: KafkaException
    MSG_SIZE_TOO_LARGE). Flush reports every record delivered."""

    def __init__(self) -> None:
        self.sent: list[Produced] = []
        self._reports: list[Callable[[], None]] = []

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int = -1,
                on_delivery: Any = None, headers: Any = None, **_: Any) -> None:  # fmt: skip
        from confluent_kafka import KafkaError, KafkaException

        for what, v in (("key", key), ("value", value)):
            if v is not None and not isinstance(v, bytes | str):
                raise TypeError(f"{what} of type {type(v).__name__}")
        pairs = list((headers or {}).items()) if isinstance(headers, dict) else list(headers or [])
        for name, v in pairs:
            if not isinstance(name, str) or not (v is None or isinstance(v, bytes | str)):
                raise TypeError(f"header {name!r}: {type(v).__name__}")
        size = len(key or b"") + len(value or b"") + sum(len(n) + len(v or b"") for n, v in pairs)
        if size > KAFKA_LIMIT_BYTES:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        as_bytes = {n: v.encode() if isinstance(v, str) else v for n, v in pairs}
        self.sent.append(
            Produced(topic, value, key, as_bytes, None if partition < 0 else partition)
        )
        if on_delivery is not None:
            self._reports.append(lambda: on_delivery(None, None))

    def poll(self, _timeout: float = 0) -> int:
        return self.flush()

    def flush(self, _timeout: float = 0) -> int:
        reports, self._reports = self._reports, []
        for report in reports:
            report()
        return 0


def _hostile_key(rng: Random, good: bytes | None) -> tuple[Any, bool]:
    """A message key, and whether it is the producer's own (unchanged)."""
    r = rng.random()
    if r < 0.6:
        return good, True
    return rng.choice([
        None, b"", b"\xff\xfe" + (good or b""), (good or b"") + b"\x00\x00gpu", b"\xed\xa0\x80",
        b"\xc0\x80", b"k" * (1 << 20), b"\x00" * 64, b"\n\x1b[31m", "text-key".encode("utf-16"),
    ]), False  # fmt: skip


def _hostile_headers(rng: Random) -> Any:
    return rng.choice([
        None, [], [("h", b"v"), ("h", b"w")], [("h", None)], [("", b"")], [("\x00", b"\xff")],
        [("ü" * 300, b"x")], [("h", b"x" * (1 << 16))], [("peerwatch.reason", b"forged")],
        [(f"h{i}", b"") for i in range(200)],
    ])  # fmt: skip


def _dumps_deep(doc: Any) -> bytes:
    """JSON text of a document the mutations may have nested thousands deep (three 900-deep
    values, one inside another): the encoder gets the recursion room it needs, so the reader
    under test, not the harness, meets the depth."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        return json.dumps(doc).encode()
    finally:
        sys.setrecursionlimit(limit)


def _hostile_value(rng: Random, good: bytes, framed: bool) -> tuple[Any, bool]:
    """A message value (``good``: a valid record of the topic; ``framed``: Avro with the codec's
    header, else JSON), and whether it is unchanged."""
    r = rng.random()
    if r < 0.45:
        return good, True
    if r < 0.65 and not framed:  # JSON: hostile values at random places of the object
        doc = json.loads(good)
        for _ in range(rng.randint(1, 3)):
            doc = _set(doc, rng.choice(list(_paths(doc))), _hostile_value_slurm(rng))
        return _dumps_deep(doc), False
    if r < 0.8:
        data = good
        for _ in range(rng.randint(1, 3)):
            data = mutate_bytes(data, rng)
        return data, data == good
    other = _KAFKA_OTHER_FRAMES[rng.randrange(len(_KAFKA_OTHER_FRAMES))]
    return rng.choice([
        None, b"", good[:1], good[:5], good[10:] if framed else good[1:], good + b"\x00junk",
        good + good, other + good[10:] if framed else other, b'{"kind": "watermark"}',
        b"[" * 100_000, b'{"a": ' * 5000, b"null", b"[]", b"1e999", b'"x"', b"\xff" * 64,
        bytes(KAFKA_LIMIT_BYTES - 100), _dumps_deep(_hostile_value_slurm(rng)),
    ]), False  # fmt: skip


#: Headers of other schemas' Avro (a value of the wrong topic).
_KAFKA_OTHER_FRAMES: list[bytes] = []
_KAFKA_CORPUS: dict[str, list[tuple[bytes | None, bytes]]] = {}


def _generator() -> Any:
    """scripts/fuzz_native.py's random valid records of a schema (generate, to_node)."""
    import importlib.util

    name = "peerwatch_fuzz_native"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "fuzz_native.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def kafka_corpus() -> dict[str, list[tuple[bytes | None, bytes]]]:
    """Valid (key, value) messages per kind: the simulator's inputs (4 nodes, a minute), the
    hot stage's window batches and watermarks of those, and random valid records of every schema
    (built once)."""
    if _KAFKA_CORPUS:
        return _KAFKA_CORPUS
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.scenario import default_scenario
    from peerwatch.schemas.registry import SCHEMA_NAMES

    stream_schema = {"samples": "NodeGpuSample", "job-events": "JobEvent",
                     "node-events": "NodeStateEvent", "step-times": "StepTime"}  # fmt: skip
    corpus: dict[str, list[tuple[bytes | None, bytes]]] = {}
    codecs = {name: AvroCodec(name) for name in SCHEMA_NAMES}
    fleet = Fleet(default_scenario(nodes=4, gpus_per_node=8, duration_s=90, seed=1))
    for tick in fleet.ticks():
        for rec in tick:
            schema = stream_schema.get(rec.stream)
            if schema is not None:
                value = codecs[schema].encode(rec.value)
                corpus.setdefault(schema, []).append((rec.key.encode(), value))
    gen = _generator()
    rng = Random(12)
    for name in SCHEMA_NAMES:
        node = gen.to_node(strip_logical_types(raw_schema(name)))
        for _ in range(40):
            with contextlib.suppress(CodecError):  # a random string may not encode (surrogate)
                record = gen.generate(node, rng)
                key = str(record.get("node") or record.get("job_id") or "k").encode(
                    "utf-8", "replace"
                )
                corpus.setdefault(name, []).append((key, codecs[name].encode(record)))
                if name == "StragglerFinding":  # the internal findings topic: JSON, key node
                    corpus.setdefault("node-findings", []).append(
                        (key, json.dumps(record).encode())
                    )
        _KAFKA_OTHER_FRAMES.append(codecs[name].encode(gen.generate(node, rng))[:10])
    from peerwatch.settings import Settings
    from peerwatch.streams.live.published_settings import settings_record

    tree = Settings()
    corpus["settings"] = [settings_record(tree, 1_767_225_000_000 + i) for i in range(3)]
    hot, producer = _hot_stage()
    for key, value in corpus["JobEvent"][:6]:  # the simulator's job events come first
        hot.jobs.apply_message(FakeMessage("je", 0, 0, key, value))
    samples = [
        FakeMessage("s", 0, i, k, v) for i, (k, v) in enumerate(corpus["NodeGpuSample"][:360])
    ]
    hot.take(samples)
    corpus["window-batches"] = [
        (p.key, p.value) for p in producer.sent if p.topic == "b" and p.value
    ]
    # the fleet watch's verdicts, as its channel sends them to the others (handlers._judged)
    starts = sorted(
        {json.loads(v)["start"] for k, v in corpus["window-batches"] if k == b"~census"}
    )
    corpus["window-batches"] += [
        (b"~fleet", json.dumps({"kind": "fleet", "until": s + 5000,
                                "shifted": {str(s): {"": 0.93}} if i % 2 else {}}).encode())
        for i, s in enumerate(starts)
    ]  # fmt: skip
    from peerwatch.streams.live.window_batches import WindowBatchCodec, is_window_batch, older_json

    batches = WindowBatchCodec()
    corpus["window-batches-json"] = []  # as older workers sent them
    for key, value in corpus["window-batches"]:
        if is_window_batch(value):
            corpus["window-batches-json"].append((key, older_json(batches.decode_batch(value))))
    corpus["network"] = _network_messages()
    _KAFKA_CORPUS.update(corpus)
    return corpus


def _network_messages() -> list[tuple[bytes | None, bytes]]:
    """The hot stage's ``network`` messages (each job's ports over a window, JSON) of a
    simulated 8-node job with 2 ports a node, a minute long."""
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.scenario import parse_scenario
    from peerwatch.schemas.columns import tables_from_records
    from peerwatch.streams.core.allocation import AllocationTable
    from peerwatch.streams.core.network_jobs import job_ports_json
    from peerwatch.streams.core.network_stage import NetworkStage
    from peerwatch.streams.core.windows import SAMPLE_SPEC, WindowAggregator

    fleet = Fleet(parse_scenario({
        "fleet": {"nodes": 8, "gpus_per_node": 2, "duration_s": 60, "nics_per_node": 2},
        "jobs": [{"job_id": "7", "gpus": 16, "first_node": 0, "duration_s": 7200}],
    }))  # fmt: skip
    alloc = AllocationTable()
    network, agg = NetworkStage(alloc), WindowAggregator(alloc, 5, 2)
    samples = []
    for rec in (r for tick in fleet.ticks() for r in tick):
        if rec.stream == "job-events":
            alloc.apply_event(rec.value)
        elif rec.stream == "nic-samples":
            network.add_nic([rec.value])
        elif rec.stream == "samples":
            samples.append(rec.value)
    agg.add_columns(tables_from_records(SAMPLE_SPEC, samples, agg.strings))
    ports, _ = network.closed(agg.pop_all())
    return [(jp.job_id.encode(), json.dumps(job_ports_json(jp)).encode()) for jp in ports]


def _hot_stage(
    lateness_s: float = 2, job_partitions: int = 2, batch_max: int = 500
) -> tuple[Any, FakeProducer]:
    """The live hot stage of one worker, samples partition 0 assigned (nothing committed).
    scripts/bench_stage3.py runs it with the worker's lateness and batch size."""
    from confluent_kafka import TopicPartition

    from peerwatch.settings import Settings, with_overrides
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.hot_spec import HotTopics
    from peerwatch.streams.live.hot_stage import HotStage

    class NoCommits:
        def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
            return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]

    settings = with_overrides(Settings(), {"detector.window_s": 5, "stream.lateness_s": lateness_s,
                                           "stream.batch_max": batch_max,
                                           "stream.allocation_retention_s": 3600})  # fmt: skip
    hot = HotStage(settings, "fz", HotTopics("s", "je", "b", "dead", job_partitions, "f", "nf"),
                   StreamCounters())  # fmt: skip
    producer = FakeProducer()
    hot.delivery.producer = producer
    hot._on_assign(NoCommits(), [TopicPartition("s", 0)])
    return hot, producer


def _messages(rng: Random, kinds: list[tuple[str, str]], n: int) -> list[tuple[FakeMessage, bool]]:
    """``n`` hostile messages; ``kinds``: (corpus kind, topic). With each, whether it is a
    valid message as its producer sent it (key and value unchanged)."""
    corpus = kafka_corpus()
    out = []
    for i in range(n):
        kind, topic = rng.choice(kinds)
        key, value = rng.choice(corpus[kind])
        hkey, key_ok = _hostile_key(rng, key)
        hvalue, value_ok = _hostile_value(
            rng, value, kind not in ("window-batches-json", "node-findings", "network")
        )
        msg = FakeMessage(topic, rng.randrange(2), 1000 + i, hkey, hvalue, _hostile_headers(rng))
        out.append((msg, key_ok and value_ok))
    return out


def _check_dead_letters(sent: list[Produced], topic: str, messages: list[FakeMessage]) -> None:
    """Every dead letter says why, and keeps the original key (and value, unless too large)."""
    by_offset = {m.offset(): m for m in messages}
    for p in sent:
        if p.topic != topic:
            continue
        reason = p.headers.get("peerwatch.reason") or p.headers.get("peerwatch.error")
        if not reason:
            raise Failure(f"a dead letter without a reason: {p.headers}")
        offset = p.headers.get("peerwatch.offset")
        if offset is not None and int(offset) in by_offset:
            m, cut = by_offset[int(offset)], "peerwatch.value.size" in p.headers
            key_ok = p.key == m.key() or (cut and p.key is None and len(m.key() or b"") > 1024)
            if not key_ok or (p.value or b"") not in (m.value() or b"", b""):
                raise Failure("a dead letter lost the original key or value")
            if cut and int(p.headers["peerwatch.value.size"]) != len(m.value() or b""):
                raise Failure("a dead letter without its value names another size")


def fuzz_kafka(rng: Random, tmp: Path) -> None:
    """One consumer (chosen at random) fed 1 to 40 hostile messages."""
    target = rng.choice(sorted(KAFKA_CONSUMERS))
    KAFKA_CONSUMERS[target](rng, tmp)


def _kafka_hot(rng: Random, tmp: Path) -> None:
    """The hot stage's job-events reader and its samples batch (``jobs.apply_message``,
    ``take``: what ``run`` calls on each consumed batch)."""
    hot, producer = _hot_stage()
    for msg, _ in _messages(rng, [("JobEvent", "je")], rng.randint(0, 8)):
        _timed("hot job event", lambda m=msg: hot.jobs.apply_message(m))
    batch = [m for m, _ in _messages(rng, [("NodeGpuSample", "s")], rng.randint(1, 40))]
    for i, m in enumerate(batch):
        m._partition, m._offset = 0, i  # one partition's batch, in offset order
    _timed("hot batch", lambda: hot.take(batch))
    codec = AvroCodec("NodeGpuSample")
    refused = set()
    for m in batch:
        try:
            codec.decode(m.value() or b"")
        except CodecError:
            refused.add(m.offset())
    dead = {int(p.headers["peerwatch.offset"]) for p in producer.sent
            if p.topic == "dead" and p.headers.get("peerwatch.reason") == b"undecodable"}  # fmt: skip
    if dead != refused:
        raise Failure(f"hot stage dead-lettered {sorted(dead)} as undecodable, the codec "
                      f"refuses {sorted(refused)}")  # fmt: skip
    _check_dead_letters(producer.sent, "dead", batch)


def _kafka_jobs(rng: Random, tmp: Path) -> None:
    """Stage 3's faust agent: JobsHandler.handle per message, RECORD_ERRORS dead-lettered."""
    from peerwatch.settings import Settings
    from peerwatch.streams.core.allocation import AllocationTable
    from peerwatch.streams.core.job_stage import JobReleaser
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.handlers import RECORD_ERRORS, JobsHandler
    from peerwatch.streams.live.json_table import JsonTable, counting

    settings = Settings()
    meta = AllocationTable(3600_000)
    counters = StreamCounters()
    raw_jobs: dict[bytes, Any] = {}  # bytes, as the faust table holds them
    job_table = JsonTable(raw_jobs, counting(counters, "jobs"))
    pending: dict[bytes, Any] = {}
    handler = JobsHandler(JobReleaser(settings.detector, meta, grace_ms=5000), meta, job_table,
                          pending, job_events_topic="je", step_times_topic="st",
                          retention_ms=3600_000, counters=counters, channels=2)  # fmt: skip
    kinds = [("JobEvent", "je"), ("StepTime", "st"), ("window-batches", "b"),
             ("window-batches", "b"), ("window-batches", "b"), ("window-batches-json", "b"),
             ("network", "b")]  # fmt: skip
    corpus = kafka_corpus()
    msgs = [
        (FakeMessage("je", 0, i, k, v), True) for i, (k, v) in enumerate(corpus["JobEvent"][:6])
    ]
    msgs += _messages(rng, kinds, rng.randint(1, 40))
    # Twice: the second time after a rebalance (memory forgotten), over tables of which some
    # entries (keys and values) were damaged as a broken changelog could leave them.
    for rebalanced in (False, True):
        if rebalanced:
            for entry in pending.values():  # undamaged, the entries the handler wrote read back
                handler.read_pending(entry)
            _damage_table(rng, raw_jobs)
            _damage_table(rng, pending)
            handler.forget()
        for msg, _valid in msgs:
            try:
                outputs = _timed(
                    "jobs handler",
                    lambda m=msg: handler.handle(m.topic(), m.partition(), m.key(), m.value()),
                )
            except RECORD_ERRORS:
                continue  # the agent dead-letters it
            for out in outputs:
                if out.topic in ("findings", "batches"):
                    json.dumps(out.value)  # the internal topics' JSON serializer
    for table in (raw_jobs, pending):  # raw tables: bytes, as faust's raw serializer wants
        for entry in table.values():
            if not isinstance(entry, bytes):
                raise Failure(f"table entry of type {type(entry).__name__}, not bytes")


def _damage_table(rng: Random, table: dict[bytes, Any]) -> None:
    """Damage some entries of a raw state table: a key or a value mutated, or removed."""
    for key in [k for k in list(table) if rng.random() < 0.3]:
        value = table.pop(key)
        if rng.random() < 0.5:
            table[mutate_bytes(key, rng)] = value
        elif rng.random() < 0.9:
            table[key] = mutate_bytes(value, rng)


def _kafka_policy(rng: Random, tmp: Path) -> None:
    """Stage 4's faust agent: PolicyHandler.handle per message, RECORD_ERRORS dead-lettered."""
    from peerwatch.settings import Settings
    from peerwatch.streams.core.policy_stage import PolicyStage
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.handlers import RECORD_ERRORS, PolicyHandler
    from peerwatch.streams.live.json_table import JsonTable, counting

    counters = StreamCounters()
    raw: dict[bytes, Any] = {}  # bytes, as the faust table holds them
    handler = PolicyHandler(PolicyStage(Settings().policy), JsonTable(raw, counting(counters, "policy")),
                            findings_topic="nf", health_topic="h", counters=counters)  # fmt: skip
    kinds = [("node-findings", "nf"), ("HealthCheckResult", "h"), ("NodeStateEvent", "ne")]
    msgs = _messages(rng, kinds, rng.randint(1, 40))
    for rebalanced in (False, True):  # the second time over damaged entries (see _kafka_jobs)
        if rebalanced:
            _damage_table(rng, raw)
            handler.forget()
        for msg, _valid in msgs:
            try:
                _timed(
                    "policy handler", lambda m=msg: handler.handle(m.topic(), m.key(), m.value())
                )
            except RECORD_ERRORS:
                continue
    for entry in raw.values():
        if not isinstance(entry, bytes):
            raise Failure(f"policy entry of type {type(entry).__name__}, not bytes")


_EXPORTED = [("GpuWindow", "w"), ("JobEvent", "je"), ("StragglerFinding", "f"),
             ("DrainRecommendation", "r"), ("HealthCheckResult", "h"), ("DrainAction", "a")]  # fmt: skip


def _kafka_export(rng: Random, tmp: Path) -> None:
    """The OTLP and Alertmanager exporters' consume loop (``ExportLoop.handle``) with their real
    sinks, dead letters through ``KafkaDeadLetter``."""
    from peerwatch.exporters.alertmanager import AlertSink, book_for
    from peerwatch.exporters.alerts import to_api
    from peerwatch.exporters.consume import ExportLoop
    from peerwatch.io.deadletter import KafkaDeadLetter
    from peerwatch.settings import AlertmanagerSettings

    producer = FakeProducer()
    otlp = rng.random() < 0.5
    sink: Any
    if otlp:
        sink, reader = _otlp_sink()
    else:
        sink = AlertSink(book_for(AlertmanagerSettings()))
    loop = ExportLoop(None, sink, deadletter=KafkaDeadLetter(producer, "dead"))  # type: ignore[arg-type]
    msgs = [m for m, _ in _messages(rng, _EXPORTED, rng.randint(1, 40))]
    for msg in msgs:
        _timed("export handle", lambda m=msg: loop.handle(m))
    st = loop.stats
    if st.records + st.undecodable + st.unmappable != len(msgs):
        raise Failure(f"export: {len(msgs)} messages, {st}")
    rejected = st.undecodable + st.unmappable
    sent = sum(1 for p in producer.sent if p.topic == "dead")
    if sent != st.deadlettered or st.deadlettered != rejected:
        raise Failure(f"export: {rejected} rejected, {st.deadlettered} dead-lettered, {sent} sent")
    _check_dead_letters(producer.sent, "dead", msgs)
    if otlp:
        _timed("otlp collect", reader.get_metrics_data)
        sink.close()
    else:
        now_ms = 1_767_225_600_000
        json.dumps([to_api(a, now_ms, 60_000) for a in sink.book.due(now_ms)])


def _otlp_sink() -> tuple[Any, Any]:
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from peerwatch.exporters.otlp_sdk import OtlpSink
    from peerwatch.settings import ExportSettings

    reader = InMemoryMetricReader()
    sink = OtlpSink(ExportSettings(event_delay_s=0.05), metric_exporter=None,
                    log_exporter=InMemoryLogRecordExporter(), metric_readers=[reader])  # type: ignore[no-untyped-call]  # fmt: skip
    return sink, reader


def _kafka_archive(rng: Random, tmp: Path) -> None:
    """The archiver's consume loop (``ArchiveLoop.handle``), a real writer; what it wrote is
    read back."""
    from peerwatch.exporters.archive import ArchiveWriter
    from peerwatch.exporters.archive_loop import ArchiveLoop, archived_topics
    from peerwatch.io.deadletter import KafkaDeadLetter

    class Commits:
        def commit_offsets(self, offsets: Any) -> None:
            pass

    topics = {f"t.{s}": s for s in ("NodeGpuSample", "JobEvent", "NodeStateEvent",
                                     "HealthCheckResult", "StepTime", "GpuWindow",
                                     "StragglerFinding", "DrainRecommendation", "DrainAction",
                                     "NodeNicSample")}  # fmt: skip
    assert sorted(topics.values()) == sorted(archived_topics().values())
    root = tmp / f"archive{rng.randrange(1 << 30)}"
    writer = ArchiveWriter(root, topics)
    writer.recover()  # as peerwatch archive starts it
    producer = FakeProducer()
    loop = ArchiveLoop(Commits(), writer, topics, deadletter=KafkaDeadLetter(producer, "dead"))  # type: ignore[arg-type]
    msgs = [m for m, _ in _messages(rng, [(s, t) for t, s in topics.items()], rng.randint(1, 30))]
    for msg in msgs:
        _timed("archive handle", lambda m=msg: loop.handle(m))  # type: ignore[arg-type]
    st = loop.stats
    if st.records + st.undecodable + st.bad_time != len(msgs):
        raise Failure(f"archive: {len(msgs)} messages, {st}")
    loop.commit()
    writer.close()
    _check_dead_letters(producer.sent, "dead", msgs)
    read = 0
    for path in sorted(root.rglob("*.avro*")):
        topic = next(t for t in topics if t in path.parts)
        stats = ReadStats()
        read += sum(1 for _ in read_file(path, current_schema(topics[topic]), stats=stats))
    if read != st.records:
        raise Failure(f"archive: {st.records} records written, {read} read back")


def _kafka_drain(rng: Random, tmp: Path) -> None:
    """The drain controller's message handling (``DrainController.handle``): recommendations and
    node events, a state file, audit and dead letters through its AuditPublisher."""
    from peerwatch.exporters.drain.config import DrainSettings
    from peerwatch.exporters.drain.controller import AuditPublisher, DrainController, Topics
    from peerwatch.exporters.drain.decide import NodeFacts
    from peerwatch.exporters.drain.state import StateStore

    class Slurm:  # the cluster as scontrol would list it (the Slurm side is not under test)
        def nodes(self) -> list[NodeFacts]:
            return [NodeFacts(f"gpu{i:05d}", "MIXED", partitions=("gpu",)) for i in range(8)]

        def drain(self, node: str, reason: str) -> None:
            if not isinstance(node, str) or "\n" in reason:
                raise Failure(f"drain of {node!r} with reason {reason!r}")

        def resume(self, node: str) -> None:
            pass

    class Clock:
        def now_ms(self) -> int:
            return 1_767_225_600_000

        def monotonic_s(self) -> float:
            return 1000.0

    producer = FakeProducer()
    topics = Topics("r", "ne", "a", "dead")
    settings = DrainSettings(enforce=rng.random() < 0.5)
    store = StateStore(tmp / f"drain{rng.randrange(1 << 30)}.json")
    controller = DrainController(None, AuditPublisher(producer, topics, 1.0), Slurm(), store,
                                 settings, topics, clock=Clock(), sleep=lambda _s: None)  # type: ignore[arg-type]  # fmt: skip
    msgs = _messages(
        rng, [("DrainRecommendation", "r"), ("NodeStateEvent", "ne")], rng.randint(1, 20)
    )
    for msg, _ in msgs:
        if not _timed("drain handle", lambda m=msg: controller.handle(m)):
            raise Failure("the drain controller did not finish a message")
    _check_dead_letters(producer.sent, "dead", [m for m, _ in msgs])


def _kafka_replay(rng: Random, tmp: Path) -> None:
    """Replay from Kafka: the messages of a time range into input records (``message_records``,
    what ``kafka_records`` calls on what it consumed)."""
    from peerwatch.io.archive.layout import record_time_ms
    from peerwatch.streams.offline.replay import TimeRange, sort_records
    from peerwatch.streams.offline.replay_kafka import message_records

    kinds = [("NodeGpuSample", "samples"), ("JobEvent", "job-events"),
             ("NodeStateEvent", "node-events"), ("StepTime", "step-times")]  # fmt: skip
    msgs = _messages(rng, kinds, rng.randint(1, 40))
    keep = None if rng.random() < 0.5 else frozenset({"gpu00000", "gpu00001"})
    pairs = [(m.topic(), m) for m, _ in msgs]
    records, bad = _timed("replay", lambda: message_records(pairs, keep))
    if len(records) + bad > len(msgs):
        raise Failure(f"replay: {len(records)} records + {bad} bad of {len(msgs)} messages")
    span = TimeRange(-(2**63), 2**63)  # what kafka_records does next
    _timed("replay sort", lambda: sort_records((s, v) for s, v in records
                                               if span.admits(s, record_time_ms(v))))  # fmt: skip


def _kafka_settings(rng: Random, tmp: Path) -> None:
    """Replay's reader of the published stream settings (``published_records``, what
    ``read_published`` calls on each value) and its choice of the live record
    (``live_settings``): a bad record may only be refused naming its setting (ConfigError)."""
    from peerwatch.errors import ConfigError
    from peerwatch.settings import Settings
    from peerwatch.streams.live.published_settings import live_settings, published_records

    msgs = _messages(rng, [("settings", "ss")], rng.randint(1, 10))
    records = _timed("settings", lambda: published_records([m.value() for m, _ in msgs]))
    tree = Settings()
    with contextlib.suppress(ConfigError):
        _timed("live settings", lambda: live_settings(tree, records, 1_767_225_600_000))


# -- alertmanager ------------------------------------------------------------------------------
#: A good answer of Alertmanager to ``POST /api/v2/alerts``.
GOOD_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n"
#: The client's deadline per request in the fuzz loop (s): trickling answers end at it.
ALERTMANAGER_TIMEOUT_S = 0.3


def _hostile_answer(rng: Random) -> tuple[Any, str]:
    """An answer (``hostile_http.Answer``) and what it is: "good" (must be sent), "refused" (a
    well-formed non-2xx answer: must fail) or "hostile" (either, never a crash or a hang)."""
    from hostile_http import send_for_ever

    kind = rng.randrange(9)
    if kind == 0:
        return (lambda conn, stop: conn.sendall(GOOD_ANSWER)), "good"
    if kind == 1:
        status = rng.choice([301, 400, 404, 413, 429, 500, 503])
        body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 400)))
        answer = (f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                  + body)  # fmt: skip
        return (lambda conn, stop: conn.sendall(answer)), "refused"
    if kind == 2:  # random bytes
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(0, 3000)))
        return (lambda conn, stop: conn.sendall(junk)), "hostile"
    if kind == 3:  # the good answer damaged (status line, headers or length)
        damaged = mutate_bytes(GOOD_ANSWER, rng)
        return (lambda conn, stop: conn.sendall(damaged)), "hostile"
    if kind == 4:  # a header line of up to 300 KiB
        pad = b"a" * rng.randint(1, 300 * 1024)
        answer = b"HTTP/1.1 200 OK\r\nX-Pad: " + pad + b"\r\nContent-Length: 0\r\n\r\n"
        return (lambda conn, stop: conn.sendall(answer)), "hostile"
    if kind == 5:  # a body shorter, or chunks that lie about their size
        head = rng.choice([b"Content-Length: %d\r\n" % rng.randint(1, 10**12),
                           b"Transfer-Encoding: chunked\r\n"])  # fmt: skip
        body = rng.choice([b"{}", b"5\r\nab\r\n", b"fffffffffffffffffff\r\n", b"-1\r\n", b""])
        answer = b"HTTP/1.1 200 OK\r\n" + head + b"\r\n" + body
        return (lambda conn, stop: conn.sendall(answer)), "hostile"
    if kind == 6:  # a body without end
        chunk = bytes(rng.randrange(256) for _ in range(rng.choice([1, 1024, 65536])))

        def endless(conn: Any, stop: Any) -> None:
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
            send_for_ever(conn, stop, chunk, 0.0)

        return endless, "hostile"
    if kind == 7:  # one byte at a time, in the status line, the headers or the body
        start = GOOD_ANSWER[: rng.randrange(len(GOOD_ANSWER))]

        def trickle(conn: Any, stop: Any) -> None:
            conn.sendall(start)
            send_for_ever(conn, stop, b"a", 0.02)

        return trickle, "hostile"
    return (lambda conn, stop: None), "hostile"  # hangs up without a word


def fuzz_alertmanager(rng: Random, tmp: Path) -> None:
    """The Alertmanager sender (``AlertSender.tick`` with its real httpx client) against a
    hostile HTTP peer on 127.0.0.1: the tick returns within the deadline (plus slack), nothing
    escapes it, a failed alert is kept for the retry, a good answer sends it, a refusal does not.
    """
    from fakes import FakeClock
    from hostile_http import book_with_one_alert, serving

    from peerwatch.exporters.alertmanager import AlertmanagerClient, AlertSender

    answer, kind = _hostile_answer(rng)
    clock = FakeClock()
    book = book_with_one_alert(clock.now_ms())
    with serving(answer) as server:
        client = AlertmanagerClient(server.url, ALERTMANAGER_TIMEOUT_S)
        sender = AlertSender(book, client, retry_max_s=8.0, clock=clock)
        sent = _timed("AlertSender.tick", sender.tick)
    if sent not in (0, 1) or sent + sender.stats.failures != 1:
        raise Failure(f"tick sent {sent} with {sender.stats.failures} failures")
    if kind == "good" and sent != 1:
        raise Failure("a good answer was not taken")
    if kind == "refused" and sent != 0:
        raise Failure("a refusal was taken as sent")
    if not sent and len(book.due(clock.now_ms())) != 1:
        raise Failure("a failed alert was not kept for the retry")


# -- config ----------------------------------------------------------------------------------
HOSTILE_CONFIG_VALUES = [
    "0", "-1", "1e308", "-1e308", "inf", "nan", "9223372036854775807", "18446744073709551616",
    "9" * 4301, "1" * 4000, "0.0000000001", "true", '""', '"a\\u0000b"', '"' + "x" * 5000 + '"',
    "[" * 3000 + "]" * 3000, "{a=" * 3000 + "1" + "}" * 3000, "[1, 2, 99999999999]",
    "{ gpu = -1 }", "{ gpu = 1e300 }", '"\\u202eevil"',
]  # fmt: skip


def fuzz_config(rng: Random, tmp: Path) -> None:
    """The config file and environment: the printed tree (``peerwatch config``) with hostile
    values put on random settings, or its bytes damaged (not UTF-8, NULs, cut); and hostile
    environment values. Loading gives settings whose every number lies within its declared
    range, or a ConfigError naming the setting (or the file); nothing else escapes."""
    from dataclasses import fields as dc_fields

    from peerwatch.errors import ConfigError
    from peerwatch.settings import TABLES, Settings, catalogue, env_name, load_settings
    from peerwatch.settings_base import range_of
    from peerwatch.settings_doc import to_toml

    lines = to_toml(Settings()).splitlines()
    settable = [i for i, line in enumerate(lines) if " = " in line and not line.startswith("#")]
    for _ in range(rng.randint(1, 4)):
        i = rng.choice(settable)
        lines[i] = lines[i].split(" = ", 1)[0] + " = " + rng.choice(HOSTILE_CONFIG_VALUES)
    data = ("\n".join(lines) + "\n").encode()
    if rng.random() < 0.3:
        data = mutate_bytes(data, rng)
    cfg = tmp / "pw.toml"
    cfg.write_bytes(bytes(data))
    env: dict[str, str] = {}
    if rng.random() < 0.5:
        table, name, _ = rng.choice(list(catalogue()))
        env[env_name(table, name)] = rng.choice(HOSTILE_CONFIG_VALUES).strip('"')
    try:
        tree = _timed("config", lambda: load_settings(cfg, env=env))
    except ConfigError as exc:
        if not exc.field:
            raise Failure(f"config error naming no setting: {exc}") from exc
        return
    for table, cls in TABLES.items():
        for f in dc_fields(cls):
            bounds, value = range_of(f), getattr(getattr(tree, table), f.name)
            if (
                bounds is not None
                and isinstance(value, int | float)
                and not bounds[0] <= value <= bounds[1]
            ):
                raise Failure(f"{table}.{f.name} = {value!r} loaded outside {bounds}")


KAFKA_CONSUMERS: dict[str, Callable[[Random, Path], None]] = {
    "hot": _kafka_hot,
    "jobs": _kafka_jobs,
    "policy": _kafka_policy,
    "export": _kafka_export,
    "archive": _kafka_archive,
    "drain": _kafka_drain,
    "replay": _kafka_replay,
    "settings": _kafka_settings,
}


# -- step times (issue 39 item 5) ----------------------------------------------------------------
#: A small job with step times, and a GPU slowed (findings to compare).
_STEP_SCENARIO = {
    "fleet": {"nodes": 2, "gpus_per_node": 4, "interval_s": 5.0, "duration_s": 400, "seed": 9,
              "step_times": True},
    "jobs": [{"job_id": "42", "gpus": 8, "first_node": 0, "duration_s": 7200, "warmup_s": 0}],
    "faults": [{"name": "sm_clock_drop", "node": "gpu00001", "gpu_index": 2, "start_s": 60,
                "params": {"pct": 8}}],
}  # fmt: skip


def _step_records() -> tuple[list[Any], list[Any]]:
    """The scenario's records and its findings (computed once)."""
    if not _STEP_CACHE:
        from peerwatch.producers.sim.fleet import Fleet
        from peerwatch.producers.sim.scenario import parse_scenario
        from peerwatch.settings import Settings
        from peerwatch.streams.core.pipeline import FINDING, Pipeline

        records = [r for batch in Fleet(parse_scenario(_STEP_SCENARIO)).ticks() for r in batch]
        clean = [o.value for o in Pipeline(Settings()).run(records) if o.kind == FINDING]
        if not clean:
            raise Failure("the step-time scenario finds nothing: nothing to compare")
        _STEP_CACHE.extend([records, clean])
    return _STEP_CACHE[0], _STEP_CACHE[1]


_STEP_CACHE: list[Any] = []


def _hostile_duration(rng: Random) -> Any:
    """A ``step_duration_ms`` a broken timer or a hostile producer could send."""
    from peerwatch.streams.core.job_stage import STEP_MS_MAX

    return rng.choice([
        math.nan, -math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, -5e-324, 0.0, -0.0,
        STEP_MS_MAX, math.nextafter(STEP_MS_MAX, math.inf), -1.0, 2**63 - 1, -(2**63), 2**80,
        struct.unpack("<d", rng.randbytes(8))[0],  # any double, NaN payloads included
        rng.uniform(-10.0, 2 * STEP_MS_MAX), rng.uniform(0.0, 5000.0), True, None, "500", [],
    ])  # fmt: skip


def _step_taken(value: Any) -> bool:
    """The oracle: a duration the input check must take (a finite number of 0 to a day, ms)."""
    from peerwatch.streams.core.job_stage import STEP_MS_MAX

    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0.0 <= value <= STEP_MS_MAX


def fuzz_step_times(rng: Random, tmp: Path) -> None:
    """1 to 4 StepTime records with hostile durations added to a job's step times: replay
    counts each refused one invalid and, when all are refused, finds exactly what it found
    without them; live, stage 3's handler raises InvalidRecordError (dead-lettered) for the
    same ones; a taken one never puts a non-finite step time on a window."""
    from peerwatch.settings import Settings
    from peerwatch.streams.core.model import InvalidRecordError
    from peerwatch.streams.core.pipeline import FINDING, INVALID, WINDOW, Pipeline

    records, clean = _step_records()
    steps = [i for i, r in enumerate(records) if r.stream == "step-times"]
    added = []
    fed = list(records)
    for at in sorted(rng.sample(steps, rng.randint(1, 4)), reverse=True):
        rec = records[at]
        value = {**rec.value, "step_duration_ms": _hostile_duration(rng)}
        added.append(value["step_duration_ms"])
        fed.insert(at + 1, type(rec)(rec.stream, rec.key, value))
    outs = _timed("Pipeline.run", lambda: list(Pipeline(Settings()).run(fed)))
    refused = sum(1 for o in outs if o.kind == INVALID and o.value.get("stream") == "step-times")
    expected = sum(1 for v in added if not _step_taken(v))
    if refused != expected:
        raise Failure(f"replay refused {refused} of the step times {added!r}, not {expected}")
    if expected == len(added) and [o.value for o in outs if o.kind == FINDING] != clean:
        raise Failure(f"refused step times {added!r} changed the findings")
    for o in outs:
        step = o.value.get("step_ms") if o.kind == WINDOW else None
        if step is not None and not math.isfinite(step):
            raise Failure(f"a window got step_ms {step!r} from {added!r}")
    handler = _jobs_handler()
    codec = AvroCodec("StepTime")
    for duration in added:
        value = {**records[steps[0]].value, "step_duration_ms": duration}
        try:
            body = codec.encode(value)
        except (CodecError, TypeError, ValueError, OverflowError):
            continue  # not a StepTime on the wire: the producer's codec refuses it
        wire = codec.decode(body)["step_duration_ms"]
        try:
            _timed("jobs handler", lambda b=body: handler.handle("st", 0, b"42", b))
            taken = True
        except InvalidRecordError:
            taken = False
        if taken != _step_taken(wire):
            raise Failure(f"live {'took' if taken else 'refused'} step_duration_ms {wire!r}")


def _jobs_handler() -> Any:
    """A fresh stage-3 handler (step times on topic ``st``)."""
    from peerwatch.settings import Settings
    from peerwatch.streams.core.allocation import AllocationTable
    from peerwatch.streams.core.job_stage import JobReleaser
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.handlers import JobsHandler

    meta = AllocationTable(3600_000)
    return JobsHandler(JobReleaser(Settings().detector, meta), meta, {}, {},
                       job_events_topic="je", step_times_topic="st", retention_ms=3600_000,
                       counters=StreamCounters())  # fmt: skip


# -- topic folders (issue 39 item 9) -------------------------------------------------------------
_FOLDER_SCENARIO = {
    "fleet": {"nodes": 2, "gpus_per_node": 2, "interval_s": 10.0, "duration_s": 120, "seed": 4},
    "jobs": [{"job_id": "42", "gpus": 4, "first_node": 0, "duration_s": 7200, "warmup_s": 0}],
    "faults": [],
}  # fmt: skip
_SAMPLES, _JOB_EVENTS = "peerwatch.gpu.samples", "peerwatch.slurm.job-events"
_WHOLE = (0, 253_402_300_800_000)  # 1970 up to the end of year 9999, ms


def _hostile_entry_name(rng: Random) -> str:
    """A name for an entry of a topic folder: like an archive file's, its date, hour, ``k``
    and suffix random (many impossible), or odd (Unicode digits, a near miss)."""
    if rng.random() < 0.15:
        return rng.choice(["labels.jsonl", "2026-01-01T00.AVRO", "2026-01-01T00.avro~",
                           "\uff12\uff10\uff12\uff16-01-01T00.avro",  # fullwidth digits
                           "2026-01-01T00.avro.tmp", ".avro", "2026-01-01T01.avro\n",
                           "2026-1-1T0.avro", "2026-01-01T00.-1.avro", "x" * 200 + ".avro"])  # fmt: skip
    year = rng.choice([0, 1, 1969, 1970, 2026, 9999, rng.randint(0, 9999)])
    month = rng.choice([0, 1, 2, 12, 13, rng.randint(0, 99)])
    day = rng.choice([0, 1, 29, 30, 31, 32, rng.randint(0, 99)])
    hour = rng.choice([0, 23, 24, rng.randint(0, 99)])
    suffix = rng.choice(
        [".avro", ".avro", ".1.avro", ".avro.part", f".{rng.randint(0, 10**6)}.avro"]
    )
    return f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}{suffix}"


def _archive_name(name: str) -> tuple[bool, bool]:
    """The oracle: (named like an archive file, its hour exists and lies in 1970..9999)."""
    m = re.fullmatch(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2})(\.[0-9]+)?\.avro(\.part)?", name)
    if m is None:
        return False, False
    try:
        dt.datetime(*(int(g) for g in m.groups()[:4]))
    except ValueError:
        return True, False
    return True, int(m.group(1)) >= 1970


def fuzz_topic_folders(rng: Random, tmp: Path) -> None:
    """1 to 6 hostile entries planted in the samples and job-events folders of a small archive
    (misnamed files, folders and dangling links named like hours, garbage under a real hour's
    name, odd names): every replay reader keeps exactly the archive's records and counts each
    misnamed entry; the job view reads it; the archiver recovers and retains beside them and
    never deletes one."""
    from peerwatch.exporters.archive import ArchiveSettings, ArchiveWriter
    from peerwatch.streams.offline.job_records import archive_job_records, archive_span_ms
    from peerwatch.streams.offline.replay import TimeRange, archive_records, column_archive_records
    from peerwatch.streams.offline.sample_runs import SAMPLE_RUN

    clean = tmp / "folders-clean"
    if not clean.exists():
        from peerwatch.producers.sim.fleet import Fleet
        from peerwatch.producers.sim.publish import write_archive
        from peerwatch.producers.sim.scenario import parse_scenario

        write_archive(Fleet(parse_scenario(_FOLDER_SCENARIO)), clean)
    root = tmp / f"folders{rng.randrange(1 << 30)}"
    shutil.copytree(clean, root)
    misnamed, garbage, kept = 0, 0, []
    for _ in range(rng.randint(1, 6)):
        path = root / rng.choice([_SAMPLES, _JOB_EVENTS]) / _hostile_entry_name(rng)
        if path.exists() or path.is_symlink():
            continue
        kind = rng.choice(["empty", "garbage", "folder", "full-folder", "dangling", "to-folder"])
        if kind in ("empty", "garbage"):
            path.write_bytes(
                b"" if kind == "empty" else b"\x00" + rng.randbytes(rng.randint(0, 300))
            )
        elif kind in ("folder", "full-folder"):
            path.mkdir()
            if kind == "full-folder":
                (path / "2026-01-01T00.avro").write_bytes(b"Obj\x01")
        else:
            os.symlink(root / ("no-such" if kind == "dangling" else _SAMPLES), path)
        like, valid = _archive_name(path.name)
        if like and (not valid or kind not in ("empty", "garbage")):
            misnamed += 1
            kept.append(path)
        elif like:
            garbage += 1  # a real hour's name: read, its header refused
        else:
            kept.append(path)  # another file of the folder: never touched
    span = TimeRange(*_WHOLE)
    want: dict[str, Any] = {}
    for name, where in (("clean", clean), ("planted", root)):
        stats = ReadStats()
        decoded = _timed("archive_records", lambda w=where, st=stats: [
            (s, k, v.get("ts_ms")) for s, k, v in archive_records(w, span, stats=st)])  # fmt: skip
        cstats = ReadStats()
        runs = _timed("column_archive_records", lambda w=where, st=cstats: [
            (s, v[""].n if s == SAMPLE_RUN else v.get("ts_ms"))
            for s, _, v in column_archive_records(w, span, {}, stats=st)])  # fmt: skip
        want[name] = (decoded, stats, runs, cstats)
    decoded, stats, runs, cstats = want["planted"]
    if decoded != want["clean"][0] or runs != want["clean"][2]:
        raise Failure(f"planted entries changed the records read ({misnamed} misnamed)")
    for what, st in (("decoded", stats), ("columns", cstats)):
        if st.misnamed != misnamed or st.bad_files != garbage:
            raise Failure(f"{what} path counted {st.as_dict()}, not {misnamed} misnamed and "
                          f"{garbage} bad files")  # fmt: skip
    _timed("archive_span_ms", lambda: archive_span_ms(root))
    _timed("archive_job_records", lambda: archive_job_records(root, "42"))
    topics = {_SAMPLES: "NodeGpuSample", _JOB_EVENTS: "JobEvent"}
    writer = ArchiveWriter(root, topics, ArchiveSettings(retention_days=1))
    _timed("ArchiveWriter.recover", writer.recover)
    _timed("ArchiveWriter.retain", lambda: writer.retain(_WHOLE[1]))
    writer.close()
    gone = [p.name for p in kept if not (p.exists() or p.is_symlink())]
    if gone:
        raise Failure(f"the archiver deleted entries that are no archive files: {gone}")
    shutil.rmtree(root)


# -- sysfs -------------------------------------------------------------------------------------
SYSFS_TREE = Path(__file__).resolve().parents[1] / "tests" / "data" / "sysfs" / "hgx"
_SYSFS_PORTS = ("class/infiniband/mlx5_0/ports/1", "class/infiniband/mlx5_2/ports/1")
_HOSTILE_SYSFS = (b"", b"\n", b"-1\n", b"18446744073709551615\n", b"99999999999999999999999\n",
                  b"\xff\xfe\xfd", b"N/A (no PMA)\n", b"4: ACTIVE\x00junk", b"1" * 5000,
                  b"400 Gb/sec (4X NDR)\n", b"0x10\n", b" 12 \n")  # fmt: skip


def _nic_record(root: Path) -> dict[str, Any]:
    reader = NicReader(SysfsTree(root))
    ports = discover_ports(reader, {0: "00000000:04:00.0"}, ("mlx5_0/1", "mlx5_2/1", "ens5np0"))
    sampler = NicSampler(reader, ports, node="n", interval_ms=1000,
                         clock=_FixedClock(), agent_run_id="r")  # fmt: skip
    return sampler.sample(0)


class _FixedClock:
    def now_ms(self) -> int:
        return 1_700_000_000_000


def fuzz_sysfs(rng: Random, tmp: Path) -> None:
    """The recorded NIC tree with 1 to 6 counter, state or rate files damaged (mutated bytes,
    hostile contents, removed, or a folder in their place): the agent's sampler and the health
    check's counter judgement both run; every untouched value reads as before, every damaged
    counter is null or a valid long, each null is counted, the record encodes."""
    root = tmp / f"sys{rng.randrange(1 << 30)}"
    shutil.copytree(SYSFS_TREE, root, symlinks=True)
    clean = _nic_record(root)
    files = [f"{port}/{sub}/{name}" for port in _SYSFS_PORTS
             for sub, names in (("counters", IB_COUNTERS), ("hw_counters", ("np_cnp_sent",)))
             for name in names] + [f"{port}/{n}" for port in _SYSFS_PORTS
                                   for n in ("state", "phys_state", "rate", "link_layer")]  # fmt: skip
    files = [f for f in files if (root / f).exists()]
    damaged = rng.sample(files, rng.randint(1, 6))
    for rel in damaged:
        path = root / rel
        kind = rng.random()
        if kind < 0.4:
            path.write_bytes(mutate_bytes(path.read_bytes(), rng))
        elif kind < 0.8:
            path.write_bytes(rng.choice(_HOSTILE_SYSFS))
        elif kind < 0.9:
            path.unlink()
        else:
            path.unlink()
            path.mkdir()
    ib = root / "class" / "infiniband"
    state = tmp / f"ib{rng.randrange(1 << 30)}.json"
    _timed("check_ib_counters", lambda: check_ib_counters(ib, state_path=state, now_ms=1))
    record = _timed("NicSampler.sample", lambda: _nic_record(root))
    AvroCodec("NodeNicSample").encode(record)
    _timed("check_ib_counters", lambda: check_ib_counters(ib, state_path=state, now_ms=1001))
    touched = {(r.split("/")[2] + "/1", r.rsplit("/", 1)[1]) for r in damaged}
    before = {p["name"]: p for p in clean["ports"]}
    nulls = 0
    for port in record["ports"]:
        for group in ("counters", "hw_counters"):
            for name, value in port[group].items():
                if (port["name"], name) not in touched:
                    if value != before[port["name"]][group][name]:
                        raise Failure(f"{port['name']} {name} untouched, read {value!r}")
                elif value is None:
                    nulls += 1
                elif not 0 <= value < 1 << 63:
                    raise Failure(f"{port['name']} {name} = {value!r} is not a valid counter")
    if record["read_errors"] < nulls:
        raise Failure(f"{nulls} damaged counters null, {record['read_errors']} counted")
    shutil.rmtree(root)


# -- display: hostile Slurm text through every view ---------------------------------------------
#: Pieces a hostile job name is made of: escape sequences, C1 controls, bidi overrides and
#: isolates, zero-width characters, rich markup, HTML, surrogates, long runs.
_DISPLAY_PIECES = (
    "\x1b[2J",
    "\x1b]0;title\x07",
    "\x1b]8;;http://e/\x1b\\",
    "\x9b31m",
    "\x07",
    "\r",
    "\n",
    "\u202e",
    "\u2066",
    "\u200b",
    "\ufeff",
    "[bold]",
    "[/]",
    "[link=http://e]",
    "</script>",
    "<img src=x>",
    "&amp;",
    "\udcff",
    "名前",
    "x" * 300,
    "gpu00001",
    " ",
)
#: An escape the views may emit themselves: rich's colour codes (SGR).
_SGR = __import__("re").compile("\x1b\\[[0-9;]*m")


def _hostile_text(rng: Random) -> str:
    return "".join(rng.choice(_DISPLAY_PIECES) for _ in range(rng.randint(1, 8)))


def fuzz_display(rng: Random, tmp: Path) -> None:
    """Hostile job names, users, nodes and causes through the job view (plain and coloured, 80
    and 160 columns), the demo view and the report pages: no control or bidi character reaches
    the output, and no record text becomes markup."""
    from peerwatch.demo_view import DemoView
    from peerwatch.display import is_displayable
    from peerwatch.exporters.report import render_job_report, render_report
    from peerwatch.job_view import render_text
    from peerwatch.report.job_summary import summarize_job

    evil = [_hostile_text(rng) for _ in range(4)]
    t0 = 1_767_225_600_000
    windows = [
        {"job_id": "7", "node": node, "gpu_index": g, "window_start_ms": t0 + i * 30_000,
         "window_end_ms": t0 + (i + 1) * 30_000, "clk_ratio": 0.9 if (node, g) == (evil[0], 1) else 1.0,
         "throttle_frac": 0.0, "sm_frac": 0.9, "power_ratio": 0.8, "score": 6.0 if g == 1 else 0.0}
        for i in range(6) for node in (evil[0], "n0") for g in range(2)
    ]  # fmt: skip
    finding = {
        "finding_id": "f", "job_id": "7", "node": evil[0], "gpu_index": 1, "status": "CONFIRMED",
        "window_start_ms": t0, "window_end_ms": t0 + 30_000, "cause": evil[1], "reason": evil[2],
        "features": [{"feature": "clk", "value": 0.9, "peer_median": 1.0, "mad": 0.01, "z": -9.0}],
        "hard_rules": [evil[3]], "windows_flagged": 4, "windows_considered": 4,
    }  # fmt: skip
    job = {"job_id": "7", "kind": "STARTED", "ts_ms": t0, "user": evil[1], "job_name": evil[2],
           "account": evil[3], "allocations": [{"node": evil[0], "gpu_indices": [0, 1]}]}  # fmt: skip
    summary = summarize_job("7", windows, [finding], [], [job])
    view = DemoView()
    view.on_job_event(job)
    view.on_finding(finding)
    view.on_recommendation({"node": evil[0], "action": "DRAIN", "severity": evil[1],
                            "gpu_indices": [1], "cause": evil[2]})  # fmt: skip
    texts = [render_text(summary, colour=c, width=w) for c in (False, True) for w in (80, 160)]
    texts += [view.render(80), view.render(160), view.summary([])[0]]
    for text in texts:
        if not is_displayable(_SGR.sub("", text).replace("\n", "")):
            raise Failure(f"a control or bidi character reached the terminal: {text[:200]!r}")
    events = [("job-events", job)]
    for page in (render_job_report(summary, windows, [finding], [], events),
                 render_report(windows, [finding], [], events)):  # fmt: skip
        body = page.split("<body>", 1)[1].split("<script>", 1)[0]  # before uPlot's code
        if not is_displayable(body.replace("\n", "")) or "<img src=x>" in body:
            raise Failure(f"record text reached the page unescaped: {body[:200]!r}")
        if "</script><" in body.split('type="application/json">', 1)[-1].split("</script>", 1)[0]:
            raise Failure("chart data closed its script element")


TARGETS: dict[str, Callable[[Random, Path], None]] = {
    "archive": fuzz_archive,
    "spool": fuzz_spool,
    "spool-segments": fuzz_spool_segments,
    "slurm": fuzz_slurm,
    "kafka": fuzz_kafka,
    "step-times": fuzz_step_times,
    "topic-folders": fuzz_topic_folders,
    "sysfs": fuzz_sysfs,
    "alertmanager": fuzz_alertmanager,
    "config": fuzz_config,
    "display": fuzz_display,
}
#: Targets that open sockets on 127.0.0.1 (run by the integration tier, not the unit tier).
NETWORK_TARGETS = frozenset({"alertmanager"})


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
