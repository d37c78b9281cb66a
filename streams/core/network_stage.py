"""The network beside stage 2: one object both runners feed decoded NodeNicSamples.

The live hot stage (the ``peerwatch.nic.samples`` topic) and the offline pipeline (the
``nic-samples`` stream of the simulator and of an archive) call the same
:meth:`NetworkStage.add_nic` and treat what it returns as they treat the hard rules' findings:
out on the findings topic and through the drain policy. The rules themselves are
:class:`~peerwatch.streams.core.link_watch.LinkWatch`'s (declared as data in
:mod:`~peerwatch.streams.core.network_rules`); this object owns the composition, so a new network
input or rule is wired here once, never in a runner.

At the window starts stage 2 closes, :meth:`NetworkStage.closed` summarises each job's nodes'
ports over the window (:func:`~peerwatch.producers.nic.window.port_window` of the counters the
network features read, :data:`~peerwatch.producers.nic.spans.FEATURE_COUNTERS`, from the readings kept
since ``add_nic``, for ``readings_ms`` behind each node's newest one) into
:class:`~peerwatch.streams.core.network_jobs.JobPorts`, which travel to stage 3 with the job's
windows (there :class:`~peerwatch.streams.core.network_jobs.JobNetwork` compares them at the
window's release), and runs the leaf-switch grouping
(:class:`~peerwatch.streams.core.switch_watch.SwitchWatch`) here, where every node's ports of
every job are at hand: several nodes under one leaf with the same symptom, across jobs, make one
finding naming the switch (alert only), and their nodes are marked in the JobPorts so stage 3
names none of them.

State is plain data (:meth:`snapshot` / :meth:`restore`); :meth:`prune` forgets ports silent for
longer than a horizon.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from peerwatch.producers.nic.spans import FEATURE_COUNTERS
from peerwatch.producers.nic.window import PortWindow, port_window
from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.link_watch import LinkWatch
from peerwatch.streams.core.model import is_idle_job
from peerwatch.streams.core.network_jobs import JobPorts, nodes_by_job
from peerwatch.streams.core.settings import DetectorSettings, NetworkSettings, StageSettings
from peerwatch.streams.core.switch_watch import SwitchWatch
from peerwatch.streams.core.topology import Topology
from peerwatch.streams.core.windows import ClosedWindows

#: a kept reading's time (the key the readings are sorted by)
_ts = itemgetter(0)


def readings_ms(settings: StageSettings) -> int:
    """How long (ms) stage 2 keeps each node's NIC readings behind its newest one: two windows,
    the lateness and the job grace (a window is summarised when it closes, after its lateness;
    the grace covers a node's readings arriving late in a slow batch)."""
    stream = settings.stream
    return 2 * settings.detector.window_ms + int((stream.lateness_s + stream.job_grace_s) * 1000)


class NetworkStage:
    """NIC samples in, link findings out (``allocations`` is read only: who owns a node)."""

    def __init__(
        self,
        allocations: AllocationTable,
        network: NetworkSettings | None = None,
        detector: DetectorSettings | None = None,
        readings_ms: int = 120_000,
        topology: Topology | None = None,
    ) -> None:
        """``readings_ms``: how long (ms of event time, behind each node's newest reading) the
        per-port readings stay for :meth:`closed` (at least two windows and the lateness; 0:
        none kept, :meth:`closed` summarises nothing). ``topology``: the leaf switches (None:
        none known, no switch finding)."""
        self.links = LinkWatch(allocations, network, detector)
        self.switches = SwitchWatch(topology or Topology(), network, detector)
        #: the latest window start the switch watch judged
        self.switch_judged_ms = -(1 << 62)
        self.readings_ms = readings_ms
        #: node -> port -> [(ts_ms, NicPortReading)] in time order; node -> sampling interval ms
        self.readings: dict[str, dict[str, list[tuple[int, Mapping[str, Any]]]]] = {}
        self.interval_ms: dict[str, int] = {}

    def add_nic(self, samples: Iterable[Mapping[str, Any]]) -> list[StragglerFinding]:
        """Decoded NodeNicSamples in arrival order; returns the findings they show, in order
        (each finding's ``detected_ms`` is the time of the sample that shows it: the event time
        a runner publishes it at). Raises nothing on bad input (counted, see :meth:`counters`)."""
        out: list[StragglerFinding] = []
        for sample in samples:
            seen = self.links.invalid_samples
            out += self.links.add(sample)
            # LinkWatch checked node, time and ports; readings_ms 0: a runner that does not
            # compare jobs here keeps none
            if self.links.invalid_samples == seen and self.readings_ms > 0:
                self._keep(sample)
        return out

    def _keep(self, sample: Mapping[str, Any]) -> None:
        """Keep a valid sample's port readings for the window summaries (late ones dropped:
        a port's readings stay in time order)."""
        node, ts = str(sample["node"]), int(sample["ts_ms"])
        interval = sample.get("interval_ms")
        if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0:
            self.interval_ms[node] = interval
        ports = self.readings.setdefault(node, {})
        for reading in sample["ports"]:
            name = reading.get("name") if isinstance(reading, Mapping) else None
            if not isinstance(name, str) or not name:
                continue
            series = ports.setdefault(name, [])
            if series and series[-1][0] >= ts:
                continue
            series.append((ts, reading))
            horizon = ts - self.readings_ms
            if series[0][0] < horizon:
                # in time order: the old ones lead (in place, not a new list per reading)
                del series[: bisect_left(series, horizon, key=_ts)]

    def port_windows(self, node: str, start_ms: int, end_ms: int) -> list[PortWindow]:
        """The node's ports summarised over ``[start_ms, end_ms)`` (readings up to two
        sampling intervals before the start set the initial link state)."""
        gap = 2 * self.interval_ms.get(node, 1000)
        out = []
        for name, series in sorted(self.readings.get(node, {}).items()):
            # the series is in time order; only the counters the network features read
            recent = series[bisect_left(series, start_ms - gap, key=_ts) :]
            out.append(port_window(name, recent, start_ms, end_ms, gap, FEATURE_COUNTERS))
        return out

    def closed(
        self, closed: Sequence[ClosedWindows]
    ) -> tuple[list[JobPorts], list[StragglerFinding]]:
        """The window starts stage 2 just closed (the aggregator's ``pop_ready``): per (job,
        window), the ports of its nodes in ``closed`` summarised over the window (nodes with NIC
        readings; idle GPUs' pseudo-jobs left out; a job spread over several samples partitions
        gets one per partition, stage 3 merges them), each node a switch episode explains
        marked; and the leaf-switch findings (:class:`SwitchWatch` over every node this stage
        holds readings of, across jobs, at the first close of each window start). Returns
        (ports in (start, job) order, switch findings)."""
        ports: list[JobPorts] = []
        found: list[StragglerFinding] = []
        if not self.readings:
            return ports, found
        for part in closed:
            start, end = part.start_ms, part.end_ms
            windows: dict[str, list[PortWindow]] = {}
            if start > self.switch_judged_ms:
                self.switch_judged_ms = start
                windows = {n: self.port_windows(n, start, end) for n in sorted(self.readings)}
                owners = {n: self._owner(n, start) for n in windows}
                found += self.switches.window(end, windows, owners)
            for job_id, nodes in nodes_by_job(part).items():
                if is_idle_job(job_id):
                    continue
                have = {
                    n: tuple(ws)
                    for n in nodes
                    if n in self.readings
                    and (ws := windows[n] if n in windows else self.port_windows(n, start, end))
                }
                if not have:
                    continue
                switched = {
                    n: sw for n in have if (sw := self.switches.explains(n, end)) is not None
                }
                ports.append(JobPorts(job_id, start, end, have, switched))
        return ports, found

    def _owner(self, node: str, ts_ms: int) -> str | None:
        """The job owning a GPU of ``node`` at ``ts_ms`` (the smallest id when several do; None:
        idle)."""
        owners = self.links.allocations.segment(node, ts_ms)[0]
        return min(owners.values()) if owners else None

    def prune(self, before_ms: int) -> int:
        """Forget ports whose last reading is older than ``before_ms`` (ms), and switch symptoms
        older than it; returns how many ports."""
        self.switches.prune(before_ms)
        for node in [n for n, ports in self.readings.items()
                     if max(s[-1][0] for s in ports.values()) < before_ms]:  # fmt: skip
            del self.readings[node]
            self.interval_ms.pop(node, None)
        return self.links.prune(before_ms)

    def snapshot(self) -> dict[str, Any]:
        """The state as plain JSON types (:meth:`restore` takes it back)."""
        return {
            "links": self.links.snapshot(),
            "switches": self.switches.snapshot(),
            "switch_judged_ms": self.switch_judged_ms,
            "readings": {
                n: {p: [[t, dict(r)] for t, r in s] for p, s in ports.items()}
                for n, ports in sorted(self.readings.items())
            },
            "interval_ms": dict(sorted(self.interval_ms.items())),
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the state with a :meth:`snapshot`. Raises KeyError/TypeError/ValueError on a
        malformed snapshot (the runner's own store, not hostile input)."""
        self.links.restore(data["links"])
        self.switches.restore(data["switches"])
        self.switch_judged_ms = int(data["switch_judged_ms"])
        self.readings = {
            str(n): {str(p): [(int(t), r) for t, r in s] for p, s in ports.items()}
            for n, ports in data["readings"].items()
        }
        self.interval_ms = {str(n): int(v) for n, v in data["interval_ms"].items()}

    def counters(self) -> dict[str, int]:
        """NIC samples looked at, bad input skipped, link findings (LinkWatch's counters), the
        switch findings and the symptoms of nodes the topology does not place."""
        return {
            **self.links.counters(),
            "switch_findings": self.switches.findings,
            "switch_unplaced": self.switches.unplaced,
        }
