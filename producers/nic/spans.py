"""NIC port readings folded into spans, one port at a time and without keeping the readings: the
incremental form of :func:`~peerwatch.producers.nic.window.port_window` (pure, standard library
only), for readers that see every tick of many ports (the OTLP exporter, a job's report).

The arithmetic is :mod:`peerwatch.producers.nic.counters`: per pair of consecutive readings its
:func:`~peerwatch.producers.nic.counters.downtime`; per counter and *segment* its
:func:`~peerwatch.producers.nic.counters.counter_delta` (``port_*_data`` words x 4; a saturated
counter gives no rate for the span). A segment runs from the span's start (or the reading after
a reset: a counter that went down) to the span's end (or the reading before the reset), so a
reading costs a comparison per counter, not a delta (about 100,000 port readings a second at
100,000 GPUs). A span closes at the first reading at least ``span_s`` after it started (or at
:meth:`PortSpans.close_all`) and becomes a :class:`~peerwatch.producers.nic.window.PortWindow`:
the same rates as :func:`~peerwatch.producers.nic.window.port_window` over those readings.

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
from peerwatch.producers.nic.counters import counter_delta, downtime
from peerwatch.producers.nic.window import PortWindow
from peerwatch.streams.core.network_peers import CNP_COUNTERS, ERROR_COUNTERS, RETRANS_COUNTERS
from peerwatch.streams.core.settings import NetworkSettings

#: The counters the network features read (:data:`peerwatch.streams.core.network_peers.FEATURES`:
#: errors, retransmits, CNPs, bytes, the xmit wait): what a reader of the features folds (the
#: others cost time per reading and are read by no one downstream).
FEATURE_COUNTERS = frozenset(
    (*ERROR_COUNTERS, *RETRANS_COUNTERS, *CNP_COUNTERS, "port_xmit_data", "port_rcv_data",
     "rx_bytes", "tx_bytes", "port_xmit_wait")
)  # fmt: skip

#: One port of one node: ``(node, port name)``.
PortKey = tuple[str, str]


@dataclass
class _Span:
    """What one port did since its span started (see the module doc)."""

    last_ts_ms: int
    last_up: bool | None
    updated_s: float
    start_ms: int
    #: The latest reading (its state and identity close the span at :meth:`PortSpans.close_all`).
    last_reading: Mapping[str, Any]
    readings: int = 0
    #: The latest reading whose state was known, ``(ts_ms, up)``: a flap is up -> not up across
    #: unreadable states too.
    known: tuple[int, bool] | None = None
    #: Per counter, the first ``(ts_ms, value)`` of its current segment (since the span started
    #: or since the counter was reset) and its latest good one.
    base: dict[str, tuple[int, int]] = field(default_factory=dict)
    last: dict[str, tuple[int, int]] = field(default_factory=dict)
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
        counters: frozenset[str] | None = FEATURE_COUNTERS,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``span_s``: seconds of readings per span; ``counters``: the counters folded (None:
        every one the readings have). Raises ValueError for a non-positive bound."""
        if span_s <= 0 or max_ports < 1 or stale_after_s <= 0:
            raise ValueError("span_s, max_ports and stale_after_s must be positive")
        self.span_ms = int(span_s * 1000)
        self.network = network or NetworkSettings()
        self.max_ports = max_ports
        self.stale_after_s = stale_after_s
        self.counters = counters
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
        span = self._spans.get(key)
        if span is None:
            if len(self._spans) >= self.max_ports:
                self._spans.popitem(last=False)
                self.stats.ports_dropped_cap += 1
            span = self._spans[key] = _Span(ts_ms, up, now_s, ts_ms, reading)
            span.known = None if up is None else (ts_ms, up)
            self._fold_counters(span, ts_ms, reading)  # the first reading is the baseline
            self._note_rate(span, rate)
            self.stats.readings += 1
            return None
        if ts_ms <= span.last_ts_ms:  # a redelivery or a restarted producer's replay
            self.stats.readings_out_of_order += 1
            return None
        self._fold(span, ts_ms, up, reading, max_gap_ms)
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
        reading: Mapping[str, Any],
        max_gap_ms: int,
    ) -> None:
        self._fold_counters(span, ts_ms, reading)
        # Each pair covers (previous, this]: the pairs tile the time line, so the spans' down
        # time adds up to what one downtime() over every reading gives, and a transition at this
        # reading is inside its pair.
        pair: list[tuple[int, bool | None]] = [(span.last_ts_ms, span.last_up), (ts_ms, up)]
        if span.last_up is None and span.known is not None:
            pair.insert(0, span.known)  # before the pair's time: it sets the state, holds none
        link = downtime(pair, span.last_ts_ms + 1, ts_ms + 1, max_gap_ms)
        span.down_s += link.down_s
        span.unknown_s += link.unknown_s
        span.flaps += link.flaps
        span.last_ts_ms, span.last_up = ts_ms, up
        if up is not None:
            span.known = (ts_ms, up)
        span.readings += 1

    def _fold_counters(self, span: _Span, ts_ms: int, reading: Mapping[str, Any]) -> None:
        """Per reading only what is cheap: a counter that went down was reset, so its segment
        is settled up to the reading before (:meth:`_settle`) and restarts here. Everything
        else is settled once, when the span closes. A null (or non-integer) value keeps the
        counter's last good one (its next segment spans the gap)."""
        last, only = span.last, self.counters
        for group in (reading.get("counters"), reading.get("hw_counters")):
            if not isinstance(group, Mapping):
                continue
            for name, value in group.items():
                if type(value) is not int or (only is not None and name not in only):
                    continue  # null, a bool or a float from a hostile producer; or not read
                seen = last.get(name)
                if seen is None:
                    span.base[name] = (ts_ms, value)
                elif value < seen[1]:
                    self._settle(span, name, seen)
                    span.base[name] = (ts_ms, value)
                    self.stats.counter_resets += 1
                    if counter_delta(name, seen[1], value, 0.0).saturated:  # reset to its top
                        span.saturated.add(name)
                        self.stats.counter_saturations += 1
                last[name] = (ts_ms, value)

    def _settle(self, span: _Span, name: str, upto: tuple[int, int]) -> None:
        """Add counter ``name``'s segment from its base to ``upto`` (the counter arithmetic's
        :func:`~peerwatch.producers.nic.counters.counter_delta`: a saturated counter gives no
        rate for the span, ``port_*_data`` words x 4)."""
        base = span.base.get(name)
        if base is None or upto[0] <= base[0]:
            return
        d = counter_delta(name, base[1], upto[1], (upto[0] - base[0]) / 1000)
        if d.saturated:
            span.saturated.add(name)
            self.stats.counter_saturations += 1
        if d.delta is not None:
            span.sums[name] = span.sums.get(name, 0) + d.delta
            span.elapsed_ms[name] = span.elapsed_ms.get(name, 0) + upto[0] - base[0]

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
        for name, upto in span.last.items():
            self._settle(span, name, upto)
            span.base[name] = upto  # the next span's segments start here
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
