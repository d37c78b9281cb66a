"""The network beside stage 2: one object both runners feed decoded NodeNicSamples.

The live hot stage (the ``peerwatch.nic.samples`` topic) and the offline pipeline (the
``nic-samples`` stream of the simulator and of an archive) call the same
:meth:`NetworkStage.add_nic` and treat what it returns as they treat the hard rules' findings:
out on the findings topic and through the drain policy. The rules themselves are
:class:`~peerwatch.streams.core.link_watch.LinkWatch`'s (declared as data in
:mod:`~peerwatch.streams.core.network_rules`); this object owns the composition, so a new network
input or rule is wired here once, never in a runner.

At each closed window of a job, stage 3 calls :meth:`NetworkStage.job_window` with the job's
nodes and whether the GPU detector's verdict is the job-wide abstain: each node's ports are
summarised over the window (:func:`~peerwatch.producers.nic.window.port_window`, from the
readings kept since ``add_nic``) and compared across the job's nodes by
:class:`~peerwatch.streams.core.network_peers.NetworkPeers` (a node whose link stands out in a
job-wide slowdown is named, cause ``NETWORK``). Readings are kept per node for
``readings_ms`` behind the node's newest one (enough for a window still to be released).

State is plain data (:meth:`snapshot` / :meth:`restore`); :meth:`prune` forgets ports silent for
longer than a horizon.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from peerwatch.producers.nic.window import PortWindow, port_window
from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.link_watch import LinkWatch
from peerwatch.streams.core.network_peers import NetworkPeers
from peerwatch.streams.core.settings import DetectorSettings, NetworkSettings


class NetworkStage:
    """NIC samples in, link findings out (``allocations`` is read only: who owns a node)."""

    def __init__(
        self,
        allocations: AllocationTable,
        network: NetworkSettings | None = None,
        detector: DetectorSettings | None = None,
        readings_ms: int = 120_000,
    ) -> None:
        """``readings_ms``: how long (ms of event time, behind each node's newest reading) the
        per-port readings stay for :meth:`job_window` (at least a window, its lateness and the
        job grace; 0: none kept, :meth:`job_window` compares nothing)."""
        self.links = LinkWatch(allocations, network, detector)
        self.peers = NetworkPeers(network, detector)
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
                ports[name] = [r for r in series if r[0] >= horizon]

    def port_windows(self, node: str, start_ms: int, end_ms: int) -> list[PortWindow]:
        """The node's ports summarised over ``[start_ms, end_ms)`` (readings up to two
        sampling intervals before the start set the initial link state)."""
        gap = 2 * self.interval_ms.get(node, 1000)
        return [
            port_window(name, [r for r in series if r[0] >= start_ms - gap], start_ms, end_ms, gap)
            for name, series in sorted(self.readings.get(node, {}).items())
        ]

    def job_window(
        self, job_id: str, start_ms: int, end_ms: int, nodes: Iterable[str], job_wide: bool
    ) -> list[StragglerFinding]:
        """One closed window of one job (in window order; a window released again changes
        nothing): its nodes' ports compared; returns the NETWORK findings (CONFIRMED, naming
        node and port, no GPU). ``job_wide``: the GPU detector's verdict for the job is the
        job-wide abstain after this window."""
        windows = {n: self.port_windows(n, start_ms, end_ms) for n in sorted(set(nodes))}
        having = {n: w for n, w in windows.items() if w}
        if not having:  # no NIC samples from the job's nodes: nothing to compare
            return []
        return self.peers.window(job_id, start_ms, end_ms, having, job_wide)

    def prune(self, before_ms: int) -> int:
        """Forget ports whose last reading is older than ``before_ms`` (ms), and jobs whose last
        window started before it; returns how many ports."""
        self.peers.prune(before_ms)
        for node in [n for n, ports in self.readings.items()
                     if max(s[-1][0] for s in ports.values()) < before_ms]:  # fmt: skip
            del self.readings[node]
            self.interval_ms.pop(node, None)
        return self.links.prune(before_ms)

    def snapshot(self) -> dict[str, Any]:
        """The state as plain JSON types (:meth:`restore` takes it back)."""
        return {
            "links": self.links.snapshot(),
            "peers": self.peers.snapshot(),
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
        self.peers.restore(data["peers"])
        self.readings = {
            str(n): {str(p): [(int(t), r) for t, r in s] for p, s in ports.items()}
            for n, ports in data["readings"].items()
        }
        self.interval_ms = {str(n): int(v) for n, v in data["interval_ms"].items()}

    def counters(self) -> dict[str, int]:
        """NIC samples looked at, bad input skipped, link findings (LinkWatch's counters) and
        the job network comparison's findings."""
        return {**self.links.counters(), "network_peer_findings": self.peers.findings}
