"""Slurm hostlist expressions: ``gpu[1-2,07]``, ``a[01-03]b``, ``n1,n[3-4]``.

Expansion follows Slurm: top-level commas separate terms, every ``[...]`` group in a term
multiplies the names (``r[1-2]n[1-2]`` is four hosts), and a range keeps the zero padding of
its lower bound (``[07-10]`` gives ``07 08 09 10``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["MAX_HOSTS", "compress", "expand"]

#: A guard against expressions such as ``n[0-999999999]`` exhausting memory.
MAX_HOSTS = 1_000_000

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")


def _split_top_level(expr: str) -> list[str]:
    """Split at commas that are not inside brackets; reject unbalanced brackets."""
    terms: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise SlurmParseError(f"hostlist {expr!r}: nested '[' at offset {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmParseError(f"hostlist {expr!r}: unmatched ']' at offset {i}")
        elif ch == "," and depth == 0:
            terms.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise SlurmParseError(f"hostlist {expr!r}: unclosed '['")
    terms.append(expr[start:])
    return terms


def _expand_ranges(body: str, expr: str) -> list[str]:
    """``1-3,07`` -> ``['1', '2', '3', '07']``; padding is the width of each lower bound."""
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.fullmatch(part.strip())
        if m is None:
            raise SlurmParseError(f"hostlist {expr!r}: bad range {part!r} in [{body}]")
        lo_text, hi_text = m.group(1), m.group(2)
        lo = int(lo_text)
        hi = lo if hi_text is None else int(hi_text)
        if hi < lo:
            raise SlurmParseError(f"hostlist {expr!r}: range {part!r} runs backwards")
        if hi - lo + 1 + len(out) > MAX_HOSTS:
            raise SlurmParseError(f"hostlist {expr!r}: more than {MAX_HOSTS} hosts")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_term(term: str, expr: str) -> list[str]:
    pieces: list[list[str]] = []
    rest = term
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            pieces.append([rest])
            break
        if open_at:
            pieces.append([rest[:open_at]])
        close_at = rest.index("]", open_at)  # balanced: checked by _split_top_level
        pieces.append(_expand_ranges(rest[open_at + 1 : close_at], expr))
        rest = rest[close_at + 1 :]
    total = 1
    for piece in pieces:
        total *= len(piece)
    if total > MAX_HOSTS:
        raise SlurmParseError(f"hostlist {expr!r}: more than {MAX_HOSTS} hosts")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def expand(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in the expression's order.

    Whitespace around terms is ignored; empty terms (``a,,b``) are skipped; an empty or
    blank expression gives ``[]``. Duplicates are kept, as Slurm keeps them.

    Raises:
        SlurmParseError: unbalanced or nested brackets, a bad or backwards range, an empty
            bracket group, or more than :data:`MAX_HOSTS` names.
    """
    if not isinstance(expr, str):
        raise SlurmParseError(f"hostlist must be a string, not {type(expr).__name__}")
    hosts: list[str] = []
    for raw in _split_top_level(expr.strip()):
        term = raw.strip()
        if not term:
            continue
        hosts.extend(_expand_term(term, expr))
        if len(hosts) > MAX_HOSTS:
            raise SlurmParseError(f"hostlist {expr!r}: more than {MAX_HOSTS} hosts")
    return hosts


def _split_name(host: str) -> tuple[str, str, int, int] | None:
    """``gpu07-ib`` -> (prefix 'gpu', suffix '-ib', number 7, width 2); None without digits.

    Width 0 means "not zero padded"; numbers with a leading zero keep their width.
    """
    m = _LAST_NUMBER.match(host)
    if m is None:
        return None
    prefix, digits, suffix = m.groups()
    width = len(digits) if len(digits) > 1 and digits.startswith("0") else 0
    return prefix, suffix, int(digits), width


def _render_ranges(numbers: list[int], width: int) -> str:
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        lo, hi = str(start).zfill(width), str(prev).zfill(width)
        parts.append(lo if start == prev else f"{lo}-{hi}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def compress(hosts: Iterable[str]) -> str:
    """Compress host names into a hostlist expression (the inverse of :func:`expand`).

    Names are grouped by prefix, suffix and zero padding of their last number; groups come
    out sorted, numbers ascending, duplicates dropped. So ``expand(compress(h))`` holds the
    same names as ``h``, each once, and ``compress`` of that gives the same string again.

    Raises:
        SlurmParseError: a name is empty or contains ``[``, ``]`` or ``,``.
    """
    groups: dict[tuple[str, str, int], set[int]] = {}
    plain: set[str] = set()
    for host in hosts:
        if not host or any(ch in host for ch in "[],") or host != host.strip():
            raise SlurmParseError(f"cannot compress host name {host!r}")
        split = _split_name(host)
        if split is None:
            plain.add(host)
            continue
        prefix, suffix, number, width = split
        groups.setdefault((prefix, suffix, width), set()).add(number)
    terms: list[tuple[str, str]] = [(name, name) for name in plain]
    for (prefix, suffix, width), numbers in groups.items():
        ordered = sorted(numbers)
        body = _render_ranges(ordered, width)
        text = f"{prefix}{body}{suffix}" if len(ordered) == 1 else f"{prefix}[{body}]{suffix}"
        terms.append((f"{prefix}\0{suffix}\0{width:09d}", text))
    return ",".join(text for _, text in sorted(terms))


def hostlist_text(hosts: Iterable[str]) -> str:
    """Host names for people: :func:`compress`'s hostlist (``gpu[00000-00031]``), or, where a
    name cannot be in a hostlist (``[``, ``]``, ``,``, empty), the sorted names comma-separated.
    Raises nothing."""
    names = sorted({str(h) for h in hosts})
    try:
        return compress(names)
    except SlurmParseError:
        return ", ".join(names)
