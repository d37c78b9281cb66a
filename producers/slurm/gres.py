"""Slurm GRES strings: ``gpu:3(IDX:0-2)``, ``gpu:h100:4(IDX:0-3)``, ``gpu(IDX:N/A)``,
``gpu:h100:2(IDX:0-1),nic:1``, ``gpu:h100:8(S:0-1)``.

An entry is ``name[:type][:count][(KEY:value...)]``. In ``squeue``'s ``gres_detail`` the
``IDX`` attribute lists the device indices a job owns on one node; a node's ``gres`` string
may carry ``S`` (socket affinity) instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["GresEntry", "gpu_indices", "parse_gres", "parse_index_list"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_COUNT = re.compile(r"(\d+)([KMGTP]?)", re.IGNORECASE)
_MULTIPLIER = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_INDEX_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
#: The highest device index read (a record field is a 32-bit int; no node has more devices).
MAX_INDEX = 65535


@dataclass(frozen=True)
class GresEntry:
    """One GRES entry.

    ``count`` is None when the string gives none (``gpu(IDX:N/A)``, ``gpu:h100``);
    ``indices`` is None when no ``IDX`` attribute is given or it is ``N/A``;
    ``attributes`` holds every ``KEY:value`` in the parentheses, raw (``{"IDX": "0-2"}``).
    """

    name: str
    type: str | None = None
    count: int | None = None
    indices: tuple[int, ...] | None = None
    attributes: dict[str, str] = field(default_factory=dict)


def parse_index_list(text: str) -> tuple[int, ...]:
    """``0-2,5`` -> ``(0, 1, 2, 5)``, in the given order.

    Raises:
        SlurmParseError: not a comma list of numbers and ``a-b`` ranges, or a range runs
            backwards.
    """
    out: list[int] = []
    for part in text.split(","):
        m = _INDEX_RANGE.fullmatch(part.strip())
        if m is None:
            raise SlurmParseError(f"bad GRES index list {text!r}")
        if max(len(m.group(1)), len(m.group(2) or "")) > len(str(MAX_INDEX)):
            raise SlurmParseError(f"GRES index beyond {MAX_INDEX} in {text!r}")
        lo = int(m.group(1))
        hi = lo if m.group(2) is None else int(m.group(2))
        if hi > MAX_INDEX:
            raise SlurmParseError(f"GRES index beyond {MAX_INDEX} in {text!r}")
        if hi < lo or hi - lo > 65535:
            raise SlurmParseError(f"bad GRES index range {part!r} in {text!r}")
        out.extend(range(lo, hi + 1))
    return tuple(out)


def _split_entries(text: str) -> list[str]:
    """Split at commas outside parentheses (``gpu:2(IDX:0,2),nic:1``)."""
    entries: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SlurmParseError(f"GRES {text!r}: unmatched ')' at offset {i}")
        elif ch == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise SlurmParseError(f"GRES {text!r}: unclosed '('")
    entries.append(text[start:])
    return entries


def _parse_attributes(body: str, entry: str) -> dict[str, str]:
    """``IDX:0-2`` or ``S:0-1``; several attributes are separated by commas."""
    attributes: dict[str, str] = {}
    # Values may contain commas (IDX:0,2); a new attribute starts at "KEY:".
    for chunk in re.split(r",(?=[A-Za-z_]+:)", body):
        k, sep, value = chunk.partition(":")
        if not sep or not k.strip():
            raise SlurmParseError(f"GRES entry {entry!r}: bad attribute {chunk!r}")
        attributes[k.strip()] = value.strip()
    return attributes


def _parse_count(text: str, entry: str) -> int:
    m = _COUNT.fullmatch(text)
    if m is None:
        raise SlurmParseError(f"GRES entry {entry!r}: bad count {text!r}")
    return int(m.group(1)) * _MULTIPLIER[m.group(2).upper()]


def _parse_entry(entry: str) -> GresEntry:
    head, paren, tail = entry.partition("(")
    attributes: dict[str, str] = {}
    if paren:
        if not tail.endswith(")") or ")" in tail[:-1]:
            raise SlurmParseError(f"GRES entry {entry!r}: text after ')'")
        attributes = _parse_attributes(tail[:-1], entry)
    fields = head.split(":")
    name = fields[0]
    if _NAME.fullmatch(name) is None:
        raise SlurmParseError(f"GRES entry {entry!r}: bad name {name!r}")
    gres_type: str | None = None
    count: int | None = None
    rest = fields[1:]
    if len(rest) > 2 or any(not f for f in rest):
        raise SlurmParseError(f"GRES entry {entry!r}: expected name[:type][:count]")
    if len(rest) == 2:
        gres_type, count = rest[0], _parse_count(rest[1], entry)
    elif len(rest) == 1:
        if _COUNT.fullmatch(rest[0]):
            count = _parse_count(rest[0], entry)
        else:
            gres_type = rest[0]
    indices: tuple[int, ...] | None = None
    idx = attributes.get("IDX")
    if idx is not None and idx.upper() != "N/A":
        indices = parse_index_list(idx)
    return GresEntry(name, gres_type, count, indices, attributes)


def parse_gres(text: str) -> tuple[GresEntry, ...]:
    """Parse a GRES string into its entries; ``""``, ``"(null)"`` and ``"N/A"`` give ``()``.

    Raises:
        SlurmParseError: the string is not ``name[:type][:count][(KEY:value)]`` entries
            separated by commas.
    """
    if not isinstance(text, str):
        raise SlurmParseError(f"GRES must be a string, not {type(text).__name__}")
    stripped = text.strip()
    if stripped in ("", "(null)", "N/A"):
        return ()
    return tuple(_parse_entry(e.strip()) for e in _split_entries(stripped))


def gpu_indices(text: str) -> tuple[int, ...]:
    """The GPU indices named in one node's GRES detail (all ``gpu`` entries, any type).

    ``gpu(IDX:N/A)`` and strings without GPUs give ``()``.

    Raises:
        SlurmParseError: as :func:`parse_gres`.
    """
    out: list[int] = []
    for entry in parse_gres(text):
        if entry.name == "gpu" and entry.indices is not None:
            out.extend(entry.indices)
    return tuple(out)
