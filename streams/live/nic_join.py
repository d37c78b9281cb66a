"""The hot stage's NIC samples joined with its GPU samples in event time, partition by partition.

A window's port summaries are made when the GPU samples close it (stage 2,
:class:`~peerwatch.streams.core.sample_stage.SampleStage`), from the NIC readings it holds then;
the in-process runner sees both streams in one event-ordered stream, so a live worker must hand
stage 2 the same NIC readings at each close. The NIC topic is co-partitioned with the samples
(same key, same count): NIC partition p holds the nodes of samples partition p, and each is held
to its own samples partition's time:

* before a batch, the NIC samples are read (:class:`~peerwatch.streams.live.nic_input.NicInput`)
  until each NIC partition of the batch's samples partitions reached the batch's time less half
  the lateness (the windows the batch may close end before), waiting a bounded time for a NIC
  consumer that fetches slower than the samples' (:meth:`NicJoin.before_batch`);
* the batch is stepped in the in-process runner's parts (the hot stage), each after its
  partition's NIC samples up to the part's newest time, read on first where the read before the
  batch stopped short of it (a NIC partition holds at most
  :data:`~peerwatch.streams.live.nic_input.HOLD_MOST` ahead; a backlog batch may span more)
  (:meth:`NicJoin.before_part`);
* without GPU samples at hand, the NIC samples go up to each samples partition's newest time,
  or all of them once that partition is quiet (:meth:`NicJoin.idle`): a node whose GPU samples
  stopped keeps its link rules on arrival.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from peerwatch.streams.core.windows import VALUE_LIMIT
from peerwatch.streams.live.hot_partitions import Partitions
from peerwatch.streams.live.nic_input import NicInput

#: A worker without samples partitions this long after its start reads the NIC samples alone
#: (s); a samples partition that received nothing this long after its assignment leaves its NIC
#: samples free.
NIC_ALONE_AFTER_S = 30.0
#: A samples partition caught up and without samples this long (s) leaves its NIC samples free.
NIC_QUIET_S = 1.0
#: The newest sample time of a partition that took none yet (ms): earlier than any; the bound
#: of a quiet partition's NIC samples: later than any.
NO_TIME_MS, FREE_MS = -(1 << 62), 1 << 62


def newest_time(tables: Any) -> int | None:
    """The newest sample time of decoded samples that stage 2 takes (ms; None: none): a time
    outside ``[0, VALUE_LIMIT)`` moves nothing."""
    ts = tables[""].values["ts_ms"]
    ts = ts[(ts >= 0) & (ts < VALUE_LIMIT)]
    return int(ts.max()) if ts.size else None


class NicJoin:
    """One worker's NIC input held to its samples partitions' times (module docstring).
    ``on_samples``: hands NIC samples to stage 2 (allocations synced, findings published)."""

    def __init__(
        self,
        nic: NicInput,
        parts: Partitions,
        on_samples: Callable[[list[Mapping[str, Any]]], None],
        counters: Any,
        lateness_ms: int,
        batch_max: int,
    ) -> None:
        self.nic = nic
        self.parts = parts
        self.on_samples = on_samples
        self.counters = counters
        self.batch_max = batch_max
        #: samples partition -> the newest GPU sample time taken (ms)
        self.newest_ms: dict[int, int] = {}
        self._slack_ms = lateness_ms // 2
        self._started_s = time.monotonic()

    def start(self) -> None:
        self._started_s = time.monotonic()
        self.nic.start()

    def forget(self, partition: int) -> None:
        """Samples partition ``partition`` is not this worker's any more."""
        self.newest_ms.pop(partition, None)

    def before_batch(self, decoded: Sequence[tuple[int, Any]]) -> None:
        """Before a batch of (samples partition, decoded samples): the NIC samples read up to
        each partition's time in it less the slack (waited for, bounded), handed on up to the
        times already taken."""
        reach: dict[int, int] = {}
        for p, tables in decoded:
            newest = newest_time(tables)
            if newest is not None:
                reach[p] = max(self.newest_ms.get(p, newest), newest) - self._slack_ms
        self._read(self.bounds(), reach)

    def before_part(self, p: int, tables: Any) -> None:
        """Before stage 2 takes a part of samples partition ``p``'s batch: its NIC samples up
        to the part's newest time, read on first where the batch's read stopped short of the
        part's time less the slack (a backlog batch spans more NIC samples than a partition
        holds, :data:`~.nic_input.HOLD_MOST`)."""
        newest = newest_time(tables)
        if newest is None:
            return
        self.newest_ms[p] = until = max(self.newest_ms.get(p, newest), newest)
        if self.nic.latest_read_ms(p) < until - self._slack_ms:
            self._read(self.bounds(), {p: until - self._slack_ms})
            return
        samples = self.nic.release(p, until)
        if samples:
            self.on_samples(samples)

    def idle(self) -> None:
        """No GPU samples at hand: the NIC samples up to each samples partition's time (all of
        a quiet one's); a worker that holds no samples partition :data:`NIC_ALONE_AFTER_S`
        after its start reads them all (more workers than partitions)."""
        if self.parts:
            self._read(self.bounds())
        elif time.monotonic() - self._started_s >= NIC_ALONE_AFTER_S:
            self._read(None)
        else:  # none assigned yet: wait for the samples
            self._read({})

    def bounds(self) -> dict[int, int]:
        """Each assigned samples partition's newest sample time taken (ms): its NIC partition
        goes no further (:func:`.nic_input.bound`). Unbounded once the samples partition is
        quiet (nothing to read, and no sample for :data:`NIC_QUIET_S`, or none since its
        assignment :data:`NIC_ALONE_AFTER_S` ago: its nodes' GPU samples stopped); not before
        its first sample (NIC readings that ran ahead of their windows would be dropped before
        those closed)."""
        free = self.parts.quiet(NIC_QUIET_S, NIC_ALONE_AFTER_S)
        return {p: FREE_MS if p in free else self.newest_ms.get(p, NO_TIME_MS)
                for p in self.parts}  # fmt: skip

    def _read(self, until_ms: dict[int, int] | None, reach_ms: dict[int, int] | None = None
              ) -> None:  # fmt: skip
        samples = self.nic.read(self.batch_max, until_ms, reach_ms)
        self.counters.nic_waits_given_up = self.nic.waits_given_up
        if samples:
            self.on_samples(samples)
        if samples and not self.parts:  # no samples partition: no samples commit to ride on
            self.nic.commit()
