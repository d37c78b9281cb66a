"""The network of each job from stage 2 to stage 3: one record per (job, window) and the stage-3
side that compares it at the job window's release (DETECTION.md "Network"; one dataflow).

Stage 2 (:class:`~peerwatch.streams.core.network_stage.NetworkStage`, which keeps each node's
NIC readings) summarises, for the window starts it just closed, each job's nodes' ports over the
window: a :class:`JobPorts`, which travels to stage 3 with the job's windows (offline in
process; live as a JSON message of kind ``network`` on ``<app>-window-batches`` keyed by job,
sent before the job's window batches of that window: :func:`job_ports_json` /
:func:`job_ports_of_json`, which checks every field as hostile input). Stage 3's
:class:`JobNetwork` holds them per (job, window) and, when the detector released that window,
opens the gate (:mod:`~peerwatch.streams.core.network_gate`: the job slowed against its own
recent past, or the GPU verdict is job-wide) and runs
:class:`~peerwatch.streams.core.network_peers.NetworkPeers` over them. Nodes whose symptom an
open leaf-switch episode explains (``switched``, from stage 2's
:class:`~peerwatch.streams.core.switch_watch.SwitchWatch`) are compared but never named: the
switch finding names the cause.

Pure; state is plain data (:meth:`JobNetwork.snapshot` / :meth:`JobNetwork.restore`, per job).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from peerwatch.producers.nic.window import PortWindow, port_window_json, port_window_of_json
from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.network_gate import JobPace
from peerwatch.streams.core.network_peers import NetworkPeers
from peerwatch.streams.core.settings import DetectorSettings, NetworkSettings
from peerwatch.streams.core.windows import ClosedWindows

#: The ``kind`` of the stage 2 -> 3 message on the window-batches topic.
NETWORK_KIND = "network"
#: Most nodes and ports per node one message may carry (hostile beyond: a job of 100,000 GPUs
#: is 12,500 nodes; a node has at most a few dozen ports).
MAX_NODES = 100_000
MAX_PORTS = 64
#: What a node or switch name may be in a message (Slurm's node names; hostile beyond).
MAX_NAME = 128
#: A job's window goes to stage 3 in messages of at most about this size (whole nodes each),
#: as its window batches do: well under Kafka's default 1 MB record limit. A node of 8 ports is
#: about 6 kB, so a message holds some 80 nodes.
MAX_MESSAGE_BYTES = 512 * 1024


@dataclass(frozen=True)
class JobPorts:
    """One job's window ``[start_ms, end_ms)`` as one stage-2 source saw it: each node's port
    windows, and ``switched``: node -> the leaf switch whose open episode explains its symptom."""

    job_id: str
    start_ms: int
    end_ms: int
    nodes: Mapping[str, tuple[PortWindow, ...]]
    switched: Mapping[str, str] = field(default_factory=dict)


def job_ports_json(jp: JobPorts) -> dict[str, Any]:
    """The message form (plain JSON types, ``kind`` :data:`NETWORK_KIND`)."""
    return {
        "kind": NETWORK_KIND,
        "job_id": jp.job_id,
        "start": jp.start_ms,
        "end": jp.end_ms,
        "nodes": {n: [port_window_json(p) for p in ports] for n, ports in sorted(jp.nodes.items())},
        "switched": dict(sorted(jp.switched.items())),
    }


def job_ports_messages(jp: JobPorts, max_bytes: int = MAX_MESSAGE_BYTES) -> list[bytes]:
    """:func:`job_ports_json` as UTF-8 JSON messages of at most about ``max_bytes`` each: the
    nodes split in node order (a node's ports whole; stage 3 merges a window's messages by
    node), so a big job's window stays under Kafka's record limit (1 MB by default)."""
    out: list[bytes] = []
    chunk: dict[str, tuple[PortWindow, ...]] = {}
    size = 0
    for node in sorted(jp.nodes):
        ports = jp.nodes[node]
        cost = len(json.dumps([port_window_json(p) for p in ports])) + len(node) + 8
        if chunk and size + cost > max_bytes:
            out.append(_message(jp, chunk))
            chunk, size = {}, 0
        chunk[node] = ports
        size += cost
    if chunk or not out:
        out.append(_message(jp, chunk))
    return out


def _message(jp: JobPorts, nodes: Mapping[str, tuple[PortWindow, ...]]) -> bytes:
    switched = {n: s for n, s in jp.switched.items() if n in nodes}
    part = JobPorts(jp.job_id, jp.start_ms, jp.end_ms, nodes, switched)
    return json.dumps(job_ports_json(part)).encode()


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME:
        raise ValueError(f"network message: {what} is not a string of 1..{MAX_NAME} characters")
    return value


def _ms(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**53:
        raise ValueError(f"network message: {what} is not an integer in [0, 2**53)")
    return value


def job_ports_of_json(data: Mapping[str, Any]) -> JobPorts:
    """A :func:`job_ports_json` message received from stage 2: hostile input, every field
    checked (names, times, at most :data:`MAX_NODES` nodes of :data:`MAX_PORTS` ports, each
    port window's window equal to the message's). Raises KeyError, TypeError or ValueError
    naming what is wrong (the caller dead-letters the message)."""
    if data.get("kind") != NETWORK_KIND:
        raise ValueError(f"network message: kind is not {NETWORK_KIND!r}")
    job_id = _name(data["job_id"], "job_id")
    start, end = _ms(data["start"], "start"), _ms(data["end"], "end")
    if end <= start:
        raise ValueError("network message: end not after start")
    nodes, switched = data["nodes"], data["switched"]
    if not isinstance(nodes, Mapping) or len(nodes) > MAX_NODES:
        raise TypeError(f"network message: nodes is not an object of at most {MAX_NODES}")
    if not isinstance(switched, Mapping) or len(switched) > MAX_NODES:
        raise TypeError(f"network message: switched is not an object of at most {MAX_NODES}")
    out: dict[str, tuple[PortWindow, ...]] = {}
    for node, ports in nodes.items():
        _name(node, "node")
        if not isinstance(ports, list) or len(ports) > MAX_PORTS:
            raise TypeError(f"network message: ports of {node!r} not a list of <= {MAX_PORTS}")
        windows = tuple(port_window_of_json(p) for p in ports)
        if any(p.start_ms != start or p.end_ms != end for p in windows):
            raise ValueError(f"network message: a port window of {node!r} is another window")
        if len({p.name for p in windows}) != len(windows):
            raise ValueError(f"network message: a port of {node!r} given twice")
        out[node] = windows
    return JobPorts(
        job_id,
        start,
        end,
        out,
        {_name(n, "node"): _name(s, "switch") for n, s in switched.items()},
    )


def nodes_by_job(closed: ClosedWindows) -> dict[str, list[str]]:
    """The nodes of each job with a slot in one closed window start (sorted)."""
    if not len(closed.node):
        return {}
    pairs = np.unique(np.stack([closed.accs["job"].astype(np.int64), closed.node]), axis=1)
    out: dict[str, list[str]] = {}
    for job_code, node_code in pairs.T.tolist():
        out.setdefault(closed.jobs[job_code][0], []).append(closed.names[node_code])
    return {job: sorted(nodes) for job, nodes in out.items()}


class JobNetwork:
    """Stage 3's side: each job's :class:`JobPorts` held until the detector releases its window,
    then compared (:meth:`release`). Call :meth:`release` for every released window of a job, in
    window order (with or without ports held: the job's own pace is learnt from every window)."""

    def __init__(
        self, settings: NetworkSettings | None = None, detector: DetectorSettings | None = None
    ) -> None:
        self.peers = NetworkPeers(settings, detector)
        self.settings = self.peers.settings
        #: (job, window start) -> node -> its port windows; and the nodes a switch explains
        self.held: dict[tuple[str, int], tuple[dict[str, tuple[PortWindow, ...]], dict[str, str]]]
        self.held = {}
        self.paces: dict[str, JobPace] = {}

    def add(self, jp: JobPorts) -> bool:
        """One source's ports of a job's window (a node given again replaces its ports); False
        when that window was released already (a re-sent message: nothing kept)."""
        pace = self.paces.get(jp.job_id)
        released = -1 if pace is None or pace.last_start_ms is None else pace.last_start_ms
        if jp.start_ms <= max(released, self.peers.last_window.get(jp.job_id, -1)):
            return False
        nodes, switched = self.held.setdefault((jp.job_id, jp.start_ms), ({}, {}))
        nodes.update(jp.nodes)
        switched.update(jp.switched)
        return True

    def release(
        self,
        job_id: str,
        start_ms: int,
        end_ms: int,
        job_wide: bool,
        job_sm: float | None,
        job_step_ms: float | None,
    ) -> list[StragglerFinding]:
        """The job's window ``[start_ms, end_ms)`` was released by the detector, whose verdict
        was ``job_wide`` with the job's median SM activity ``job_sm`` and step time
        ``job_step_ms`` (:class:`~peerwatch.streams.core.detector.DetectionResult`): the gate,
        then the held ports compared; returns the NETWORK findings (naming node and port)."""
        pace = self.paces.setdefault(job_id, JobPace())
        gate = pace.slowed(start_ms, job_sm, job_step_ms, self.settings) or job_wide
        held = self.held.pop((job_id, start_ms), None)
        if held is None:
            return []
        nodes, switched = held
        return self.peers.window(job_id, start_ms, end_ms, nodes, gate, explained=switched)

    def end_job(self, job_id: str) -> None:
        """Forget a job (it ended)."""
        self.peers.end_job(job_id)
        self.paces.pop(job_id, None)
        for key in [k for k in self.held if k[0] == job_id]:
            del self.held[key]

    def prune(self, before_ms: int) -> int:
        """Forget jobs whose last window started before ``before_ms``, and ports held for
        windows that started before it (never released); returns how many jobs."""
        gone = [j for j, p in self.paces.items()
                if p.last_start_ms is not None and p.last_start_ms < before_ms]  # fmt: skip
        for job_id in gone:
            self.end_job(job_id)
        for key in [k for k in self.held if k[1] < before_ms]:
            del self.held[key]
        self.peers.prune(before_ms)
        return len(gone)

    def snapshot(self, job_id: str) -> dict[str, Any]:
        """One job's memory as plain JSON data (:meth:`restore` takes it back): its pace, its
        last compared window and the ports in an episode or with a flagged window in their
        span (a clean port's memory is the same as none: it starts afresh). The ports held for
        windows not yet released are not in it (a window's worth of data, large for a big job):
        a restart between a window's ports and its release loses that window's comparison."""
        ports = self.peers.jobs.get(job_id, {})
        pace = self.paces.get(job_id)
        return {
            "peers": {
                k: state.to_dict()
                for k, state in sorted(ports.items())
                if state.status is not None
                or state.episode_start_ms is not None
                or any(state.history)
            },
            "last_window": self.peers.last_window.get(job_id),
            "pace": None if pace is None else pace.to_dict(),
        }

    def restore(self, job_id: str, data: Mapping[str, Any]) -> None:
        """Replace one job's memory with a :meth:`snapshot` (the caller's own store). Raises
        KeyError/TypeError/ValueError on a malformed one."""
        self.end_job(job_id)
        self.peers.restore_job(job_id, data["peers"], data["last_window"])
        if data["pace"] is not None:
            self.paces[job_id] = JobPace.from_dict(data["pace"])
