"""Node clock offsets: how far each node's sample clock runs from its peers' (issue 15).

A node whose clock runs a few seconds ahead puts its samples into the wrong windows; at a job's
checkpoint or eval its windows straddle the change while its peers' do not. The detector gates
those windows (``phase_change_sm``); this estimate makes the cause visible to an operator: each
node's offset, in ms, exported per node (``peerwatch_node_clock_offset_seconds``).

The reference is a time taken after the sample left its node: the stream worker's clock when
it received a batch of a partition it reads live (the hot stage decides: at the head, sample
time advancing no faster than wall time; a backlog is not used). For
one sample, ``lead = ts_ms - ref_ms = offset - delay`` where ``delay`` (tick to receipt:
sampling, batching, the broker, the fetch) is never negative. So the *largest* lead of a node
over a recent stretch is its offset less its smallest delay, a bound that a late or spooled
delivery cannot move. Leads are kept per node over two buckets of reference time (``bucket_ms``
each: the estimate covers the last one to two buckets).

The offset reported is that lead *less the median lead of all nodes seen*: relative to the
fleet's clock, as the windows compare peers. This also cancels what every node shares: the
common delay, the worker's own clock error, and a backlog read behind the head (each node's
samples of one tick arrive together).

(The broker's LogAppendTime would be a reference too, but peerwatch's producers stamp messages
with the sample time, which replay and ``peerwatch job`` seek by.)

Pure: the hot stage feeds it decoded columns and the batches' receive times.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

import numpy as np

#: Fewer nodes than this give no offsets (a median of two tells nothing).
MIN_NODES = 3


class ClockOffsets:
    """See the module docstring. :meth:`observe` one batch at a time; :meth:`offsets_ms`.

    A node's lead is the largest of its own last one to two buckets of reference time; a node
    that stops sending keeps its last estimate for ``memory_buckets`` buckets of the fleet's
    reference time, then is forgotten."""

    def __init__(
        self, bucket_ms: int = 30_000, min_nodes: int = MIN_NODES, memory_buckets: int = 20
    ) -> None:
        if bucket_ms <= 0:
            raise ValueError(f"bucket_ms must be > 0, got {bucket_ms}")
        self.bucket_ms = bucket_ms
        self.min_nodes = min_nodes
        self.memory_buckets = memory_buckets
        self._latest: int | None = None  # the latest bucket seen
        #: node -> [its latest bucket, its largest lead there, its largest in the one before]
        self._nodes: dict[str, list[int]] = {}

    def observe(
        self,
        name_of: Callable[[int], str],
        codes: np.ndarray,
        ts_ms: np.ndarray,
        ref_ms: np.ndarray,
    ) -> None:
        """One batch: row ``i`` is a sample of node ``name_of(codes[i])`` stamped ``ts_ms[i]``
        by the node and seen at ``ref_ms[i]`` (int64 arrays). Rows whose reference time is not
        positive (none known) are ignored."""
        ok = ref_ms > 0
        if not ok.any():
            return
        codes, lead = codes[ok], ts_ms[ok] - ref_ms[ok]
        bucket = int(ref_ms[ok].max()) // self.bucket_ms
        if self._latest is None or bucket > self._latest:
            self._latest = bucket
            gone = bucket - self.memory_buckets
            self._nodes = {n: e for n, e in self._nodes.items() if e[0] >= gone}
        uniq, inverse = np.unique(codes, return_inverse=True)
        best = np.full(len(uniq), np.iinfo(np.int64).min, np.int64)
        np.maximum.at(best, inverse, lead)
        nodes = self._nodes
        for code, value in zip(uniq.tolist(), best.tolist(), strict=True):
            node = name_of(code)
            entry = nodes.get(node)
            if entry is None or entry[0] < bucket - 1:
                nodes[node] = [bucket, value, _NONE]
            elif entry[0] == bucket - 1:
                nodes[node] = [bucket, value, entry[1]]
            elif value > entry[1]:  # the same bucket (or an older one: a batch out of order)
                entry[1] = value

    def leads_ms(self) -> dict[str, int]:
        """Each remembered node's largest lead (``ts_ms - ref_ms``) over its last one to two
        buckets."""
        return {node: max(e[1], e[2]) for node, e in self._nodes.items()}

    def offsets_ms(self) -> dict[str, int]:
        """Each remembered node's clock offset from the fleet's median clock (ms; positive:
        the node's clock runs ahead). Empty with fewer than ``min_nodes`` nodes."""
        return relative_offsets(self.leads_ms(), self.min_nodes)


_NONE = -(1 << 62)


def relative_offsets(leads_ms: Mapping[str, int], min_nodes: int = MIN_NODES) -> dict[str, int]:
    """``leads_ms`` less their median (ms); empty with fewer than ``min_nodes`` nodes."""
    if len(leads_ms) < min_nodes:
        return {}
    mid = statistics.median(leads_ms.values())
    return {node: round(lead - mid) for node, lead in leads_ms.items()}
