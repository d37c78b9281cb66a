"""The hot stage's view of its input's timing: consumer lag and the nodes' clock offsets.

Lag: high watermark - position over the assigned samples partitions, from the consumer's cached
watermarks (no broker request), at most once a second. Clock offsets: the sample times of a
batch read live against the time it was received (:mod:`~peerwatch.streams.core.clock_offset`);
nodes newly past the warning threshold are logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from peerwatch.schemas.columns import Table
from peerwatch.streams.core.clock_offset import ClockOffsets
from peerwatch.streams.core.windows import VALUE_LIMIT

log = logging.getLogger(__name__)
#: A batch's newest sample time may run ahead of the wall time since the last batch by this
#: much (a tick, jitter) and the partition still counts as read live (ms).
LIVE_SLACK_MS = 2000
#: Nodes newly past the clock-skew threshold logged one by one per refresh (then a count).
CLOCK_WARNINGS_AT_ONCE = 10


class HotClocks:
    """Lag and clock offsets of one hot stage, into ``counters`` (``consumer_lag``,
    ``clock_offsets_ms``, ``clock_skewed_nodes``)."""

    def __init__(self, counters: Any, clock_skew_warn_ms: int) -> None:
        self.counters = counters
        self.clocks = ClockOffsets()
        self.clock_skew_warn_ms = clock_skew_warn_ms
        #: Samples behind the head per assigned partition, as last measured.
        self.lags: dict[int, int] = {}
        #: partition -> (newest sample time, receive time) of its last batch read at the head
        self._prev: dict[int, tuple[int, int]] = {}
        self._lag_due_s = 0.0
        self._clocks_due_s = 0.0
        self._warned: set[str] = set()

    def forget(self, partition: int) -> None:
        """A partition no longer assigned (its next batch is not compared with its last)."""
        self._prev.pop(partition, None)

    def measure_lag(self, consumer: Any, topic: str, partitions: Iterable[int]) -> None:
        """``counters.consumer_lag`` of the assigned ``partitions``, at most once a second."""
        now_s = time.monotonic()
        parts = sorted(partitions)
        if now_s < self._lag_due_s or not parts:
            return
        self._lag_due_s = now_s + 1.0
        from confluent_kafka import KafkaException, TopicPartition

        tps = [TopicPartition(topic, p) for p in parts]
        try:
            lags: dict[int, int] = {}
            for tp in consumer.position(tps):
                _low, high = consumer.get_watermark_offsets(tp, cached=True)
                if high >= 0 and tp.offset >= 0:
                    lags[tp.partition] = max(high - tp.offset, 0)
        except KafkaException as exc:
            log.debug("hot stage: lag not measured (%s)", exc)
            return
        self.lags = lags
        self.counters.consumer_lag = sum(lags.values())

    def observe(
        self, p: int, batch_len: int, tables: Mapping[str, Table], name_of: Callable[[int], str]
    ) -> None:
        """Feed the clock-offset estimate the valid samples of partition ``p``'s batch of
        ``batch_len`` messages when it was read live (:meth:`_live`), against the time it was
        received (``name_of``: its aggregator's node name of a code); at most once a
        second, refresh the offsets in the counters and log nodes newly past the threshold."""
        received_ms = int(time.time() * 1000)
        top = tables[""]
        ts = top.values["ts_ms"]
        ok = (ts >= 0) & (ts < VALUE_LIMIT)  # the rest is dead-lettered as invalid (counted)
        if ok.any() and self._live(p, batch_len, int(ts[ok].max()), received_ms):
            self.clocks.observe(name_of, top.values["node"][ok], ts[ok],
                                np.full(int(ok.sum()), received_ms, np.int64))  # fmt: skip
        now = time.monotonic()
        if now < self._clocks_due_s:
            return
        self._clocks_due_s = now + 1.0
        self._refresh()

    def _refresh(self) -> None:
        offsets = self.clocks.offsets_ms()
        warn = self.clock_skew_warn_ms
        skewed = {n: v for n, v in offsets.items() if abs(v) >= warn}
        new = sorted(skewed.keys() - self._warned)
        for node in new[:CLOCK_WARNINGS_AT_ONCE]:
            log.warning("node %s: its clock runs %+.1f s from the fleet's median clock",
                        node, skewed[node] / 1000.0)  # fmt: skip
        if len(new) > CLOCK_WARNINGS_AT_ONCE:
            log.warning("... and %d more nodes 1 s or more off the fleet's clock "
                        "(peerwatch_node_clock_offset_seconds)", len(new) - CLOCK_WARNINGS_AT_ONCE)  # fmt: skip
        self._warned = set(skewed) | {
            n for n in self._warned if abs(offsets.get(n, 0)) >= warn // 2
        }
        self.counters.clock_offsets_ms = offsets
        self.counters.clock_skewed_nodes = len(skewed)

    def _live(self, p: int, batch_len: int, top_ms: int, received_ms: int) -> bool:
        """Whether partition ``p`` is read live: it was at most one batch length behind its head
        when its lag was last measured (:meth:`measure_lag`, once a second; asking librdkafka
        on every batch stalled the worker), and its newest sample time moved on from the
        previous such batch's by no more than the wall time between them (plus a tick's slack).
        A backlog, or input published faster than real time (a catch-up, a benchmark), says
        nothing of the nodes' clocks through its receive times."""
        lag = self.lags.get(p)
        if lag is None or lag > batch_len:
            self._prev.pop(p, None)
            return False
        prev = self._prev.get(p)
        self._prev[p] = (top_ms, received_ms)
        return prev is not None and top_ms - prev[0] <= received_ms - prev[1] + LIVE_SLACK_MS
