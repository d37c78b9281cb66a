"""Field normalisers shared by the Slurm JSON parsers: numbers, times, states, exit codes.

Each takes the raw JSON value plus a :class:`Ctx` naming the record, and raises
:class:`SlurmParseError` naming the record and field.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["Ctx", "exit_status", "number", "short", "split_state", "ts_ms"]

#: Numbers beyond a signed 64-bit long are refused (no record field holds them).
MAX_NUMBER = (1 << 63) - 1
#: Times at or beyond the end of year 9999 (seconds) are refused.
MAX_TS_S = 253_402_300_800
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel = 3


def short(value: Any) -> str:
    """A bounded repr for error messages (deep or huge values stay short)."""
    return _SHORT.repr(value)


class Ctx:
    """Which record is being read, so every error message can name it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, key: str, message: str) -> SlurmParseError:
        return SlurmParseError(f"{self.what}: field {key!r}: {message}")

    def get(self, obj: Mapping[str, Any], key: str, kinds: tuple[type, ...]) -> Any:
        value = obj.get(key)
        if value is not None and not isinstance(value, kinds):
            names = "/".join(k.__name__ for k in kinds)
            raise self.fail(key, f"expected {names}, got {type(value).__name__} {short(value)}")
        return value

    def require(self, obj: Mapping[str, Any], key: str, kinds: tuple[type, ...]) -> Any:
        if key not in obj or obj[key] is None:
            raise self.fail(key, "missing")
        return self.get(obj, key, kinds)

    def text(self, obj: Mapping[str, Any], key: str) -> str | None:
        """A user text field (job name, reason...); a lone surrogate (a JSON ``\\ud800``
        escape) becomes U+FFFD, as a byte that is not UTF-8 does when output is read."""
        value = self.get(obj, key, (str,))
        return _SURROGATE.sub("\ufffd", value) if value else None


def number(value: Any, ctx: Ctx, key: str) -> int | None:
    """An int, or a ``{"set", "infinite", "number"}`` struct; None when unset or infinite."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ctx.fail(key, f"expected a number, got {short(value)}")
    if isinstance(value, int):
        return _in_range(value, ctx, key)
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", True):
            return None
        number = value.get("number")
        if isinstance(number, int) and not isinstance(number, bool):
            return _in_range(number, ctx, key)
    raise ctx.fail(key, f"expected a number or {{set, infinite, number}}, got {short(value)}")


def _in_range(value: int, ctx: Ctx, key: str) -> int:
    if not -MAX_NUMBER <= value <= MAX_NUMBER:
        raise ctx.fail(key, f"number out of range: {short(value)}")
    return value


def ts_ms(value: Any, ctx: Ctx, key: str) -> int | None:
    """Seconds since the epoch -> int ms; None when unset (0). Raises SlurmParseError for a
    time no record can hold (beyond year 9999 or before 1970)."""
    seconds = number(value, ctx, key)
    if seconds is None or seconds == 0:
        return None
    if not 0 < seconds < MAX_TS_S:
        raise ctx.fail(key, f"time out of range: {seconds} s")
    return seconds * 1000


def split_state(
    value: Any, extra_flags: Any, base: frozenset[str], ctx: Ctx, key: str
) -> tuple[str, tuple[str, ...]]:
    if isinstance(value, str):
        parts = [p for p in value.replace(",", "+").split("+") if p]
    elif isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        raise ctx.fail(key, f"expected a string or a list of strings, got {short(value)}")
    if isinstance(extra_flags, Sequence) and not isinstance(extra_flags, str):
        parts.extend(str(f) for f in extra_flags)
    parts = [p.strip().upper() for p in parts if p.strip()]
    if not parts:
        raise ctx.fail(key, "empty state")
    main = next((p for p in parts if p in base), parts[0])
    flags = tuple(dict.fromkeys(p for p in parts if p != main))
    return main, flags


def exit_status(value: Any, ctx: Ctx, key: str) -> tuple[int | None, int | None]:
    """(return code, signal) from a raw wait status or an exit-code object."""
    if value is None:
        return None, None
    if isinstance(value, int) and not isinstance(value, bool):
        # squeue 22.05 prints the raw waitpid() status.
        raw_signal = value & 0x7F
        return (None, raw_signal) if raw_signal else ((value >> 8) & 0xFF, None)
    if not isinstance(value, Mapping):
        raise ctx.fail(key, f"expected a number or an exit-code object, got {short(value)}")
    status = value.get("status")
    if status is None:
        statuses: list[Any] = []
    elif isinstance(status, str):
        statuses = [status]
    elif isinstance(status, Sequence) and all(isinstance(s, str) for s in status):
        statuses = list(status)
    else:
        raise ctx.fail(f"{key}.status", f"expected a string or a list of strings, got "
                                        f"{short(status)}")  # fmt: skip
    code = number(value.get("return_code"), ctx, f"{key}.return_code")
    signal_obj = value.get("signal")
    signal: int | None = None
    if isinstance(signal_obj, Mapping):
        signal = number(signal_obj.get("id"), ctx, f"{key}.signal.id")
    if "PENDING" in statuses or "INVALID" in statuses:
        return None, None
    if "SIGNALED" in statuses or "CORE_DUMPED" in statuses:
        return None, signal or None
    return code, None
