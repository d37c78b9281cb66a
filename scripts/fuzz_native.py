"""Differential fuzzing of the C Avro decoder against the generated Python reader.

For every schema (the current ones, any released version whose wire form differs, and a few
synthetic schemas that use what ours do not: maps, bytes, enums, reversed unions) it generates
random valid records with plain ``random`` (plus the simulator's records for the streams it
produces), encodes them, mutates the bytes, and feeds every input to each *decoder under test*
(:data:`TARGETS`): the C entry point and its Python reference must give the same value (``==``,
same types, floats bit for bit) and end offset, or both refuse. Refusing means raising one of
the documented error classes (C: ValueError, UnicodeDecodeError being one; generated Python:
IndexError, ValueError, KeyError, struct.error); any other exception is a failure on its own.

Mutations: bit flips, byte overwrites, insertions and deletions, truncation at every length
(the first records of each schema), length prefixes made huge, negative or one too long,
array/map block counts inflated or made negative (with and without the byte size that follows a
negative count, and valid negative-count re-encodings), over-long and over-wide varints, union
branches and enum indexes out of range, invalid UTF-8 in strings (0xff, lone continuation
bytes, overlong forms, surrogates ED A0 80...), splices of two records and trailing junk. Before
the loop, the plan recursion guard is checked on synthetic plans nested around ``MAX_DEPTH``
(read from ``schemas/avro_reader.h``) and malformed plans must raise, never crash.

``skip`` must refuse exactly what decode refuses (invalid UTF-8 included) and end where decode
ends; ``skip_lenient`` must step over and refuse what the archive readers' Python lax skip does
(invalid UTF-8, boolean bytes above 1 and longs over 64 bits stepped over); ``decode_columns`` must give the columns that :func:`peerwatch.schemas.columns
.tables_from_records` fills from the generated reader's dicts, or refuse the same records.

Meant to run under AddressSanitizer/UBSan through ``scripts/fuzz_native.sh``, which builds the
C module with sanitizers and passes its folder as ``--module-dir``; without it the normal build
is tested. Exit status: 0 all agreed, 1 a mismatch (each printed with a reproducer), 2 misuse.

    PYTHONPATH=. .venv/bin/python scripts/fuzz_native.py --seconds 30 [--seed 7] [--module-dir D]
    PYTHONPATH=. .venv/bin/python scripts/fuzz_native.py --replay SCHEMA HEX [--offset N]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib.machinery
import importlib.util
import json
import math
import mmap
import os
import re
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from random import Random
from typing import Any

from peerwatch.schemas import native, registry
from peerwatch.schemas.compiled import compile_decoder, compile_encoder, encode_long
from peerwatch.schemas.native import plan_of

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "schemas" / "avro_reader.h"

# ----------------------------------------------------------------------------------------------
# Decoders under test. To test a new C entry point, add a Target to TARGETS: the module it lives
# in (a name of NORMAL_MODULES, built by scripts/fuzz_native.sh's NATIVE_MODULES), how to make the
# C callable and its Python reference for a wire schema, both called as ``fn(buffer, offset)``
# (adapt other signatures with a lambda), and how to compare two successful results.

Fn = Callable[[Any, int], Any]


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down; floats compared bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@dataclass(frozen=True)
class Target:
    """One decoder under test. ``native(module, wire)`` and ``fallback(wire)`` make the two
    callables; ``compare(native_result, fallback_result)`` says whether two successful results
    agree; ``expect(record, end)``, when given, is the result a valid encoding of ``record``
    ending at ``end`` must give (both sides are held to it)."""

    name: str
    module: str
    native: Callable[[Any, Any], Fn]
    fallback: Callable[[Any], Fn]
    compare: Callable[[Any, Any], bool]
    expect: Callable[[Any, int], Any] | None = None
    native_errors: tuple[type[BaseException], ...] = (ValueError,)
    fallback_errors: tuple[type[BaseException], ...] = (
        IndexError,
        ValueError,
        KeyError,
        struct.error,
    )


def column_selection(schema: Any) -> dict[str, Any]:
    """Every field of a record schema that can be a column (scalars, [null, scalar] unions,
    enums defined in place), arrays of records as nested selections; the rest is skipped."""
    out: dict[str, Any] = {}
    for f in schema["fields"]:
        t = f["type"]
        if isinstance(t, list) and len(t) == 2 and "null" in t:
            t = t[1 - t.index("null")]
            if isinstance(t, dict) and t.get("type") == "array":
                continue  # a nullable array is not a table
        kind = t.get("type") if isinstance(t, dict) else t
        if kind in ("long", "int", "boolean", "float", "double", "string", "enum"):
            out[f["name"]] = True
        elif (
            kind == "array" and isinstance(t["items"], dict) and t["items"].get("type") == "record"
        ):
            out[f["name"]] = column_selection(t["items"])
    return out


def _resolved(tables: Any, spec: Any, names: list[str]) -> list[Any]:
    """Tables as plain lists, string codes turned back into strings (codes depend on the order a
    back end meets the strings, the strings do not)."""
    out: list[Any] = []
    for t in spec.tables():
        table = tables[t.path]
        cols = []
        for c in t.columns:
            values = table.values[c.name].tolist()
            if c.kind == "str":
                values = [names[v] for v in values]
            valid = table.valid[c.name].tolist() if c.nullable else None
            if valid is not None:
                values = [v if ok else None for v, ok in zip(values, valid, strict=True)]
            cols.append((c.name, values))
        parent = None if table.parent is None else table.parent.tolist()
        out.append((t.path, table.n, parent, cols))
    return out


def _columns_native(mod: Any, wire: Any) -> Fn:
    from peerwatch.schemas.columns import ColumnDecoder, table_spec

    spec = table_spec(wire, column_selection(wire))
    decoder = ColumnDecoder(spec, wire, module=mod)
    # one dict for every call, as the hot stage and replay keep theirs: the C string cache
    # then lives across calls, and every code it gives must still be the dict's
    strings: dict[str, int] = {}

    def run(buf: Any, offset: int) -> Any:
        tables, bad = decoder.messages([buf], offset, strings)
        if bad:
            raise ValueError(bad[0][1])
        return _resolved(tables, spec, list(strings))

    return run


def _columns_fallback(wire: Any) -> Fn:
    from peerwatch.schemas.columns import table_spec, tables_from_records

    spec = table_spec(wire, column_selection(wire))
    decode = compile_decoder(wire)

    def run(buf: Any, offset: int) -> Any:
        record, end = decode(buf, offset)
        if end != len(buf):
            raise ValueError("trailing bytes after the record")
        strings: dict[str, int] = {}
        return _resolved(tables_from_records(spec, [record], strings), spec, list(strings))

    return run


def _lax_skipper(wire: Any) -> Fn:
    from peerwatch.io.archive.reader import lax_skipper

    return lax_skipper(wire)  # type: ignore[no-any-return]


def _end_of(wire: Any) -> Fn:
    decode = compile_decoder(wire)
    return lambda buf, offset: decode(buf, offset)[1]


TARGETS: list[Target] = [
    Target(
        "decode",
        "_avro_native",
        native=lambda mod, wire: functools.partial(mod.decode, plan_of(wire)),
        fallback=compile_decoder,
        compare=same_value,
        expect=lambda record, end: (record, end),
    ),
    Target(
        "skip",
        "_avro_native",
        native=lambda mod, wire: functools.partial(mod.skip, plan_of(wire)),
        fallback=_end_of,
        compare=same_value,
        expect=lambda record, end: end,
    ),
    # Where a record that does not decode ends, so that the block's next records can be read
    # (replay's decoded path; decode_columns steps over the same faults in a block): the C
    # lenient skip against the Python one, which must step over and refuse the same bytes.
    Target(
        "skip_lenient",
        "_avro_native",
        native=lambda mod, wire: functools.partial(mod.skip_lenient, plan_of(wire)),
        fallback=_lax_skipper,
        compare=same_value,
        expect=lambda record, end: end,
    ),
    # One record per buffer, as the hot stage gives Kafka messages (the record must end it).
    Target(
        "decode_columns",
        "_avro_native",
        native=_columns_native,
        fallback=_columns_fallback,
        compare=same_value,
    ),
]

#: The C modules the targets need: name -> the import name of the normal build.
NORMAL_MODULES = {"_avro_native": "peerwatch.schemas._avro_native"}

# ----------------------------------------------------------------------------------------------
# Schemas as plain trees: ("null",) ("boolean",) ("int",) ("long",) ("float",) ("double",)
# ("string",) ("bytes",) ("enum", symbols) ("array", item) ("map", value) ("union", branches)
# ("record", name, ((field, node), ...)). Named references resolved as plan_of resolves them.

Node = tuple[Any, ...]
_PRIMS = {"null", "boolean", "int", "long", "float", "double", "string", "bytes"}


def to_node(schema: Any) -> Node:
    named: dict[str, Node] = {}

    def walk(t: Any, ns: str | None) -> Node:
        if isinstance(t, list):
            return ("union", tuple(walk(b, ns) for b in t))
        if isinstance(t, str):
            if t in _PRIMS:
                return (t,)
            full = t if "." in t or not ns else f"{ns}.{t}"
            return named[full] if full in named else named[t]
        kind = t["type"]
        if kind in _PRIMS:
            return (kind,)
        name, inner_ns = t.get("name"), t.get("namespace", ns)
        full_name = None
        if name:
            full_name = name if "." in name or not inner_ns else f"{inner_ns}.{name}"
            inner_ns = full_name.rpartition(".")[0] or inner_ns
        if kind == "record":
            node: Node = (
                "record",
                full_name,
                tuple((f["name"], walk(f["type"], inner_ns)) for f in t["fields"]),
            )
        elif kind == "enum":
            node = ("enum", tuple(t["symbols"]))
        elif kind == "array":
            node = ("array", walk(t["items"], ns))
        elif kind == "map":
            node = ("map", walk(t["values"], ns))
        else:
            raise ValueError(f"type {kind!r}")
        if full_name:
            named[full_name] = named[full_name.rsplit(".", 1)[-1]] = node
        return node

    return walk(schema, None)


# ----------------------------------------------------------------------------------------------
# Random valid values.

_LONG_EDGES = [0, 1, -1, 63, -64, 64, -65, 127, 128, 8191, -8192, 8192, 2**31 - 1, -(2**31),
               2**31, 2**32, 2**53, 2**62, -(2**62), 2**63 - 1, -(2**63), 2**63 - 2, -(2**63) + 1]  # fmt: skip
_INT_EDGES = [v for v in _LONG_EDGES if -(2**31) <= v < 2**31]
_F32 = struct.Struct("<f")
_FLOAT_EDGES = [0.0, -0.0, 1.0, -1.5, math.inf, -math.inf, math.nan, 3.4028234663852886e38,
                1.401298464324817e-45, 1.1754943508222875e-38]  # fmt: skip
_DOUBLE_EDGES = [0.0, -0.0, 1.0, -2.5e300, math.inf, -math.inf, math.nan, 5e-324,
                 1.7976931348623157e308, 2.2250738585072014e-308, 0.1]  # fmt: skip
_CHAR_RANGES = [(0x20, 0x7E)] * 6 + [(0x00, 0x1F), (0x80, 0x7FF), (0x800, 0xD7FF),
                                     (0xE000, 0xFFFD), (0x10000, 0x10FFFF)]  # fmt: skip


def _string(rng: Random) -> str:
    n = rng.choice((0, 1, 2, 5, 12, 30)) if rng.random() < 0.9 else rng.randrange(300)
    out = []
    for _ in range(n):
        lo, hi = rng.choice(_CHAR_RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _count(rng: Random) -> int:
    r = rng.random()
    return 0 if r < 0.25 else rng.randint(1, 4) if r < 0.9 else rng.randint(5, 40)


def generate(node: Node, rng: Random) -> Any:
    kind = node[0]
    if kind == "null":
        return None
    if kind == "boolean":
        return rng.random() < 0.5
    if kind in ("int", "long"):
        edges, bits = (_INT_EDGES, 31) if kind == "int" else (_LONG_EDGES, 63)
        if rng.random() < 0.3:
            return rng.choice(edges)
        b = rng.randint(0, bits)
        return rng.randint(-(2**b), 2**b - 1)
    if kind == "float":
        v = rng.choice(_FLOAT_EDGES) if rng.random() < 0.3 else rng.uniform(-1e6, 1e6)
        return float(_F32.unpack(_F32.pack(v))[0])
    if kind == "double":
        if rng.random() < 0.3:
            return rng.choice(_DOUBLE_EDGES)
        return struct.unpack("<d", rng.randbytes(8))[0] if rng.random() < 0.3 else rng.random()
    if kind == "string":
        return _string(rng)
    if kind == "bytes":
        return rng.randbytes(rng.choice((0, 1, 4, 16, 100)))
    if kind == "enum":
        return rng.choice(node[1])
    if kind == "array":
        return [generate(node[1], rng) for _ in range(_count(rng))]
    if kind == "map":
        return {_string(rng): generate(node[1], rng) for _ in range(_count(rng))}
    if kind == "union":
        branches = node[1]
        nulls = [b for b in branches if b[0] == "null"]
        if nulls and rng.random() < 0.3:
            return None
        return generate(rng.choice([b for b in branches if b[0] != "null"] or branches), rng)
    return {f: generate(t, rng) for f, t in node[2]}


# ----------------------------------------------------------------------------------------------
# Encoding that remembers where its varints are, for targeted mutations.


@dataclass(frozen=True)
class Site:
    """A varint of the encoding: ``kind`` is len (string/bytes length; ``is_str`` for strings
    and map keys), count (array/map block count; ``block_end`` ends the block's items), branch,
    enum (``extra`` = number of symbols) or long."""

    kind: str
    start: int
    end: int
    value: int
    block_end: int = 0
    is_str: bool = False
    extra: int = 0


def _varint(v: int) -> bytes:
    return encode_long(v)


def _is_null_union_value(node: Node, value: Any) -> int:
    branches = node[1]
    if value is None:
        return next(i for i, b in enumerate(branches) if b[0] == "null")
    return next(i for i, b in enumerate(branches) if b[0] != "null")


class Encoder:
    """Avro binary of a value. ``blocks`` is how arrays and maps are written: canonical (one
    block, as every writer does), split (several positive blocks) or negative (negative counts,
    each followed by the block's byte size)."""

    def __init__(self, rng: Random, blocks: str = "canonical") -> None:
        self.rng, self.blocks = rng, blocks
        self.out = bytearray()
        self.sites: list[Site] = []

    def site(self, kind: str, data: bytes, value: int, **kw: Any) -> None:
        start = len(self.out)
        self.out += data
        self.sites.append(Site(kind, start, len(self.out), value, **kw))

    def encode(self, node: Node, value: Any) -> None:
        kind, out = node[0], self.out
        if kind == "null":
            return
        if kind == "boolean":
            out.append(1 if value else 0)
        elif kind in ("int", "long"):
            self.site("long", _varint(value), value)
        elif kind == "float":
            out += _F32.pack(value)
        elif kind == "double":
            out += struct.pack("<d", value)
        elif kind in ("string", "bytes"):
            raw = value.encode() if kind == "string" else value
            self.site("len", _varint(len(raw)), len(raw), is_str=kind == "string")
            out += raw
        elif kind == "enum":
            i = node[1].index(value)
            self.site("enum", _varint(i), i, extra=len(node[1]))
        elif kind == "union":
            i = _is_null_union_value(node, value)
            self.site("branch", _varint(i), i)
            self.encode(node[1][i], value)
        elif kind in ("array", "map"):
            self.encode_blocks(node, value)
        else:
            for f, t in node[2]:
                self.encode(t, value[f])

    def encode_item(self, node: Node, item: Any) -> None:
        if node[0] == "map":
            key, v = item
            raw = key.encode()
            self.site("len", _varint(len(raw)), len(raw), is_str=True)
            self.out += raw
            self.encode(node[1], v)
        else:
            self.encode(node[1], item)

    def encode_blocks(self, node: Node, value: Any) -> None:
        items = list(value.items()) if node[0] == "map" else list(value)
        chunks: list[list[Any]] = []
        if self.blocks == "canonical" or not items:
            chunks = [items] if items else []
        else:
            i = 0
            while i < len(items):
                n = self.rng.randint(1, len(items) - i)
                chunks.append(items[i : i + n])
                i += n
        for chunk in chunks:
            sub = Encoder(self.rng, self.blocks)
            for item in chunk:
                sub.encode_item(node, item)
            negative = self.blocks == "negative" and self.rng.random() < 0.8
            count = -len(chunk) if negative else len(chunk)
            start = len(self.out)
            self.out += _varint(count) + (_varint(len(sub.out)) if negative else b"")
            body = len(self.out)
            self.sites.append(Site("count", start, body, count, block_end=body + len(sub.out)))
            self.out += sub.out
            for s in sub.sites:
                end = s.block_end + body if s.kind == "count" else 0
                self.sites.append(replace(s, start=s.start + body, end=s.end + body, block_end=end))
        end = len(self.out)
        self.out.append(0)
        self.sites.append(Site("count", end, end + 1, 0, block_end=end + 1))


def encode(
    node: Node, value: Any, rng: Random, blocks: str = "canonical"
) -> tuple[bytes, list[Site]]:
    enc = Encoder(rng, blocks)
    enc.encode(node, value)
    return bytes(enc.out), enc.sites


# ----------------------------------------------------------------------------------------------
# Mutations: each gives (label, bytes, valid) where valid means "a correct encoding of the
# record, ending at len(bytes)".

_INTERESTING = [0x00, 0x01, 0x02, 0x7F, 0x80, 0x81, 0xFE, 0xFF, 0x3F, 0x40, 0xC0, 0xED]
_BAD_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xbf", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf",
             b"\xf0\x80\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80",
             b"\xf8\x88\x80\x80\x80", b"\xe2\x82", b"\xc2", b"\xf0\x9f\x98"]  # fmt: skip
_HUGE = [2**31 - 1, 2**31, 2**32, 2**62, 2**63 - 1, -(2**63), -1, -2, -(2**31)]
_WIDE_VARINTS = [b"\xff" * 9 + b"\x02", b"\xff" * 9 + b"\x7f", b"\x80" * 10 + b"\x00",
                 b"\x80" * 9 + b"\x01", b"\xff" * 10, b"\x80" * 3]  # fmt: skip


def _splice(data: bytes, start: int, end: int, new: bytes) -> bytes:
    return data[:start] + new + data[end:]


def _pad(v: bytes, extra: int) -> bytes:
    """The same varint over ``extra`` more bytes (zero continuation groups)."""
    return v[:-1] + bytes([v[-1] | 0x80]) + b"\x80" * (extra - 1) + b"\x00"


def targeted(data: bytes, sites: list[Site], rng: Random) -> Iterator[tuple[str, bytes, bool]]:
    """Mutations aimed at the varints and strings of one encoding."""
    by_kind: dict[str, list[Site]] = {}
    for site in sites:
        by_kind.setdefault(site.kind, []).append(site)
    kinds = sorted(by_kind)
    for _ in range(12 if kinds else 0):
        s = rng.choice(by_kind[rng.choice(kinds)])
        rest = len(data) - s.end
        if s.kind == "len":
            n = rng.choice([*_HUGE, s.value + 1, rest + 1, rest, s.value + 2**32, -s.value - 1])
            yield "len-inflate", _splice(data, s.start, s.end, _varint(n)), False
        elif s.kind == "count":
            n = abs(s.value)
            size = s.block_end - s.end
            choice = rng.randrange(8)
            if choice == 0:
                new = _varint(rng.choice([*_HUGE[:5], n + 1, rest, rest + 1]))
                yield "count-inflate", _splice(data, s.start, s.end, new), False
            elif choice == 1:
                # A negative count with the byte size after it: valid when the size is right.
                sized = _varint(-n) + _varint(size) if n else b"\x00"
                yield (
                    "count-negative-sized",
                    _splice(data, s.start, s.end, sized),
                    n > 0 and s.value > 0,
                )
            elif choice == 2:
                yield (
                    "count-negative-unsized",
                    _splice(data, s.start, s.end, _varint(-n or -1)),
                    False,
                )
            elif choice == 3:
                wrong = _varint(-max(n, 1)) + _varint(rng.choice([*_HUGE, 0, size + 1]))
                yield "count-negative-badsize", _splice(data, s.start, s.end, wrong), False
            elif choice == 4:
                new = _varint(-(2**63)) + _varint(size)
                yield "count-int64-min", _splice(data, s.start, s.end, new), False
            elif choice == 5:
                new = _varint(-rng.choice([2**31, 2**62, 2**63 - 1, n + 1])) + _varint(size)
                yield "count-negative-huge", _splice(data, s.start, s.end, new), False
            elif choice == 6 and n > 1:
                yield "count-short", _splice(data, s.start, s.end, _varint(n - 1)), False
            else:
                yield "count-widen", _splice(data, s.start, s.end, rng.choice(_WIDE_VARINTS)), False
        elif s.kind == "branch":
            new = bytes([rng.choice([1, 3, 4, 6, 0x7F, 0x80, 0xFF])])
            yield "branch", _splice(data, s.start, s.end, new), False
        elif s.kind == "enum":
            n = rng.choice([s.extra, s.extra + 1, -1, -(2**63), 2**63 - 1, 2**31])
            yield "enum-range", _splice(data, s.start, s.end, _varint(n)), False
        if s.kind in ("len", "count", "long", "enum") and rng.random() < 0.5:
            # Over-long (still valid up to 10 bytes) and over-wide varints.
            raw = data[s.start : s.end]
            extra = rng.randint(1, 11 - len(raw)) if len(raw) < 10 else 1
            yield "varint-pad", _splice(data, s.start, s.end, _pad(raw, extra)), False
            yield "varint-wide", _splice(data, s.start, s.end, rng.choice(_WIDE_VARINTS)), False
    strings = [s for s in sites if s.kind == "len" and s.is_str]
    for _ in range(3 if strings else 0):
        s = rng.choice(strings)
        bad = rng.choice(_BAD_UTF8)
        at = s.end + rng.randint(0, s.value)
        inserted = data[: s.end] + data[s.end : at] + bad + data[at:]
        fixed = _splice(inserted, s.start, s.end, _varint(s.value + len(bad)))
        yield "utf8-insert", fixed, False
        yield "utf8-insert-unfixed", inserted, False
        if s.value:
            at = s.end + rng.randrange(s.value)
            yield "utf8-overwrite", data[:at] + bad[:1] + data[at + 1 :], False


def random_mutations(
    data: bytes, rng: Random, others: list[bytes]
) -> Iterator[tuple[str, bytes, bool]]:
    n = len(data)
    for _ in range(4):
        b = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            if b:
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        yield "bitflip", bytes(b), False
    for _ in range(4):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            if b:
                b[rng.randrange(len(b))] = (
                    rng.choice(_INTERESTING) if rng.random() < 0.6 else rng.randrange(256)
                )
        yield "overwrite", bytes(b), False
    if n:
        i = rng.randrange(n + 1)
        yield "insert", data[:i] + rng.randbytes(rng.randint(1, 8)) + data[i:], False
        i = rng.randrange(n)
        yield "delete", data[:i] + data[i + rng.randint(1, 8) :], False
        yield "truncate", data[: rng.randrange(n)], False
    if others:
        other = rng.choice(others)
        yield "splice", data[: rng.randint(0, n)] + other[rng.randint(0, len(other)) :], False


def all_truncations(data: bytes) -> Iterator[tuple[str, bytes, bool]]:
    for cut in range(len(data)):
        yield "truncate-every", data[:cut], False


# ----------------------------------------------------------------------------------------------
# Running one input through every target.

_OK, _REFUSED, _UNDOCUMENTED = "ok", "refused", "undocumented"


def call(fn: Fn, buf: Any, offset: int, errors: tuple[type[BaseException], ...]) -> tuple[str, Any]:
    try:
        return _OK, fn(buf, offset)
    except errors as exc:
        return _REFUSED, exc
    except Exception as exc:
        return _UNDOCUMENTED, exc


def describe(outcome: tuple[str, Any]) -> str:
    kind, v = outcome
    if kind == _OK:
        text = repr(v)
        return "ok " + (text if len(text) < 300 else text[:300] + "...")
    return f"{kind} {type(v).__name__}: {v}"


def disagreement(target: Target, got: tuple[str, Any], want: tuple[str, Any]) -> str | None:
    """None when two outcomes agree (same result, or both refused), else why not."""
    if got[0] == _UNDOCUMENTED or want[0] == _UNDOCUMENTED:
        return "an undocumented exception"
    if got[0] == want[0] == _REFUSED:
        return None
    if got[0] != want[0]:
        return "one refused, the other did not"
    return None if target.compare(got[1], want[1]) else "different results"


class ExactBuffer:
    """The bytes in a malloc'd block of exactly their size (ctypes; PYTHONMALLOC=malloc), so
    that AddressSanitizer sees a read one byte past the end. Small blocks live inside the ctypes
    object (no redzone right after them); most inputs are longer."""

    def __init__(self, data: bytes) -> None:
        self.raw = (ctypes.c_char * max(len(data), 1)).from_buffer_copy(data or b"\x00")
        self.view = memoryview(self.raw).cast("B")[: len(data)]


def present(data: bytes, rng: Random) -> tuple[str, Any, int, Any]:
    """How the input reaches the decoders: (kind, buffer, offset, keep-alive)."""
    prefix = rng.randbytes(rng.choice((0, 0, 0, 1, 3)))
    whole = prefix + data
    kind = rng.choice(("exact", "exact", "exact", "bytes", "bytearray", "memoryview"))
    if kind == "exact":
        holder = ExactBuffer(whole)
        return kind, holder.view, len(prefix), holder
    if kind == "bytearray":
        return kind, bytearray(whole), len(prefix), None
    if kind == "memoryview":
        return kind, memoryview(b"\x00" + whole)[1:], len(prefix), None
    return kind, whole, len(prefix), None


# ----------------------------------------------------------------------------------------------
# Where the input being tried is kept, so that a sanitizer abort can be reproduced.


class LastInput:
    """A file mapped in memory holding the input being tried (written before each input;
    survives an abort). ``show`` prints it."""

    SIZE = 1 << 20

    def __init__(self, path: str | None) -> None:
        self.map = None
        if path:
            with open(path, "w+b") as f:
                f.truncate(self.SIZE)
                self.map = mmap.mmap(f.fileno(), self.SIZE)

    def write(self, meta: dict[str, Any], data: bytes) -> None:
        if self.map is None:
            return
        head = json.dumps(meta).encode()
        blob = struct.pack("<II", len(head), len(data)) + head + data
        self.map[: len(blob)] = blob[: self.SIZE]

    @staticmethod
    def show(path: str) -> str:
        raw = Path(path).read_bytes()
        hn, dn = struct.unpack_from("<II", raw)
        if not hn:
            return "no input recorded"
        meta = json.loads(raw[8 : 8 + hn])
        data = raw[8 + hn : 8 + hn + dn]
        return f"last input tried: {json.dumps(meta)}\n  hex: {data.hex()}"


# ----------------------------------------------------------------------------------------------
# Schemas under test.

# What our schemas do not use: maps, bytes, enums in unions and arrays, [T, null] unions. No array
# has items that can encode to zero bytes (null, records of nulls): the C reader refuses a block
# count beyond the bytes left (its guard against huge allocations), the Python reader does not,
# and none of our schemas has such items.
SYNTHETIC = {
    "type": "record", "name": "Synthetic", "namespace": "fuzz",
    "fields": [
        {"name": "a", "type": ["null", "long"]},
        {"name": "b", "type": {"type": "map", "values": ["double", "null"]}},
        {"name": "c", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y", "Z"]}},
        {"name": "d", "type": "E"},
        {"name": "e", "type": "bytes"},
        {"name": "f", "type": "boolean"},
        {"name": "g", "type": {"type": "array", "items": {"type": "map", "values": "string"}}},
        {"name": "h", "type": {"type": "map", "values": {"type": "array", "items": {
            "type": "record", "name": "P", "fields": [
                {"name": "x", "type": "float"}, {"name": "y", "type": ["string", "null"]},
                {"name": "z", "type": ["null", "E"]}]}}}},
        {"name": "i", "type": ["null", "bytes"]},
        {"name": "j", "type": {"type": "array", "items": "E"}},
        {"name": "k", "type": {"type": "array", "items": "P"}},
        {"name": "l", "type": "int"},
    ],
}  # fmt: skip
SYNTHETIC_SCALARS = {
    "type": "record", "name": "Scalars",
    "fields": [{"name": n, "type": t} for n, t in [
        ("s", "string"), ("d", "double"), ("f", "float"), ("b", "boolean"), ("n", "null"),
        ("m", {"type": "map", "values": "long"}), ("u", ["long", "null"])]],
}  # fmt: skip

#: Schema name -> the simulator stream whose records are mixed in.
SIM_STREAMS = {
    "NodeGpuSample": "samples",
    "JobEvent": "job-events",
    "NodeStateEvent": "node-events",
    "StepTime": "step-times",
}


def schemas_under_test() -> dict[str, Any]:
    """Name -> wire schema: current versions, released ones that differ on the wire, synthetic."""
    out: dict[str, Any] = {}
    for name in registry.SCHEMA_NAMES:
        wire = registry.strip_logical_types(registry.raw_schema(name))
        out[name] = wire
        for version, raw in registry.raw_released_schemas(name):
            old = registry.strip_logical_types(raw)
            if registry.canonical_form(old) != registry.canonical_form(wire):
                out[f"{name}.{version}"] = old
    out["synthetic.Synthetic"] = SYNTHETIC
    out["synthetic.Scalars"] = SYNTHETIC_SCALARS
    return out


def sim_records(seed: int) -> dict[str, list[dict[str, Any]]]:
    """Records of the simulator, per schema name (a small fleet, a few ticks)."""
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.scenario import default_scenario

    fleet = Fleet(default_scenario(nodes=3, gpus_per_node=8, duration_s=20, seed=seed))
    by_stream: dict[str, list[dict[str, Any]]] = {}
    for tick in fleet.ticks():
        for rec in tick:
            by_stream.setdefault(rec.stream, []).append(rec.value)
    return {name: by_stream.get(stream, []) for name, stream in SIM_STREAMS.items()}


# ----------------------------------------------------------------------------------------------
# Recursion guard and malformed plans (checked once, before the loop).


def max_depth() -> int:
    match = re.search(r"#define\s+MAX_DEPTH\s+(\d+)", HEADER.read_text())
    if match is None:
        raise SystemExit(f"no MAX_DEPTH in {HEADER}")
    return int(match[1])


def _nested(kind: str, depth: int) -> tuple[Any, bytes, Any]:
    """A plan of ``depth`` wrappers of ``kind`` around a long, bytes of one value, its value."""
    plan: Any = (native.LONG, None, None)
    data, value = b"\x0a", 5
    for _ in range(depth):
        if kind == "record":
            plan, value = (native.RECORD, ("x",), (plan,)), {"x": value}
        elif kind == "array":
            plan, data, value = (native.ARRAY, plan, None), b"\x02" + data + b"\x00", [value]
        elif kind == "map":
            plan, data, value = (
                (native.MAP, plan, None),
                b"\x02\x02k" + data + b"\x00",
                {"k": value},
            )
        else:
            plan, data = (native.UNION, (plan,), None), b"\x00" + data
    return plan, data, value


def check_plans(mod: Any) -> list[str]:
    """The recursion guard refuses exactly past MAX_DEPTH, for decode and skip alike, and
    malformed plans or calls raise TypeError/ValueError/OverflowError (never crash)."""
    problems: list[str] = []
    limit = max_depth()
    for kind in ("record", "array", "map", "union"):
        for depth in (0, 1, limit - 1, limit, limit + 1, limit + 2, 200, 5000):
            plan, data, value = _nested(kind, depth)
            ok = depth <= limit
            for what, fn, want in (
                ("decode", mod.decode, (value, len(data))),
                ("skip", mod.skip, len(data)),
            ):
                try:
                    got = fn(plan, ExactBuffer(data).view, 0)
                except ValueError as exc:
                    if ok or "nested" not in str(exc):
                        problems.append(f"{what} {kind}x{depth}: refused ({exc})")
                    continue
                except Exception as exc:
                    problems.append(f"{what} {kind}x{depth}: {type(exc).__name__}: {exc}")
                    continue
                if not ok or not same_value(got, want):
                    problems.append(
                        f"{what} {kind}x{depth}: gave {got!r}, wanted {want!r} or a refusal"
                    )
    # Deep record chains: the generated Python reader agrees (it has no such guard).
    for depth in (limit - 1, limit, 150):
        schema: Any = "long"
        for i in range(depth):
            schema = {"type": "record", "name": f"D{i}", "fields": [{"name": "x", "type": schema}]}
        plan, data, value = _nested("record", depth)
        if plan_of(schema) != plan or compile_decoder(schema)(data, 0) != (value, len(data)):
            problems.append(f"record chain {depth}: plan or Python reader differs from the model")
    L, R, U, A, E = native.LONG, native.RECORD, native.UNION, native.ARRAY, native.ENUM
    bad_plans = [(99, None, None), "x", (L,), (L, None), (2**70, None, None), (-1, None, None),
                 (R, ("a",), ()), (R, ("a", "b"), ((L, None, None),)), (R, None, None),
                 (R, ("a",), None), (U, None, None), (U, "ab", None), (E, None, None),
                 (A, "no plan", None), (A, (L,), None), (native.MAP, 7, None),
                 (U, ((99, None, None),), None), (R, (1,), ((L, None, None),))]  # fmt: skip
    for plan in bad_plans:
        for fn in (mod.decode, mod.skip):
            for data in (b"\x02\x02\x02\x00\x00", b"\x00\x00\x00", b"\x80"):
                try:
                    fn(plan, data, 0)
                except (TypeError, ValueError, OverflowError):
                    pass
                except Exception as exc:
                    problems.append(f"plan {plan!r}: {type(exc).__name__}: {exc}")
    for args in [((L, None, None), b"\x00"), ((L, None, None), b"\x00", -1),
                 ((L, None, None), b"\x00", 2), ((L, None, None), b"\x00", 2**70),
                 ((L, None, None), "text", 0), ((L, None, None), None, 0),
                 ((L, None, None), b"\x00", 0, 0), ((L, None, None), b"\x00", "0")]:  # fmt: skip
        for fn in (mod.decode, mod.skip):
            try:
                fn(*args)
                problems.append(f"{fn.__name__}{args!r}: accepted")
            except (TypeError, ValueError, OverflowError):
                pass
            except Exception as exc:
                problems.append(f"{fn.__name__}{args!r}: {type(exc).__name__}: {exc}")
    return problems


# ----------------------------------------------------------------------------------------------
# The loop.


@dataclass
class Mismatch:
    schema: str
    target: str
    mutation: str
    reason: str
    data: bytes
    buffer: str
    offset: int
    native: str
    fallback: str

    def report(self) -> str:
        return (
            f"MISMATCH {self.schema} {self.target} ({self.mutation}, {self.buffer} buffer, "
            f"offset {self.offset}): {self.reason}\n"
            f"  native:   {self.native}\n  fallback: {self.fallback}\n"
            f"  reproduce: PYTHONPATH=. .venv/bin/python scripts/fuzz_native.py --replay "
            f"{self.schema} {self.data.hex()} --offset {self.offset}"
        )


@dataclass
class Stats:
    inputs: Counter[str] = field(default_factory=Counter)
    records: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    mutations: Counter[str] = field(default_factory=Counter)
    mismatches: list[Mismatch] = field(default_factory=list)
    plan_problems: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.inputs.values())


@dataclass
class Subject:
    """One schema under test: its tree, the callables of each target, records to start from."""

    name: str
    node: Node
    calls: list[tuple[Target, Fn, Fn]]
    sims: list[dict[str, Any]]
    canonical: Callable[[Any], bytes]
    reader: Fn
    done: int = 0
    corpus: list[bytes] = field(default_factory=list)


def load_modules(module_dir: str | None) -> dict[str, Any]:
    """The C modules the targets need: from ``module_dir`` (a sanitized build, loaded from its
    file) or the normal build."""
    mods: dict[str, Any] = {}
    for name in sorted({t.module for t in TARGETS}):
        if module_dir is None:
            mods[name] = importlib.import_module(NORMAL_MODULES[name])
            continue
        path = next(Path(module_dir).glob(f"{name}.*so"), None)
        if path is None:
            raise SystemExit(f"no {name} module in {module_dir}")
        loader = importlib.machinery.ExtensionFileLoader(name, str(path))
        spec = importlib.util.spec_from_file_location(name, path, loader=loader)
        assert spec is not None
        mod = importlib.util.module_from_spec(spec)
        loader.exec_module(mod)
        mods[name] = mod
    return mods


def make_subjects(
    mods: dict[str, Any], targets: list[Target], seed: int, sim: bool
) -> list[Subject]:
    sims = sim_records(seed) if sim else {}
    subjects = []
    for name, wire in schemas_under_test().items():
        calls = [(t, t.native(mods[t.module], wire), t.fallback(wire)) for t in targets]
        subjects.append(
            Subject(
                name,
                to_node(wire),
                calls,
                sims.get(name, []),
                compile_encoder(wire),
                compile_decoder(wire),
            )
        )
    return subjects


def try_input(
    subject: Subject,
    mutation: str,
    data: bytes,
    expected: Any,
    rng: Random,
    stats: Stats,
    last: LastInput,
) -> None:
    """Feed one input to every target; ``expected`` is (record, end) for a valid encoding."""
    kind, buf, offset, _keep = present(data, rng)
    last.write(
        {"schema": subject.name, "mutation": mutation, "buffer": kind, "offset": offset}, data
    )
    stats.inputs[subject.name] += 1
    stats.mutations[mutation] += 1
    for target, c_fn, py_fn in subject.calls:
        got = call(c_fn, buf, offset, target.native_errors)
        want = call(py_fn, buf, offset, target.fallback_errors)
        reason = disagreement(target, got, want)
        if reason is None and expected is not None and target.expect is not None:
            record, end = expected
            good = (_OK, target.expect(record, end + offset))
            if disagreement(target, want, good) is not None:
                reason = "a valid encoding not read back as written"
        stats.outcomes[(subject.name, target.name, got[0])] += 1
        if reason is not None:
            stats.mismatches.append(
                Mismatch(
                    subject.name,
                    target.name,
                    mutation,
                    reason,
                    data,
                    kind,
                    offset,
                    describe(got),
                    describe(want),
                )
            )


def inputs_of(subject: Subject, rng: Random, exhaustive: bool) -> Iterator[tuple[str, bytes, Any]]:
    """(mutation, bytes, expected or None) for one new record of ``subject``."""
    if subject.sims and subject.done % 3 == 0:
        # A simulator record, as the reader gives it back (all fields, the schema's types).
        raw = subject.canonical(subject.sims[(subject.done // 3) % len(subject.sims)])
        record, origin = subject.reader(raw, 0)[0], "sim"
    else:
        record, origin = generate(subject.node, rng), "gen"
    subject.done += 1
    data, sites = encode(subject.node, record, rng)
    if data != subject.canonical(record):
        raise AssertionError(f"{subject.name}: the fuzzer's encoder differs from compile_encoder")
    subject.corpus = ([data, *subject.corpus])[:8]
    end = len(data)
    yield f"valid-{origin}", data, (record, end)
    for blocks in ("split", "negative"):
        other = encode(subject.node, record, rng, blocks)[0]
        yield f"valid-{blocks}-blocks", other, (record, len(other))
    yield "trailing", data + rng.randbytes(rng.randint(1, 4)), (record, end)
    for m, d, valid in targeted(data, sites, rng):
        yield m, d, (record, len(d)) if valid else None
    neg, neg_sites = encode(subject.node, record, rng, "negative")
    for m, d, valid in targeted(neg, neg_sites, rng):
        yield m + "@neg", d, (record, len(d)) if valid else None
    yield from ((m, d, None) for m, d, _ in random_mutations(data, rng, subject.corpus[1:]))
    if exhaustive:
        yield from ((m, d, None) for m, d, _ in all_truncations(data))


def run(
    *,
    seconds: float | None,
    seed: int,
    max_inputs: int | None = None,
    module_dir: str | None = None,
    targets: list[Target] | None = None,
    mods: dict[str, Any] | None = None,
    exhaustive_records: int = 2,
    sim: bool = True,
    last_input: str | None = None,
) -> Stats:
    """The fuzzing loop, until ``seconds`` have passed or ``max_inputs`` were tried."""
    rng = Random(seed)
    targets = TARGETS if targets is None else targets
    mods = load_modules(module_dir) if mods is None else mods
    stats = Stats()
    stats.plan_problems = check_plans(mods["_avro_native"])
    subjects = make_subjects(mods, targets, seed, sim)
    last = LastInput(last_input)
    deadline = None if seconds is None else time.monotonic() + seconds
    rounds = 0
    while True:
        for subject in subjects:
            exhaustive = rounds < exhaustive_records
            for mutation, data, expected in inputs_of(subject, rng, exhaustive):
                try_input(subject, mutation, data, expected, rng, stats, last)
                if (max_inputs is not None and stats.total >= max_inputs) or (
                    deadline is not None and time.monotonic() >= deadline
                ):
                    return stats
                if len(stats.mismatches) >= 50:
                    return stats
            stats.records[subject.name] += 1
        rounds += 1


def replay(schema: str, data: bytes, offset: int, module_dir: str | None) -> int:
    mods = load_modules(module_dir)
    wire = schemas_under_test()[schema]
    bad = 0
    for t in TARGETS:
        got = call(t.native(mods[t.module], wire), data, offset, t.native_errors)
        want = call(t.fallback(wire), data, offset, t.fallback_errors)
        reason = disagreement(t, got, want)
        bad += reason is not None
        print(
            f"{t.name}: {reason or 'agree'}\n  native:   {describe(got)}\n  fallback: {describe(want)}"
        )
    return 1 if bad else 0


def summary(stats: Stats, seconds: float) -> str:
    lines = [f"{stats.total} inputs in {seconds:.0f} s"]
    for name in sorted(stats.inputs):
        parts = []
        for t in sorted({k[1] for k in stats.outcomes if k[0] == name}):
            ok = stats.outcomes[(name, t, _OK)]
            refused = stats.outcomes[(name, t, _REFUSED)]
            parts.append(f"{t} ok {ok} refused {refused}")
        lines.append(
            f"  {name:28} {stats.inputs[name]:7} inputs from {stats.records[name]:4} records; "
            + "; ".join(parts)
        )
    lines.append(
        "  by mutation: " + ", ".join(f"{m} {n}" for m, n in sorted(stats.mutations.items()))
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="time budget (default 120)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    ap.add_argument("--max-inputs", type=int, default=None)
    ap.add_argument("--module-dir", help="folder of the (sanitized) C modules to load")
    ap.add_argument("--last-input", help="file that keeps the input being tried (for crashes)")
    ap.add_argument("--show-last", metavar="FILE", help="print the input kept in FILE and exit")
    ap.add_argument("--replay", nargs=2, metavar=("SCHEMA", "HEX"), help="try one input")
    ap.add_argument("--offset", type=int, default=0)
    args = ap.parse_args(argv)
    if args.show_last:
        print(LastInput.show(args.show_last))
        return 0
    if args.replay:
        return replay(args.replay[0], bytes.fromhex(args.replay[1]), args.offset, args.module_dir)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(
        f"fuzz_native: seed {seed}, budget {args.seconds:g} s, module "
        f"{'from ' + args.module_dir if args.module_dir else 'normal build'}",
        flush=True,
    )
    start = time.monotonic()
    stats = run(
        seconds=args.seconds,
        seed=seed,
        max_inputs=args.max_inputs,
        module_dir=args.module_dir,
        last_input=args.last_input,
    )
    print(summary(stats, time.monotonic() - start))
    for problem in stats.plan_problems:
        print(f"PLAN CHECK FAILED: {problem}")
    for m in stats.mismatches:
        print(m.report())
    if stats.mismatches or stats.plan_problems:
        print(
            f"fuzz_native: FAILED ({len(stats.mismatches)} mismatches, "
            f"{len(stats.plan_problems)} plan-check failures; seed {seed})"
        )
        return 1
    print(f"fuzz_native: ok, no mismatch (seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
