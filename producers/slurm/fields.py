"""Field normalisers shared by the Slurm JSON parsers: numbers, times, states, exit codes.

Each takes the raw JSON value plus a :class:`Ctx` naming the record, and raises
:class:`SlurmParseError` naming the record and field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["Ctx", "exit_status", "number", "split_state", "ts_ms"]


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
            raise self.fail(key, f"expected {names}, got {type(value).__name__} {value!r}")
        return value

    def require(self, obj: Mapping[str, Any], key: str, kinds: tuple[type, ...]) -> Any:
        if key not in obj or obj[key] is None:
            raise self.fail(key, "missing")
        return self.get(obj, key, kinds)

    def text(self, obj: Mapping[str, Any], key: str) -> str | None:
        value = self.get(obj, key, (str,))
        return value or None


def number(value: Any, ctx: Ctx, key: str) -> int | None:
    """An int, or a ``{"set", "infinite", "number"}`` struct; None when unset or infinite."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ctx.fail(key, f"expected a number, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, Mapping):
        if value.get("infinite") or not value.get("set", True):
            return None
        number = value.get("number")
        if isinstance(number, int) and not isinstance(number, bool):
            return number
    raise ctx.fail(key, f"expected a number or {{set, infinite, number}}, got {value!r}")


def ts_ms(value: Any, ctx: Ctx, key: str) -> int | None:
    seconds = number(value, ctx, key)
    return None if seconds is None or seconds == 0 else seconds * 1000


def split_state(
    value: Any, extra_flags: Any, base: frozenset[str], ctx: Ctx, key: str
) -> tuple[str, tuple[str, ...]]:
    if isinstance(value, str):
        parts = [p for p in value.replace(",", "+").split("+") if p]
    elif isinstance(value, Sequence) and all(isinstance(p, str) for p in value):
        parts = list(value)
    else:
        raise ctx.fail(key, f"expected a string or a list of strings, got {value!r}")
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
        raise ctx.fail(key, f"expected a number or an exit-code object, got {value!r}")
    status = value.get("status")
    statuses = [status] if isinstance(status, str) else list(status or [])
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
