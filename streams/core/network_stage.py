"""The network beside stage 2: one object both runners feed decoded NodeNicSamples.

The live hot stage (the ``peerwatch.nic.samples`` topic) and the offline pipeline (the
``nic-samples`` stream of the simulator and of an archive) call the same
:meth:`NetworkStage.add_nic` and treat what it returns as they treat the hard rules' findings:
out on the findings topic and through the drain policy. The rules themselves are
:class:`~peerwatch.streams.core.link_watch.LinkWatch`'s (declared as data in
:mod:`~peerwatch.streams.core.network_rules`); this object owns the composition, so a new network
input or rule is wired here once, never in a runner.

State is plain data (:meth:`snapshot` / :meth:`restore`); :meth:`prune` forgets ports silent for
longer than a horizon.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.link_watch import LinkWatch
from peerwatch.streams.core.settings import DetectorSettings, NetworkSettings


class NetworkStage:
    """NIC samples in, link findings out (``allocations`` is read only: who owns a node)."""

    def __init__(
        self,
        allocations: AllocationTable,
        network: NetworkSettings | None = None,
        detector: DetectorSettings | None = None,
    ) -> None:
        self.links = LinkWatch(allocations, network, detector)

    def add_nic(self, samples: Iterable[Mapping[str, Any]]) -> list[StragglerFinding]:
        """Decoded NodeNicSamples in arrival order; returns the findings they show, in order
        (each finding's ``detected_ms`` is the time of the sample that shows it: the event time
        a runner publishes it at). Raises nothing on bad input (counted, see :meth:`counters`)."""
        out: list[StragglerFinding] = []
        for sample in samples:
            out += self.links.add(sample)
        return out

    def prune(self, before_ms: int) -> int:
        """Forget ports whose last reading is older than ``before_ms`` (ms); returns how many."""
        return self.links.prune(before_ms)

    def snapshot(self) -> dict[str, Any]:
        """The state as plain JSON types (:meth:`restore` takes it back)."""
        return {"links": self.links.snapshot()}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the state with a :meth:`snapshot`. Raises KeyError/TypeError/ValueError on a
        malformed snapshot (the runner's own store, not hostile input)."""
        self.links.restore(data["links"])

    def counters(self) -> dict[str, int]:
        """NIC samples looked at, bad input skipped, findings (LinkWatch's counters)."""
        return self.links.counters()
