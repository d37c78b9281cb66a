"""Several nodes under one leaf switch with the same network symptom: one finding naming the switch.

Congestion or a failing leaf switch shows on every node below it, in whatever job each runs.
:class:`SwitchWatch` takes the network symptoms of nodes (a link rule that fired, a peer feature
that flagged a port: :meth:`SwitchWatch.add_finding` reads them from the NETWORK findings of
:class:`~peerwatch.streams.core.link_watch.LinkWatch` and
:class:`~peerwatch.streams.core.network_peers.NetworkPeers`; :meth:`SwitchWatch.window` finds
them by comparing every node's ports across the fleet) and, when ``network.switch_min_nodes``
distinct nodes under one leaf switch (:class:`~peerwatch.streams.core.topology.Topology`) show
the same symptom within ``network.switch_window_s``, across jobs, publishes one finding naming
the switch: status ``FLEET_WIDE`` (no node: the policy recommends nothing, the alert exporter
alerts), cause ``NETWORK``, ``switch`` set, job ``fleet``. Alert only, never a drain of each node;
:meth:`SwitchWatch.explains` tells a caller whether a node's symptom belongs to such a switch
episode. A switch fires again for a symptom only after ``network.repeat_after_s`` without it.

Pure; state is plain data (:meth:`snapshot` / :meth:`restore`); times are the symptoms' own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from peerwatch.producers.nic.window import PortWindow
from peerwatch.schemas.records import FeatureEvidence, StragglerFinding
from peerwatch.streams.core.fleet import FLEET_JOB
from peerwatch.streams.core.model import FLEET_WIDE, stable_id
from peerwatch.streams.core.network_peers import compare_ports
from peerwatch.streams.core.settings import DetectorSettings, NetworkSettings
from peerwatch.streams.core.topology import Topology

_FAR_PAST = -(1 << 62)
#: The peer features that count as a switch symptom across the fleet: the bad ones a switch
#: causes on every port below it (waiting, congestion notifications, errors, retransmits).
#: Throughput is left out: jobs differ in traffic, so an idle or lighter job's nodes would
#: stand out against the fleet with nothing wrong.
SWITCH_FEATURES = frozenset({"net_wait", "net_cnp", "net_errors", "net_retrans"})


def symptoms_of(finding: Mapping[str, Any]) -> list[str]:
    """The network symptoms a finding shows: its link rules and flagged peer features (none for
    a finding of another cause, or one naming no node)."""
    if finding.get("cause") != "NETWORK" or not finding.get("node"):
        return []
    rules = [str(r) for r in finding.get("hard_rules") or ()]
    feats = [str(f.get("feature")) for f in finding.get("features") or () if f.get("feature")]
    return sorted(set(rules + feats))


class SwitchWatch:
    """Leaf-switch grouping of network symptoms, across jobs."""

    def __init__(
        self,
        topology: Topology,
        settings: NetworkSettings | None = None,
        detector: DetectorSettings | None = None,
    ) -> None:
        self.topology = topology
        self.settings = settings or NetworkSettings()
        self.detector = detector or DetectorSettings()
        #: (switch, symptom) -> node -> (ts_ms, job_id, port) of its latest symptom
        self.seen: dict[tuple[str, str], dict[str, tuple[int, str | None, str | None]]] = {}
        #: switch -> ms of the latest symptom while its episode is open (it fired)
        self.fired: dict[str, int] = {}
        self.unplaced = 0
        self.findings = 0

    def set_topology(self, topology: Topology) -> None:
        """A re-read layout; the memory of switches that no longer exist is kept until pruned."""
        self.topology = topology

    def observe(
        self,
        node: str,
        symptom: str,
        ts_ms: int,
        job_id: str | None = None,
        port: str | None = None,
    ) -> list[StragglerFinding]:
        """One symptom of one node; returns the switch finding it completes (or [])."""
        switch = self._record(node, symptom, ts_ms, job_id, port)
        return [] if switch is None else self._check(switch, symptom, ts_ms)

    def _record(
        self, node: str, symptom: str, ts_ms: int, job_id: str | None, port: str | None
    ) -> str | None:
        """Remember one symptom; returns the node's leaf switch (None: unplaced, counted)."""
        switch = self.topology.leaf(node)
        if switch is None:
            self.unplaced += 1
            return None
        nodes = self.seen.setdefault((switch, symptom), {})
        last = nodes.get(node)
        if last is None or ts_ms >= last[0]:
            nodes[node] = (ts_ms, job_id, port)
        return switch

    def _check(self, switch: str, symptom: str, ts_ms: int) -> list[StragglerFinding]:
        """The switch finding when enough of its nodes showed ``symptom`` lately (or [])."""
        key = (switch, symptom)
        window_ms = self.settings.switch_window_s * 1000
        recent = {n: v for n, v in self.seen[key].items() if ts_ms - v[0] <= window_ms}
        self.seen[key] = {n: v for n, v in self.seen[key].items() if ts_ms - v[0] <= window_ms}
        fired = self.fired.get(switch, _FAR_PAST)
        if ts_ms - fired <= self.settings.repeat_after_s * 1000:
            if recent:
                self.fired[switch] = max(fired, ts_ms)  # the episode goes on: one finding
            return []
        if len(recent) < self.settings.switch_min_nodes:
            return []
        self.fired[switch] = ts_ms
        self.findings += 1
        return [self._finding(switch, symptom, ts_ms, recent)]

    def window(
        self,
        end_ms: int,
        nodes: Mapping[str, Sequence[PortWindow]],
        jobs: Mapping[str, str | None],
    ) -> list[StragglerFinding]:
        """One window of every reporting node's ports (``nodes``; ``jobs``: node -> its job or
        None) compared across the fleet (:func:`~peerwatch.streams.core.network_peers.compare_ports`,
        the same port on every node; only :data:`SWITCH_FEATURES`): a flagged node is a symptom
        of its leaf switch (observed at
        ``end_ms``) unless its whole job stands out with it (every reporting node of the job
        flagged: the job's own traffic, such as an all-to-all phase, not the switch). Congestion
        that covers half of a job, which the job's own comparison cannot see, shows here."""
        verdicts = compare_ports(nodes, self.settings)
        flags: dict[str, list[tuple[str, str]]] = {}
        for v in verdicts:
            for feature in v.flags:
                if feature in SWITCH_FEATURES:
                    flags.setdefault(v.node, []).append((feature, v.port))
        members: dict[str, set[str]] = {}
        for node, job in jobs.items():
            if job is not None and node in nodes:
                members.setdefault(job, set()).add(node)
        touched: set[tuple[str, str]] = set()
        for node in sorted(flags):
            job = jobs.get(node)
            if job is not None and all(n in flags for n in members.get(job, ())):
                continue  # the whole job stands out: its own traffic
            for feature, port in sorted(set(flags[node])):
                switch = self._record(node, feature, end_ms, job, port)
                if switch is not None:
                    touched.add((switch, feature))
        out: list[StragglerFinding] = []
        for switch, feature in sorted(touched):  # every node of the window first, then judged
            out += self._check(switch, feature, end_ms)
        return out

    def add_finding(self, finding: Mapping[str, Any]) -> list[StragglerFinding]:
        """The symptoms of one NETWORK finding (LinkWatch, NetworkPeers); returns the switch
        findings they complete."""
        node, ts = finding.get("node"), finding.get("detected_ms")
        if not isinstance(node, str) or not isinstance(ts, int):
            return []
        out: list[StragglerFinding] = []
        for symptom in symptoms_of(finding):
            out += self.observe(node, symptom, ts, finding.get("job_id"), finding.get("port"))
        return out

    def explains(self, node: str, ts_ms: int) -> str | None:
        """The leaf switch of ``node`` when a switch episode including it is open at ``ts_ms``
        (its symptom is the switch's), else None."""
        switch = self.topology.leaf(node)
        if switch is None:
            return None
        window_ms = self.settings.switch_window_s * 1000
        for (sw, _), nodes in self.seen.items():
            if sw != switch or node not in nodes:
                continue
            fired = self.fired.get(sw, _FAR_PAST)
            if ts_ms - fired <= window_ms and abs(ts_ms - nodes[node][0]) <= window_ms:
                return switch
        return None

    def _finding(
        self,
        switch: str,
        symptom: str,
        ts_ms: int,
        recent: Mapping[str, tuple[int, str | None, str | None]],
    ) -> StragglerFinding:
        window_ms = self.detector.window_ms
        start = ts_ms - ts_ms % window_ms
        first = min(v[0] for v in recent.values())
        jobs = sorted({v[1] for v in recent.values() if v[1]})
        under = len(self.topology.nodes_under(switch))
        names = sorted(recent)
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        evidence: list[FeatureEvidence] = []
        return {
            "finding_id": stable_id(
                FLEET_JOB, switch, symptom, FLEET_WIDE, ts_ms, hex_chars=self.detector.id_hex_chars
            ),
            "job_id": FLEET_JOB,
            "node": None,
            "gpu_index": None,
            "gpu_uuid": None,
            "status": FLEET_WIDE,
            "window_start_ms": start,
            "window_end_ms": start + window_ms,
            "features": evidence,
            "hard_rules": [symptom],
            "windows_flagged": len(recent),
            "windows_considered": under,
            "first_flagged_ms": first,
            "peer_group_size": under,
            "reason": (
                f"switch {switch}: {len(recent)} of {under} nodes show {symptom} "
                f"({shown}; jobs {', '.join(jobs[:5]) or 'none'}); no node blamed"
            ),
            "cause": "NETWORK",
            "detected_ms": ts_ms,
            "port": None,
            "switch": switch,
        }

    def prune(self, before_ms: int) -> int:
        """Forget symptoms older than ``before_ms``; returns how many."""
        dropped = 0
        for key in list(self.seen):
            nodes = self.seen[key]
            keep = {n: v for n, v in nodes.items() if v[0] >= before_ms}
            dropped += len(nodes) - len(keep)
            if keep:
                self.seen[key] = keep
            else:
                del self.seen[key]
        self.fired = {
            k: v
            for k, v in self.fired.items()
            if v >= before_ms - self.settings.repeat_after_s * 1000
        }
        return dropped

    def snapshot(self) -> dict[str, Any]:
        """Plain JSON data (:meth:`restore` takes it back)."""
        return {
            "seen": [[s, y, {n: list(v) for n, v in nodes.items()}]
                     for (s, y), nodes in sorted(self.seen.items())],
            "fired": [[s, t] for s, t in sorted(self.fired.items())],
        }  # fmt: skip

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the memory with a :meth:`snapshot` (the caller's own store)."""
        self.seen = {
            (str(s), str(y)): {str(n): (int(v[0]), v[1], v[2]) for n, v in nodes.items()}
            for s, y, nodes in data["seen"]
        }
        self.fired = {str(s): int(t) for s, t in data["fired"]}
