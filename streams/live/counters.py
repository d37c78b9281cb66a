"""What a stream worker did, as counters a benchmark or a test reads back (``--counters-file``).

Written by both the faust event loop (stages 3, 4) and the hot stage; every field but
``deadletter`` has one writer, and that one is counted under a lock. When the hot stage runs in
a process of its own (:mod:`~peerwatch.streams.live.hot_process`), it counts into its own
``StreamCounters`` and sends :meth:`StreamCounters.hot_update` to the worker a few times a
second, which :meth:`StreamCounters.merge_hot` applies: the worker's file and its telemetry show
one set of counters either way.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from peerwatch.files import write_atomic

_COUNT_LOCK = threading.Lock()

#: The counters the hot stage writes (the rest are stage 3's and 4's); ``deadletter`` and
#: ``batch_log`` are sent apart (both stages dead-letter; the log goes as its new entries).
HOT_FIELDS = (
    "samples", "gpu_samples", "batches", "late", "batch_time_s", "last_batch_s",
    "consumer_lag", "unattributed", "hard_findings", "silence_findings",
    "outputs_refused", "outputs_failed", "clock_offsets_ms", "clock_skewed_nodes",
    "first_batch_wall_s", "first_batch_cpu_s", "last_batch_wall_s", "last_batch_cpu_s",
    "nic_waits_given_up",
)  # fmt: skip
#: Hot batches kept in ``batch_log``.
BATCH_LOG_MAX = 20_000


@dataclass
class StreamCounters:
    """What the worker did; ``samples`` are node records, ``gpu_samples`` GPU readings in them.

    The ``*_wall_s`` / ``*_cpu_s`` pairs are wall time (``time.time()``) and this process's CPU
    time (``time.process_time()``) when the hot stage finished its first and its latest batch
    of samples, so a benchmark can take rates over exactly the processing interval.
    ``finding_latency_ms`` holds, per finding, the wall time from the hot stage closing the
    finding's window (the last samples partition to close it) to the broker acknowledging the
    StragglerFinding record (the most recent 10,000).
    """

    samples: int = 0
    gpu_samples: int = 0
    batches: int = 0
    windows: int = 0
    findings: int = 0
    recommendations: int = 0
    late: int = 0
    deadletter: int = 0
    #: Stage 3's pending-table entries found damaged at a restore: dropped, the rest kept.
    pending_damaged: int = 0
    #: Stage 3's and 4's job and node states found damaged (not JSON, or not a state): dropped,
    #: that job or node starts afresh (streams.live.json_table, handlers).
    state_damaged: int = 0
    #: How long faust's table recovery has gone without reading a changelog record (s; 0 when
    #: not recovering): streams.live.recovery_watchdog ends the worker past a bound.
    recovery_stalled_s: float = 0.0
    #: StepTime records taken by stage 3.
    step_times: int = 0
    #: Wall time spent in hot batches, s; and the latest batch's.
    batch_time_s: float = 0.0
    last_batch_s: float | None = None
    #: Samples not yet consumed on the hot stage's partitions (None until first measured).
    consumer_lag: int | None = None
    #: GPU readings no job owned at their time (no allocation known): counted, not windowed.
    unattributed: int = 0
    #: Findings of the hot stage: hard rules on arrival, silence (SILENT, FLEET_WIDE, their
    #: CLEARED); and stage 3's fleet context (a fleet-wide power cap, FLEET_WIDE and CLEARED,
    #: counted on channel 0, the one that publishes them).
    hard_findings: int = 0
    silence_findings: int = 0
    fleet_findings: int = 0
    #: Hot-stage outputs the broker refused for good (dead-lettered) or failed to deliver.
    outputs_refused: int = 0
    outputs_failed: int = 0
    #: Each node's clock offset from the fleet's median clock, ms (sample times against receive
    #: times; see streams.core.clock_offset), refreshed once a second; nodes past the warning
    #: threshold.
    clock_offsets_ms: dict[str, int] = field(default_factory=dict)
    clock_skewed_nodes: int = 0
    first_batch_wall_s: float | None = None
    first_batch_cpu_s: float | None = None
    last_batch_wall_s: float | None = None
    last_batch_cpu_s: float | None = None
    finding_latency_ms: list[float] = field(default_factory=list)
    #: The latest 20,000 hot batches: [start wall s, end wall s, start CPU s, end CPU s,
    #: node records, GPU readings], so a benchmark can take any interval of them.
    batch_log: list[list[float]] = field(default_factory=list)
    #: Stage 3: when it last took a window batch (wall s), so a benchmark can tell when the
    #: worker, not only its hot stage, was done with its input.
    last_window_batch_wall_s: float | None = None
    #: Dead letters of a hot stage running in its own process (see merge_hot).
    hot_deadletter: int = 0
    #: Times the hot stage went on without the NIC samples of a batch's time (the NIC input
    #: did not reach it within nic_input.MOST_WAIT_S): windows may then lack ports.
    nic_waits_given_up: int = 0

    def batch_done(
        self, node_records: int, gpu_readings: int, start_wall_s: float, start_cpu_s: float
    ) -> None:
        """Count one hot-path batch that began at ``start_*`` and stamp its end."""
        now_wall, now_cpu = time.time(), time.process_time()
        if self.first_batch_wall_s is None:
            self.first_batch_wall_s, self.first_batch_cpu_s = now_wall, now_cpu
        self.last_batch_wall_s, self.last_batch_cpu_s = now_wall, now_cpu
        self.last_batch_s = max(now_wall - start_wall_s, 0.0)
        self.batch_time_s += self.last_batch_s
        self.samples += node_records
        self.gpu_samples += gpu_readings
        with _COUNT_LOCK:  # the log and its count together (hot_update reads both)
            self.batch_log.append(
                [start_wall_s, now_wall, start_cpu_s, now_cpu, node_records, gpu_readings]
            )
            if len(self.batch_log) > BATCH_LOG_MAX:
                del self.batch_log[:1000]
            self.batches += 1

    def latency(self, ms: float) -> None:
        self.finding_latency_ms.append(ms)
        if len(self.finding_latency_ms) > 10_000:
            del self.finding_latency_ms[:1000]

    def count_deadletter(self) -> None:
        """One more record sent to the dead-letter topic (from any thread)."""
        with _COUNT_LOCK:
            self.deadletter += 1

    def hot_update(self, batches_sent: int) -> dict[str, Any]:
        """What a hot process sends its worker: the hot fields, its dead letters and the batch
        log entries after the first ``batches_sent`` batches."""
        with _COUNT_LOCK:
            out = {name: getattr(self, name) for name in HOT_FIELDS}
            new = min(self.batches - batches_sent, len(self.batch_log))
            out["batch_log_new"] = [list(b) for b in self.batch_log[len(self.batch_log) - new :]]
            out["deadletter"] = self.deadletter
        out["clock_offsets_ms"] = dict(self.clock_offsets_ms)
        return out

    def merge_hot(self, update: dict[str, Any]) -> None:
        """Apply a hot process's :meth:`hot_update` (on the worker's side)."""
        for name in HOT_FIELDS:
            setattr(self, name, update[name])
        self.hot_deadletter = int(update["deadletter"])
        self.batch_log.extend(update["batch_log_new"])
        if len(self.batch_log) > BATCH_LOG_MAX:
            del self.batch_log[: len(self.batch_log) - BATCH_LOG_MAX]

    def snapshot(self) -> dict[str, Any]:
        """The counters as plain data (lists copied: the hot thread keeps appending)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["deadletter"] = self.deadletter + self.hot_deadletter
        out["finding_latency_ms"] = list(self.finding_latency_ms)
        out["batch_log"] = list(self.batch_log)
        out["clock_offsets_ms"] = dict(self.clock_offsets_ms)
        return out

    def scalars(self) -> dict[str, Any]:
        """The counters without the lists (what peerwatch's own telemetry exports)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)
               if f.name not in ("finding_latency_ms", "batch_log")}  # fmt: skip
        out["deadletter"] = self.deadletter + self.hot_deadletter
        out["clock_offsets_ms"] = dict(self.clock_offsets_ms)
        return out

    def write(self, path: str) -> None:
        """Replace ``path`` with the counters as JSON (atomically: readers never see half)."""
        body = json.dumps({**self.snapshot(), "pid": os.getpid()}).encode()
        write_atomic(Path(path), body, durable=False)
