"""One NIC port over one window, from its NodeNicSample readings: what the stream's network
rules and the per-job peer comparison consume (pure, standard library only).

A window's rates come from the first and last good reading of each counter inside it, so a
missing tick costs nothing; a reset inside the window restarts from the value after it (the
counts before the reset are lost, counted in ``resets``); a counter saturated anywhere in the
window gives no rate (``saturated``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


def _counter_rate(name: str, points: Sequence[tuple[int, int]]) -> tuple[float | None, bool, bool]:
    """(rate per second, reset seen, saturated seen) of one counter's ``(ts_ms, value)``."""
    reset = saturated = False
    total = 0
    span_ms = 0
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        d = counter_delta(name, v0, v1, (t1 - t0) / 1000)
        reset |= d.reset
        saturated |= d.saturated
        if d.delta is not None:
            total += d.delta
            span_ms += t1 - t0
    if saturated or span_ms <= 0:
        return None, reset, saturated
    return total / (span_ms / 1000), reset, saturated


def port_window(
    name: str,
    readings: Sequence[tuple[int, Mapping[str, Any]]],
    start_ms: int,
    end_ms: int,
    max_gap_ms: int,
) -> PortWindow:
    """Summarise port ``name`` from ``(ts_ms, NicPortReading)`` pairs in time order.

    Readings before ``start_ms`` set the initial link state only (as ``downtime`` takes them);
    counters use the readings inside the window. ``max_gap_ms`` (e.g. two sampling intervals):
    how long one reading's state is taken to hold. Raises ValueError when ``end_ms < start_ms``.
    """
    inside = [(ts, r) for ts, r in readings if start_ms <= ts < end_ms]
    series: dict[str, list[tuple[int, int]]] = {}
    for ts, reading in inside:
        for group in ("counters", "hw_counters"):
            for counter, value in (reading.get(group) or {}).items():
                if isinstance(value, int) and not isinstance(value, bool):
                    series.setdefault(counter, []).append((ts, value))
    rates: dict[str, float] = {}
    resets: list[str] = []
    saturated: list[str] = []
    for counter in sorted(series):
        rate, reset, sat = _counter_rate(counter, series[counter])
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
