"""One NIC port over one window, from its NodeNicSample readings: what the stream's network
rules and the per-job peer comparison consume (pure, standard library only).

A window's rates come from the first and last good reading of each counter inside it, so a
missing tick costs nothing; a reset inside the window restarts from the value after it (the
counts before the reset are lost, counted in ``resets``); a counter saturated anywhere in the
window gives no rate (``saturated``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from peerwatch.producers.nic.counters import counter_delta, downtime


@dataclass(frozen=True)
class PortWindow:
    """One port in ``[start_ms, end_ms)``.

    ``rates_per_s``: counter name -> mean rate over the window (bytes/s for ``port_*_data``);
    absent where no rate can be had. ``down_s`` / ``unknown_s`` / ``flaps``: see
    ``counters.downtime``. ``min_rate_gbps``: the lowest link rate read (None: never read).
    """

    name: str
    start_ms: int
    end_ms: int
    readings: int
    rates_per_s: Mapping[str, float] = field(default_factory=dict)
    down_s: float = 0.0
    unknown_s: float = 0.0
    flaps: int = 0
    resets: tuple[str, ...] = ()
    saturated: tuple[str, ...] = ()
    min_rate_gbps: float | None = None


def _rate_of(
    name: str, times: Sequence[int], values: Sequence[int], rising: bool
) -> tuple[float | None, bool, bool]:
    """(rate per second, reset seen, saturated seen) of one counter's good values at ``times``
    (ms, in time order). ``rising``: the caller knows the times rise strictly (else checked)."""
    if (
        len(values) > 1
        and list(values) == sorted(values)
        and (rising or list(times) == sorted(set(times)))
    ):
        # No reset and times strictly rising (most windows): the pairs' deltas add up to the
        # one delta over the whole span, exactly (integers), and a pair is saturated only if
        # the last value is. The same result as the loop below, a fraction of its cost.
        whole = counter_delta(name, values[0], values[-1], 0.0)
        if whole.delta is None:
            return None, False, whole.saturated
        return whole.delta / ((times[-1] - times[0]) / 1000), False, False
    reset = saturated = False
    total = 0
    span_ms = 0
    for (t0, v0), (t1, v1) in itertools.pairwise(zip(times, values, strict=True)):
        d = counter_delta(name, v0, v1, (t1 - t0) / 1000)
        reset |= d.reset
        saturated |= d.saturated
        if d.delta is not None:
            total += d.delta
            span_ms += t1 - t0
    if saturated or span_ms <= 0:
        return None, reset, saturated
    return total / (span_ms / 1000), reset, saturated


def _counter_rate(name: str, points: Sequence[tuple[int, int]]) -> tuple[float | None, bool, bool]:
    """(rate per second, reset seen, saturated seen) of one counter's ``(ts_ms, value)``."""
    return _rate_of(name, [t for t, _ in points], [v for _, v in points], False)


#: One counter's good readings in a window: (times in ms, values).
_Series = tuple[Sequence[int], Sequence[int]]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _columns(
    inside: Sequence[tuple[int, Mapping[str, Any]]], counters: Collection[str] | None
) -> dict[str, _Series] | None:
    """The counters of readings whose ``counters`` and ``hw_counters`` name the same counters
    in the same order (what one agent sends), a column at a time (far cheaper than a value at
    a time); None where the readings differ (the caller goes a reading at a time). Only the
    counters in ``counters`` (None: all)."""
    groups = []
    for group in ("counters", "hw_counters"):
        maps = [r.get(group) or {} for _, r in inside]
        if not all(type(m) is dict for m in maps):
            return None
        keys = tuple(maps[0])
        if any(tuple(m) != keys for m in maps):
            return None
        groups.append((keys, maps))
    if not set(groups[0][0]).isdisjoint(groups[1][0]):
        return None
    times = [ts for ts, _ in inside]
    series: dict[str, _Series] = {}
    for keys, maps in groups:
        wanted = [k for k in keys if counters is None or k in counters]
        if not wanted:
            continue
        if len(wanted) == 1:
            rows = [(m[wanted[0]],) for m in maps]
        else:
            get = itemgetter(*wanted)
            rows = [get(m) for m in maps]
        all_int = set(map(type, itertools.chain.from_iterable(rows))) == {int}
        for counter, column in zip(wanted, zip(*rows, strict=True), strict=True):
            if all_int:
                series[counter] = (times, column)
            elif good := [(t, v) for t, v in zip(times, column, strict=True) if _is_int(v)]:
                # a null, a bool or a float: the counter's good readings only
                series[counter] = ([t for t, _ in good], [v for _, v in good])
    return series


def port_window(
    name: str,
    readings: Sequence[tuple[int, Mapping[str, Any]]],
    start_ms: int,
    end_ms: int,
    max_gap_ms: int,
    counters: Collection[str] | None = None,
) -> PortWindow:
    """Summarise port ``name`` from ``(ts_ms, NicPortReading)`` pairs in time order.

    Readings before ``start_ms`` set the initial link state only (as ``downtime`` takes them);
    counters use the readings inside the window. ``max_gap_ms`` (e.g. two sampling intervals):
    how long one reading's state is taken to hold. ``counters``: the counters summarised (None:
    every one the readings have; a reader of a few saves the others' cost). Raises ValueError
    when ``end_ms < start_ms``.
    """
    inside = [(ts, r) for ts, r in readings if start_ms <= ts < end_ms]
    series = _columns(inside, counters) if inside else {}
    if series is None:
        points: dict[str, list[tuple[int, int]]] = {}
        for ts, reading in inside:
            for group in ("counters", "hw_counters"):
                for counter, value in (reading.get(group) or {}).items():
                    if (counters is None or counter in counters) and _is_int(value):
                        points.setdefault(counter, []).append((ts, value))
        series = {c: ([t for t, _ in p], [v for _, v in p]) for c, p in points.items()}
    # a counter's times are some of the window's: strictly rising when the window's are
    rising = all(a[0] < b[0] for a, b in itertools.pairwise(inside))
    rates: dict[str, float] = {}
    resets: list[str] = []
    saturated: list[str] = []
    for counter in sorted(series):
        rate, reset, sat = _rate_of(counter, *series[counter], rising)
        if rate is not None:
            rates[counter] = rate
        if reset:
            resets.append(counter)
        if sat:
            saturated.append(counter)
    link = downtime([(ts, r.get("up")) for ts, r in readings], start_ms, end_ms, max_gap_ms)
    link_rates = [r["rate_gbps"] for _, r in inside if isinstance(r.get("rate_gbps"), float)]
    return PortWindow(
        name, start_ms, end_ms, len(inside), rates, link.down_s, link.unknown_s, link.flaps,
        tuple(resets), tuple(saturated), min(link_rates, default=None),
    )  # fmt: skip


#: Most counters one port window may carry in a message (mlx5 has about 60; hostile beyond).
MAX_RATES = 256


def _number(value: Any, what: str) -> float:
    """A finite JSON number (not a bool). Raises TypeError/ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} is not a number")
    if not math.isfinite(value):
        raise ValueError(f"{what} is not finite")
    return float(value)


def _names(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_RATES:
        raise TypeError(f"{what} is not a list of at most {MAX_RATES} names")
    if not all(isinstance(v, str) and 0 < len(v) <= 64 for v in value):
        raise ValueError(f"{what} holds a name that is not a short string")
    return tuple(value)


def port_window_json(pw: PortWindow) -> dict[str, Any]:
    """A :class:`PortWindow` as plain JSON types (:func:`port_window_of_json` reads it back)."""
    return {
        "name": pw.name, "start_ms": pw.start_ms, "end_ms": pw.end_ms, "readings": pw.readings,
        "rates_per_s": dict(sorted(pw.rates_per_s.items())), "down_s": pw.down_s,
        "unknown_s": pw.unknown_s, "flaps": pw.flaps, "resets": list(pw.resets),
        "saturated": list(pw.saturated), "min_rate_gbps": pw.min_rate_gbps,
    }  # fmt: skip


def port_window_of_json(data: Any) -> PortWindow:
    """A :class:`PortWindow` from :func:`port_window_json`'s form, received from another stage:
    hostile input, checked field by field (a short name, ``0 <= start_ms <= end_ms < 2**53``,
    finite non-negative numbers, at most :data:`MAX_RATES` counters). Raises TypeError or
    ValueError naming the field."""
    if not isinstance(data, Mapping):
        raise TypeError("port window is not an object")
    name = data["name"]
    if not isinstance(name, str) or not 0 < len(name) <= 64:
        raise ValueError("port window name is not a short string")
    start, end, readings = data["start_ms"], data["end_ms"], data["readings"]
    for what, v in (("start_ms", start), ("end_ms", end), ("readings", readings)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**53:
            raise ValueError(f"port window {what} is not an integer in [0, 2**53)")
    if end < start:
        raise ValueError("port window end_ms before start_ms")
    rates = data["rates_per_s"]
    if not isinstance(rates, Mapping) or len(rates) > MAX_RATES:
        raise TypeError(f"port window rates_per_s is not an object of at most {MAX_RATES}")
    checked: dict[str, float] = {}
    for counter, rate in rates.items():
        if not isinstance(counter, str) or not 0 < len(counter) <= 64:
            raise ValueError("port window counter name is not a short string")
        checked[counter] = _number(rate, f"rate of {counter}")
        if checked[counter] < 0:
            raise ValueError(f"port window rate of {counter} is negative")
    flaps = data["flaps"]
    if isinstance(flaps, bool) or not isinstance(flaps, int) or not 0 <= flaps < 2**31:
        raise ValueError("port window flaps is not a small non-negative integer")
    down, unknown = _number(data["down_s"], "down_s"), _number(data["unknown_s"], "unknown_s")
    if down < 0 or unknown < 0:
        raise ValueError("port window down_s or unknown_s is negative")
    rate_gbps = data["min_rate_gbps"]
    return PortWindow(
        name, start, end, readings, checked, down, unknown, flaps,
        _names(data["resets"], "resets"), _names(data["saturated"], "saturated"),
        None if rate_gbps is None else _number(rate_gbps, "min_rate_gbps"),
    )  # fmt: skip
