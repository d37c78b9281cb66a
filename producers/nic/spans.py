"""NIC port readings folded into spans, one port at a time and without keeping the readings: the
incremental form of :func:`~peerwatch.producers.nic.window.port_window` (pure, standard library
only), for readers that see every tick of many ports (the OTLP exporter, a job's report).

Per pair of consecutive readings of a port: the counter arithmetic of
:mod:`peerwatch.producers.nic.counters` (a :class:`~peerwatch.producers.nic.counters.CounterTracker`
per port: deltas, a reset restarts the baseline, a saturated counter gives no rate for the span,
``port_*_data`` words x 4) and its :func:`~peerwatch.producers.nic.counters.downtime`. A span
closes at the first reading at least ``span_s`` after it started (or at :meth:`PortSpans.close_all`)
and becomes a :class:`~peerwatch.producers.nic.window.PortWindow`.

Bounded: at most ``max_ports`` ports are folded at once (the least recently read goes first,
counted in ``ports_dropped_cap``), and a port without a reading for ``stale_after_s`` goes
(``ports_evicted_stale``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from peerwatch.clock import SYSTEM_CLOCK, Clock
from peerwatch.producers.nic.counters import CounterTracker, downtime
from peerwatch.producers.nic.window import PortWindow
from peerwatch.streams.core.settings import NetworkSettings

#: One port of one node: ``(node, port name)``.
PortKey = tuple[str, str]


@dataclass
class _Span:
    """What one port did since its span started (see the module doc)."""

    tracker: CounterTracker
    last_ts_ms: int
    last_up: bool | None
    updated_s: float
    start_ms: int
    #: The latest reading (its state and identity close the span at :meth:`PortSpans.close_all`).
    last_reading: Mapping[str, Any]
    readings: int = 0
    sums: dict[str, int] = field(default_factory=dict)
    elapsed_ms: dict[str, int] = field(default_factory=dict)
    saturated: set[str] = field(default_factory=set)
    down_s: float = 0.0
    unknown_s: float = 0.0
    flaps: int = 0
    min_rate_gbps: float | None = None
    max_rate_gbps: float | None = None


@dataclass(frozen=True)
class ClosedSpan:
    """A finished span of one port: the window, the latest reading (its state and identity) and
    the port's rated speed (``network.rated_gbps``, else the highest rate it has shown)."""

    key: PortKey
    window: PortWindow
    up: bool | None
    rate_gbps: float | None
    rated_gbps: float | None
    reading: Mapping[str, Any]


@dataclass
class PortStats:
    """What the folding did (the exporter's own telemetry)."""

    readings: int = 0
    readings_out_of_order: int = 0
    spans_closed: int = 0
    counter_resets: int = 0
    counter_saturations: int = 0
    ports_dropped_cap: int = 0
    ports_evicted_stale: int = 0


def _counters(reading: Mapping[str, Any]) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for group in ("counters", "hw_counters"):
        for name, value in (reading.get(group) or {}).items():
            ok = isinstance(value, int) and not isinstance(value, bool)
            out[str(name)] = value if ok else None
    return out


def _rate(reading: Mapping[str, Any]) -> float | None:
    rate = reading.get("rate_gbps")
    return float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else None


class PortSpans:
    """Folds NodeNicSample readings into per-port spans; see the module doc. Not thread-safe
    (one reader calls it)."""

    def __init__(
        self,
        *,
        span_s: float,
        network: NetworkSettings | None = None,
        max_ports: int = 100_000,
        stale_after_s: float = 900.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``span_s``: seconds of readings per span. Raises ValueError for a non-positive bound."""
        if span_s <= 0 or max_ports < 1 or stale_after_s <= 0:
            raise ValueError("span_s, max_ports and stale_after_s must be positive")
        self.span_ms = int(span_s * 1000)
        self.network = network or NetworkSettings()
        self.max_ports = max_ports
        self.stale_after_s = stale_after_s
        self._clock = clock
        # Least recently read first: the cap and staleness pop from the front.
        self._spans: OrderedDict[PortKey, _Span] = OrderedDict()
        self.stats = PortStats()

    def __len__(self) -> int:
        return len(self._spans)

    def add_sample(self, sample: Mapping[str, Any]) -> list[ClosedSpan]:
        """Fold one NodeNicSample; returns the spans it closed. Raises KeyError or TypeError
        for a sample without node, ts_ms or port names (the caller dead-letters it)."""
        node, ts_ms = str(sample["node"]), int(sample["ts_ms"])
        interval_ms = int(sample.get("interval_ms") or 1000)
        max_gap_ms = int(self.network.max_gap_intervals * max(interval_ms, 1))
        now_s = self._clock.monotonic_s()
        self._evict_stale(now_s)
        closed = []
        for reading in sample["ports"]:
            done = self._add(node, ts_ms, max_gap_ms, reading, now_s)
            if done is not None:
                closed.append(done)
        return closed

    def close_all(self) -> list[ClosedSpan]:
        """Close every open span that holds a pair of readings, at its latest reading (the end
        of a job's report, say); the ports stay, their next span starts there."""
        out = []
        for key, span in self._spans.items():
            if span.readings:
                last = span.last_reading
                out.append(self._close(key, span, span.last_ts_ms, span.last_up, _rate(last), last))
        return out

    def _evict_stale(self, now_s: float) -> None:
        cutoff_s = now_s - self.stale_after_s
        while self._spans:
            key, span = next(iter(self._spans.items()))
            if span.updated_s > cutoff_s:
                break
            del self._spans[key]
            self.stats.ports_evicted_stale += 1

    def _add(
        self, node: str, ts_ms: int, max_gap_ms: int, reading: Mapping[str, Any], now_s: float
    ) -> ClosedSpan | None:
        key = (node, str(reading["name"]))
        up = reading.get("up")
        up = up if isinstance(up, bool) else None
        rate = _rate(reading)
        counters = _counters(reading)
        span = self._spans.get(key)
        if span is None:
            if len(self._spans) >= self.max_ports:
                self._spans.popitem(last=False)
                self.stats.ports_dropped_cap += 1
            span = self._spans[key] = _Span(CounterTracker(), ts_ms, up, now_s, ts_ms, reading)
            span.tracker.update("", ts_ms, counters)  # the first reading is the baseline
            self._note_rate(span, rate)
            self.stats.readings += 1
            return None
        if ts_ms <= span.last_ts_ms:  # a redelivery or a restarted producer's replay
            self.stats.readings_out_of_order += 1
            return None
        self._fold(span, ts_ms, up, counters, max_gap_ms)
        self._note_rate(span, rate)
        span.updated_s, span.last_reading = now_s, reading
        self._spans.move_to_end(key)
        self.stats.readings += 1
        if ts_ms - span.start_ms < self.span_ms:
            return None
        return self._close(key, span, ts_ms, up, rate, reading)

    def _fold(
        self,
        span: _Span,
        ts_ms: int,
        up: bool | None,
        counters: Mapping[str, int | None],
        max_gap_ms: int,
    ) -> None:
        resets, saturations = span.tracker.resets, span.tracker.saturations
        # A counter unreadable for a while keeps its baseline: its delta spans from its own
        # previous reading, not the port's.
        since = {name: span.tracker.last.get(("", name), (ts_ms, 0))[0] for name in counters}
        for name, d in span.tracker.update("", ts_ms, counters).items():
            if d.saturated:
                span.saturated.add(name)
            if d.delta is not None:
                span.sums[name] = span.sums.get(name, 0) + d.delta
                span.elapsed_ms[name] = span.elapsed_ms.get(name, 0) + ts_ms - since[name]
        self.stats.counter_resets += span.tracker.resets - resets
        self.stats.counter_saturations += span.tracker.saturations - saturations
        # Each pair covers (previous, this]: the pairs tile the time line, so the spans' down
        # time adds up to what one downtime() over every reading gives, and a transition at this
        # reading is inside its pair.
        link = downtime(
            [(span.last_ts_ms, span.last_up), (ts_ms, up)], span.last_ts_ms + 1, ts_ms + 1,
            max_gap_ms,
        )  # fmt: skip
        span.down_s += link.down_s
        span.unknown_s += link.unknown_s
        span.flaps += link.flaps
        span.last_ts_ms, span.last_up = ts_ms, up
        span.readings += 1

    @staticmethod
    def _note_rate(span: _Span, rate: float | None) -> None:
        if rate is None or rate <= 0:
            return
        span.min_rate_gbps = rate if span.min_rate_gbps is None else min(span.min_rate_gbps, rate)
        span.max_rate_gbps = rate if span.max_rate_gbps is None else max(span.max_rate_gbps, rate)

    def _close(
        self,
        key: PortKey,
        span: _Span,
        ts_ms: int,
        up: bool | None,
        rate: float | None,
        reading: Mapping[str, Any],
    ) -> ClosedSpan:
        rates = {
            name: total / (span.elapsed_ms[name] / 1000)
            for name, total in span.sums.items()
            if span.elapsed_ms[name] > 0 and name not in span.saturated
        }
        window = PortWindow(
            key[1], span.start_ms, ts_ms, span.readings, rates, span.down_s, span.unknown_s,
            span.flaps, (), tuple(sorted(span.saturated)), span.min_rate_gbps,
        )  # fmt: skip
        rated = self.network.rated_gbps or span.max_rate_gbps
        closed = ClosedSpan(key, window, up, rate, rated, reading)
        # A new span starts at this reading; the highest rate seen stays (the rated fallback).
        span.start_ms, span.readings = ts_ms, 0
        span.sums, span.elapsed_ms, span.saturated = {}, {}, set()
        span.down_s = span.unknown_s = 0.0
        span.flaps = 0
        span.min_rate_gbps = rate if rate and rate > 0 else None
        self.stats.spans_closed += 1
        return closed
