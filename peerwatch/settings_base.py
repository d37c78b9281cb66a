"""The parts every settings table is made of: :func:`setting` (a field with its one-line doc),
:class:`Secret`, and the one validation style.

A table is a frozen dataclass whose fields are declared with :func:`setting`; every number
declares its range there (``setting(5, "...", lo=1, hi=3600)``, bounds inclusive; a number in a
list or table is held to its field's range). Its ``__post_init__`` calls :func:`check_types`,
which checks the type of every field (the annotations are the types), the declared ranges, and
that strings carry no NUL and stay under :data:`MAX_TEXT` characters; then the ``check_*``
helpers for choices and relations between fields. Every failure raises
:class:`~peerwatch.errors.ConfigError` whose ``field`` is ``<table>.<field>``. The tree and its
loader are in :mod:`peerwatch.settings`; this module imports nothing of peerwatch but the errors,
so the pure core can declare its tables here without import cycles.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, Field, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar

from peerwatch.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T", bound="DataclassInstance")


class Secret:
    """A string that prints as ``'**********'``; call :meth:`reveal` at the one place it is used."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


#: The lower bound of a number that must be above zero (``lo=POSITIVE``).
POSITIVE = 1e-9
#: Longest string a setting takes (paths, URLs, names): anything longer is a mistake.
MAX_TEXT = 4096


def setting(default: Any, doc: str, *, lo: float | None = None, hi: float | None = None) -> Any:
    """A dataclass field with its one-line ``doc`` (shown by ``peerwatch config`` and in
    docs/configuration.md) and, for numbers, its inclusive range ``lo``..``hi`` (checked by
    :func:`check_types`; a number field without both is refused there). Dict defaults are
    copied per instance."""
    meta: dict[str, Any] = {"doc": doc}
    if lo is not None or hi is not None:
        meta["range"] = (lo, hi)
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def doc_of(f: Field[Any]) -> str:
    return str(f.metadata.get("doc", ""))


def range_of(f: Field[Any]) -> tuple[float, float] | None:
    """The declared inclusive range of a number field (or of the numbers in it), else None."""
    bounds = f.metadata.get("range")
    return None if bounds is None else (bounds[0], bounds[1])


def _numbers_in(tp: Any) -> bool:
    """Whether values of annotation ``tp`` are or hold numbers (which then need a range)."""
    inner, _ = _optional(tp)
    if inner is bool:
        return False
    if inner in (int, float):
        return True
    args = typing.get_args(inner)
    return bool(args) and _numbers_in(args[-1])


def default_of(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise TypeError(f"{f.name} has no default")


_HINTS: dict[type, dict[str, Any]] = {}


def hints(cls: type) -> dict[str, Any]:
    """The resolved field annotations of a table class (cached)."""
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _optional(tp: Any) -> tuple[Any, bool]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def describe(tp: Any) -> str:
    """A type as a reader of the docs names it (``number``, ``list of integers`` ...)."""
    inner, optional = _optional(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if inner is bool:
        text = "true/false"
    elif inner is int:
        text = "integer"
    elif inner is float:
        text = "number"
    elif inner in (str, Secret):
        text = "string"
    elif origin in (frozenset, tuple):
        text = f"list of {describe(args[0])}s"
    elif origin is Mapping or origin is dict:
        text = f"table of {describe(args[1])}s"
    else:
        text = str(inner)
    return text + (" (optional)" if optional else "")


def conform(tp: Any, value: Any, where: str) -> Any:
    """``value`` as type ``tp`` (an int where a float is expected becomes a float; lists become
    the tuple or frozenset of the annotation), or ConfigError naming ``where``."""
    inner, optional = _optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(where, "must be set")
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if inner is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"must be true or false, got {value!r}")
        return value
    if inner is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"must be an integer, got {value!r}")
        return value
    if inner is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond every float
            bits = int(value).bit_length()
            raise ConfigError(where, f"must be finite, got an integer of {bits} bits") from None
        if not math.isfinite(number):
            raise ConfigError(where, f"must be finite, got {value!r}")
        return number
    if inner is str:
        if not isinstance(value, str):
            raise ConfigError(where, f"must be a string, got {type(value).__name__}")
        return _text(value, where)
    if inner is Secret:
        if isinstance(value, str):
            return Secret(_text(value, where))
        if not isinstance(value, Secret):
            raise ConfigError(where, f"must be a string, got {type(value).__name__}")
        return value
    if origin in (frozenset, tuple):
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
            raise ConfigError(where, f"must be a {describe(inner)}")
        items = [conform(args[0], v, where) for v in value]
        return frozenset(items) if origin is frozenset else tuple(items)
    if origin is Mapping or origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(where, f"must be a {describe(inner)}")
        return {_text(str(k), where): conform(args[1], v, where) for k, v in value.items()}
    raise TypeError(f"{where}: no rule for type {inner!r}")


def _text(value: str, where: str) -> str:
    """``value`` unless it holds a NUL (no path or name can) or is over MAX_TEXT characters."""
    if "\x00" in value:
        raise ConfigError(where, "must not contain a NUL character")
    if len(value) > MAX_TEXT:
        raise ConfigError(where, f"must be at most {MAX_TEXT} characters, got {len(value)}")
    return value


def _check_range(value: Any, bounds: tuple[float, float], where: str) -> None:
    """Every number in ``value`` (a number, a list or a table of them) lies within ``bounds``."""
    if isinstance(value, Mapping):
        items: Any = value.values()
    elif isinstance(value, tuple | frozenset | list | set):
        items = value
    else:
        items = (value,)
    lo, hi = bounds
    for v in items:
        if v is not None and not lo <= v <= hi:
            raise ConfigError(where, f"must be between {lo} and {hi}, got {v!r}")


def parse_text(tp: Any, text: str, where: str) -> Any:
    """An environment variable's text as type ``tp``: numbers, ``true/false/1/0/yes/no``, lists
    as ``a,b,c``, tables as ``k=v,k=v``. Raises ConfigError naming ``where``."""
    inner, _ = _optional(tp)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    text = text.strip()
    try:
        if inner is bool:
            low = text.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{text!r} is not true or false")
        if inner is int:
            return int(text)
        if inner is float:
            return float(text)
        if origin in (frozenset, tuple):
            return [parse_text(args[0], t, where) for t in text.split(",") if t.strip()]
        if origin is Mapping or origin is dict:
            out: dict[str, Any] = {}
            for item in filter(str.strip, text.split(",")):
                key, sep, val = item.partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"{item!r} is not key=value")
                out[key.strip()] = parse_text(args[1], val, where)
            return out
    except ValueError as exc:
        raise ConfigError(where, f"{text!r}: {exc}") from exc
    return text


def check_types(obj: Any, table: str) -> None:
    """Raise ConfigError for the first field of ``obj`` whose value does not fit its annotation
    (an int in a float field is accepted: TOML writes ``4`` for ``4.0``) or its declared range.
    Raises TypeError for a number field declared without a range (a programming error)."""
    tps = hints(type(obj))
    for f in fields(obj):
        where = f"{table}.{f.name}"
        value = conform(tps[f.name], getattr(obj, f.name), where)
        bounds = range_of(f)
        if bounds is None:
            if _numbers_in(tps[f.name]):
                raise TypeError(f"{where}: a number setting needs setting(..., lo=, hi=)")
            continue
        _check_range(value, bounds, where)


def check_one_of(obj: Any, table: str, name: str, allowed: tuple[str, ...]) -> None:
    value = getattr(obj, name)
    if value not in allowed:
        raise ConfigError(f"{table}.{name}", f"{value!r} is not one of {', '.join(allowed)}")


def from_mapping(cls: type[_T], table: str, data: Mapping[str, Any], base: _T | None = None) -> _T:
    """``base`` (or the defaults) with the fields of ``data`` replaced; every value goes through
    :func:`conform`. Raises ConfigError for an unknown key (by name) or a bad value."""
    tps = hints(cls)
    changes: dict[str, Any] = {}
    for key, value in data.items():
        if key not in tps:
            raise ConfigError(f"{table}.{key}", "unknown setting")
        changes[key] = conform(tps[key], value, f"{table}.{key}")
    return replace(base, **changes) if base is not None else cls(**changes)


def to_plain(obj: Any) -> dict[str, Any]:
    """A table as plain values (sets and tuples as sorted lists, secrets revealed: callers that
    print decide what to do with them)."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, frozenset):
            value = sorted(value)
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, Secret):
            value = value.reveal()
        out[f.name] = value
    return out
