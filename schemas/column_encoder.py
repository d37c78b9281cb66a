"""Avro records of many rows at once, encoded from columns (numpy), byte for byte what the
record-at-a-time encoder (:mod:`peerwatch.schemas.compiled`) writes.

A record's Avro encoding is the concatenation of its fields' encodings, so the records of ``n``
rows are made field by field: each field becomes an ``(n, width)`` byte matrix and a length per
row (:class:`Piece`), and the pieces are laid side by side into one buffer (:func:`assemble`),
then cut into one message per row. The per-type makers below are whole-column numpy operations:

* :func:`varints`: Avro's zig-zag varint of int/long values;
* :func:`doubles`: double values, 8 bytes little-endian;
* :func:`by_code`: a value of a small table per row (strings by their code: each distinct one
  encoded once);
* :func:`constant`: the same bytes in every row;
* :func:`nullable`: a union with null first (``00`` where absent, ``02`` + the value where
  present).

Used where a stage makes many records of one schema from columns (the stream worker's closed
GpuWindows: :meth:`~peerwatch.streams.core.window_dicts.WindowDicts.encoded`). A column of a
type the field cannot take raises :class:`Unfit`; the caller then encodes the rows one by one
(whose encoder names a field at fault).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


class Unfit(ValueError):
    """A column of a type its Avro field cannot take (another dtype, a None where the field is
    not nullable)."""


class Piece(NamedTuple):
    """One field of every row: ``data`` (rows x width bytes, or 1 x width: the same bytes in
    every row) and ``lengths`` (bytes used of each row's width; one value: the same for all)."""

    data: np.ndarray
    lengths: np.ndarray


#: The least zig-zag value that needs k + 1 bytes, for k = 1..9.
_VARINT_STEPS = np.array([1 << (7 * k) for k in range(1, 10)], np.uint64)


def varints(values: np.ndarray, avro_type: str = "long") -> Piece:
    """Zig-zag varints of integer ``values`` (64 bits: an ``int`` field is written as the
    record encoder writes it, which checks the long range only). Raises Unfit for another
    dtype."""
    if values.dtype.kind not in "iub":
        raise Unfit(f"{values.dtype} values for an Avro {avro_type}")
    x = values.astype(np.int64)
    u = ((x << 1) ^ (x >> 63)).view(np.uint64)
    nbytes = np.searchsorted(_VARINT_STEPS, u, side="right") + 1  # 7 bits per byte
    width = int(nbytes.max()) if len(u) else 1
    shifts = (7 * np.arange(width)).astype(np.uint64)
    groups = ((u[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)  # every row's 7-bit groups
    more = np.arange(width) < (nbytes - 1)[:, None]  # a group with another after it: 0x80
    return Piece(groups | (more.astype(np.uint8) << 7), nbytes)


def doubles(values: np.ndarray) -> Piece:
    """``values`` as Avro doubles (8 bytes, little-endian). Raises Unfit for a non-number
    dtype."""
    if values.dtype.kind not in "fiub":
        raise Unfit(f"{values.dtype} values for an Avro double")
    raw = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(len(values), 8)
    return Piece(raw, np.full(1, 8, np.int64))


def booleans(values: np.ndarray) -> Piece:
    """``values`` (truth) as Avro booleans, one byte each."""
    return Piece((values != 0).astype(np.uint8).reshape(len(values), 1), np.ones(1, np.int64))


def constant(encoded: bytes) -> Piece:
    """The same ``encoded`` bytes in every row."""
    data = np.frombuffer(encoded, np.uint8).reshape(1, len(encoded))
    return Piece(data, np.full(1, len(encoded), np.int64))


def by_code(table: Sequence[bytes], codes: np.ndarray) -> Piece:
    """Row ``i`` holds ``table[codes[i]]`` (each entry already encoded: a string's length and
    bytes, a union's branch)."""
    if len(table) == 1:  # one value (a job's fields in its own windows): the same in every row
        return constant(table[0])
    lengths = np.fromiter(map(len, table), np.int64, len(table))
    width = int(lengths.max()) if len(table) else 0
    grid = np.zeros((len(table), max(width, 1)), np.uint8)
    # every entry's bytes scattered into its row at once (a table may hold a job's every GPU)
    flat = np.frombuffer(b"".join(table), np.uint8)
    rows = np.repeat(np.arange(len(table)), lengths)
    starts = np.cumsum(lengths) - lengths
    grid[rows, np.arange(len(flat)) - np.repeat(starts, lengths)] = flat
    return Piece(grid[codes], lengths[codes])


def nullable(value: Piece, present: np.ndarray | None) -> Piece:
    """A union ``["null", T]`` of a value piece: ``00`` where not ``present``, ``02`` and the
    value where it is (``present`` None: everywhere)."""
    n = len(present) if present is not None else len(value.data)
    data = np.broadcast_to(value.data, (n, value.data.shape[1]))
    lengths = np.broadcast_to(value.lengths, (n,))
    out = np.zeros((n, data.shape[1] + 1), np.uint8)
    out[:, 0] = 2
    out[:, 1:] = data
    lengths = lengths + 1
    if present is not None and not present.all():
        out[~present, 0] = 0
        lengths = np.where(present, lengths, 1)
    return Piece(out, lengths)


def assemble(pieces: Sequence[Piece], n: int) -> list[bytes]:
    """The ``n`` rows' records: each row's pieces side by side, in order, one bytes each.

    The pieces are laid next to each other in one ``(n, total width)`` byte matrix; a mask keeps
    each piece's first ``length`` bytes of each row, and the kept bytes read in row-major order
    are each row's pieces in order: one masked copy for all fields, not a scatter per field
    (whose fixed numpy cost per field was most of a call of a hundred rows)."""
    if not n:
        return []
    widths = [p.data.shape[1] for p in pieces]
    data = np.empty((n, sum(widths)), np.uint8)
    lengths = np.empty((n, len(pieces)), np.int64)
    at = 0
    for f, (p, width) in enumerate(zip(pieces, widths, strict=True)):
        data[:, at : at + width] = p.data  # a piece of one row broadcasts to every row
        lengths[:, f] = p.lengths
        at += width
    piece_of = np.repeat(np.arange(len(pieces)), widths)  # each column's piece
    col_in = np.arange(at) - np.repeat(np.cumsum(widths) - widths, widths)  # its column in it
    buf = data[col_in < lengths[:, piece_of]].tobytes()
    row_end = np.cumsum(lengths.sum(axis=1)).tolist()
    return [buf[a:b] for a, b in zip([0, *row_end[:-1]], row_end, strict=True)]
