"""Bounded latest-value store behind the OTLP observable instruments.

One *series* is one GPU in one job (``(job_id, node, gpu_index)``), or, in the store of the NIC
metrics, one port of one node (``(node, port)``: no job, so never ended by a JobEvent). For each
series the store keeps the latest gauge values and the running totals of counters, keyed by
metric name and full attribute set, so GPUs never overwrite each other. Memory and cardinality are bounded three ways:

* a ``JobEvent`` ENDED removes every series of the job (and late windows of an ended job are
  ignored until the job starts again: a requeue);
* a series without a new window for ``stale_after_s`` (processing time) is removed;
* at most ``max_series`` series are kept: inserting one more removes the least recently updated
  one, counted in ``stats.series_dropped_cap``.

Thread-safe: the consume loop writes while the SDK's reader thread calls :meth:`observe`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from peerwatch.clock import SYSTEM_CLOCK, Clock
from peerwatch.exporters.otlp import (
    IDENTITY_ATTRIBUTES,
    Attributes,
    EventCount,
    MetricPoint,
    StoreKey,
)

_PointKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass
class SeriesStats:
    """Counters of what the store did (read them for the exporter's own telemetry)."""

    windows_applied: int = 0
    windows_out_of_order: int = 0
    windows_of_ended_jobs: int = 0
    series_evicted_ended: int = 0
    series_evicted_stale: int = 0
    series_dropped_cap: int = 0


@dataclass
class _Series:
    window_start_ms: int
    updated_s: float
    values: dict[_PointKey, tuple[float, Attributes]] = field(default_factory=dict)


def _point_key(point: MetricPoint) -> _PointKey:
    # Identity attributes are the series' own (a late-known user or UUID must replace the
    # value, not add a second one); what remains (e.g. error.type) tells points apart.
    extra = ((k, repr(v)) for k, v in point.attributes.items() if k not in IDENTITY_ATTRIBUTES)
    return (point.name, tuple(sorted(extra)))


class SeriesStore:
    """The latest value of every (metric, attributes) per live series; see the module doc."""

    def __init__(
        self,
        *,
        max_series: int = 100_000,
        stale_after_s: float = 900.0,
        max_ended_jobs: int = 10_000,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``stale_after_s``: seconds without a window before a series is dropped.

        ``max_ended_jobs`` bounds the memory of ended job ids. Raises ValueError for a
        non-positive bound.
        """
        if max_series < 1 or stale_after_s <= 0 or max_ended_jobs < 1:
            raise ValueError("max_series, stale_after_s and max_ended_jobs must be positive")
        self.max_series = max_series
        self.stale_after_s = stale_after_s
        self._max_ended = max_ended_jobs
        self._clock = clock
        self._lock = threading.Lock()
        # Least recently updated first: eviction under the cap pops from the front.
        self._series: OrderedDict[StoreKey, _Series] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()
        self.stats = SeriesStats()

    def __len__(self) -> int:
        with self._lock:
            return len(self._series)

    def apply_window(
        self, key: StoreKey, window_start_ms: int, points: Iterable[MetricPoint]
    ) -> bool:
        """Apply one window's points to series ``key``. Returns False when it was ignored.

        Gauges take the new value; counters add the window's increment. A window not newer than
        the series' last one (a redelivery) is ignored so counters never count twice.
        """
        now_s = self._clock.monotonic_s()
        with self._lock:
            if key[0] in self._ended:
                self.stats.windows_of_ended_jobs += 1
                return False
            series = self._series.get(key)
            if series is None:
                if len(self._series) >= self.max_series:
                    self._series.popitem(last=False)
                    self.stats.series_dropped_cap += 1
                series = self._series[key] = _Series(window_start_ms - 1, now_s)
            if window_start_ms <= series.window_start_ms:
                self.stats.windows_out_of_order += 1
                return False
            for point in points:
                pkey = _point_key(point)
                if point.kind == "counter":
                    previous = series.values.get(pkey, (0.0, point.attributes))[0]
                    series.values[pkey] = (previous + point.value, point.attributes)
                else:
                    series.values[pkey] = (point.value, point.attributes)
            series.window_start_ms = window_start_ms
            series.updated_s = now_s
            self._series.move_to_end(key)
            self.stats.windows_applied += 1
            return True

    def job_ended(self, job_id: str) -> int:
        """Remove every series of ``job_id`` and ignore its late windows; returns how many went."""
        with self._lock:
            self._ended[job_id] = None
            self._ended.move_to_end(job_id)
            while len(self._ended) > self._max_ended:
                self._ended.popitem(last=False)
            gone = [k for k in self._series if k[0] == job_id]
            for k in gone:
                del self._series[k]
            self.stats.series_evicted_ended += len(gone)
            return len(gone)

    def job_started(self, job_id: str) -> None:
        """Accept windows of ``job_id`` again (a requeued job keeps its id)."""
        with self._lock:
            self._ended.pop(job_id, None)

    def evict_stale(self) -> int:
        """Remove series without a window for ``stale_after_s``; returns how many went."""
        cutoff_s = self._clock.monotonic_s() - self.stale_after_s
        removed = 0
        with self._lock:
            # Ordered by last update: stop at the first fresh one.
            while self._series:
                key, series = next(iter(self._series.items()))
                if series.updated_s > cutoff_s:
                    break
                del self._series[key]
                removed += 1
            self.stats.series_evicted_stale += removed
        return removed

    def observe(self, metric_name: str) -> list[tuple[float, Attributes]]:
        """Every current ``(value, attributes)`` of ``metric_name``, stale series evicted first."""
        self.evict_stale()
        with self._lock:
            return [
                value
                for series in self._series.values()
                for (name, _), value in series.values.items()
                if name == metric_name
            ]

    def snapshot(self) -> Mapping[StoreKey, int]:
        """Live series and the start (ms) of their latest window, for tests and debugging."""
        with self._lock:
            return {k: s.window_start_ms for k, s in self._series.items()}


class EventCounts:
    """Cumulative counts of events (findings, recommendations) behind observable counters.

    Each event id is counted once (a redelivered record is not counted again; the last
    ``max_ids`` ids are remembered). At most ``max_series`` attribute sets are kept (the least
    recently counted goes first, counted in ``series_dropped_cap``). A job's series stay
    ``linger_s`` (processing time) after the job ends, so that the findings of a job that ended
    at once (a GPU that fell off the bus fails its job) are still exported, then go. Thread-safe.
    """

    def __init__(
        self,
        *,
        max_series: int = 100_000,
        max_ids: int = 100_000,
        linger_s: float = 900.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if max_series < 1 or max_ids < 1 or linger_s <= 0:
            raise ValueError("max_series, max_ids and linger_s must be positive")
        self.max_series = max_series
        self._max_ids = max_ids
        self.linger_s = linger_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ids: OrderedDict[str, None] = OrderedDict()
        # (name, sorted attributes) -> (count, attributes, job id)
        self._counts: OrderedDict[
            tuple[str, tuple[tuple[str, str], ...]], tuple[int, Attributes, str | None]
        ] = OrderedDict()
        # job id -> monotonic s when its series go
        self._ending: dict[str, float] = {}
        self.duplicates = 0
        self.series_dropped_cap = 0
        self.series_evicted_ended = 0

    def count(self, event: EventCount) -> bool:
        """Count ``event`` unless its id was counted already; returns whether it counted."""
        key = (event.name, tuple(sorted((k, repr(v)) for k, v in event.attributes.items())))
        with self._lock:
            if event.event_id in self._ids:
                self.duplicates += 1
                return False
            self._ids[event.event_id] = None
            while len(self._ids) > self._max_ids:
                self._ids.popitem(last=False)
            previous = self._counts.pop(key, None)
            if previous is None and len(self._counts) >= self.max_series:
                self._counts.popitem(last=False)
                self.series_dropped_cap += 1
            n = previous[0] if previous else 0
            self._counts[key] = (n + 1, event.attributes, event.job_id)
            return True

    def job_ended(self, job_id: str) -> None:
        """The series of ``job_id`` go ``linger_s`` from now (a requeue that starts it again
        before then keeps them: :meth:`job_started`)."""
        with self._lock:
            self._ending[job_id] = self._clock.monotonic_s() + self.linger_s

    def job_started(self, job_id: str) -> None:
        with self._lock:
            self._ending.pop(job_id, None)

    def evict_ended(self) -> int:
        """Remove the series of jobs ended more than ``linger_s`` ago; returns how many went."""
        now_s = self._clock.monotonic_s()
        with self._lock:
            due = {job for job, at_s in self._ending.items() if at_s <= now_s}
            if not due:
                return 0
            gone = [k for k, (_, _, job) in self._counts.items() if job in due]
            for k in gone:
                del self._counts[k]
            for job in due:
                del self._ending[job]
            self.series_evicted_ended += len(gone)
            return len(gone)

    def observe(self, name: str) -> list[tuple[int, Attributes]]:
        """Every current ``(count, attributes)`` of counter ``name`` (lingering ended jobs'
        series evicted first)."""
        self.evict_ended()
        with self._lock:
            return [(n, attrs) for (metric, _), (n, attrs, _) in self._counts.items()
                    if metric == name]  # fmt: skip

    def __len__(self) -> int:
        with self._lock:
            return len(self._counts)
