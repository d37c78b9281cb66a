"""The network of one job compared across its nodes, one window at a time (DETECTION.md "Network").

When one node's link degrades, every rank of the job waits on it: in NVML all GPUs look equally
idle and the GPU detector abstains job-wide (``JOB_WIDE``). The ports tell which node it is. Per
window, each port's features (:data:`FEATURES`, from its
:class:`~peerwatch.producers.nic.window.PortWindow`) are compared with the same port (the same
rail: ``mlx5_0/1`` with ``mlx5_0/1``) on the job's other nodes, by robust z with a MAD floor
(:func:`~peerwatch.streams.core.robust.robust_stats`) and a material-effect gate, as the GPU
features are. A port that stands out in windows covering ``network.confirm_s`` seconds within
the last ``network.confirm_span_s`` is named, once per episode, by a CONFIRMED finding with
cause ``NETWORK`` naming node and port, but only while the gate is open: the job is slow as a
whole (:mod:`~peerwatch.streams.core.network_gate`: against its own recent past, or the GPU
detector's job-wide verdict); when no port stands out, nothing is published and the GPU
verdict stays. A finding names no GPU: the policy alerts on it, never drains
(a job-wide slowdown never drains a node).

Features (bad direction in brackets): ``net_errors`` link/receive error counters per second
[higher], ``net_retrans`` retransmit/timeout counters per second [higher], ``net_cnp``
congestion notifications per second [higher], ``net_wait`` the ``port_xmit_wait`` share of the
window [higher], ``net_rx`` / ``net_tx`` bytes per second [lower], ``net_down`` seconds not up
[higher].

Pure: :class:`NetworkPeers` keeps per job and port the persistence memory (a
:class:`~peerwatch.streams.core.detector_state.GpuDetectorState` keyed ``node/port``, serialised
by its own ``to_dict``); :meth:`NetworkPeers.snapshot` / :meth:`NetworkPeers.restore`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peerwatch.producers.nic.window import PortWindow
from peerwatch.schemas.records import FeatureEvidence, StragglerFinding
from peerwatch.streams.core.detector_state import GpuDetectorState
from peerwatch.streams.core.model import CONFIRMED, stable_id
from peerwatch.streams.core.robust import robust_stats
from peerwatch.streams.core.settings import DetectorSettings, NetworkSettings

#: Error counters summed into ``net_errors`` (IB counters/ and netdev statistics/).
ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "port_rcv_errors", "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors", "port_xmit_discards", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "port_rcv_constraint_errors",
    "port_xmit_constraint_errors", "rx_crc_errors", "rx_errors", "tx_errors", "rx_missed_errors",
)  # fmt: skip
#: Retransmit and transport-timeout counters (mlx5 hw_counters/) summed into ``net_retrans``.
RETRANS_COUNTERS = (
    "local_ack_timeout_err", "out_of_sequence", "packet_seq_err", "roce_adp_retrans",
    "rnr_nak_retry_err", "implied_nak_seq_err", "roce_slow_restart",
)  # fmt: skip
#: Congestion notifications (RoCE DCQCN) summed into ``net_cnp``.
CNP_COUNTERS = ("np_cnp_sent", "rp_cnp_handled")


def _sum(port: PortWindow, names: Sequence[str]) -> float | None:
    """Sum of the rates of ``names`` the window has (None: it has none of them)."""
    rates = [port.rates_per_s[n] for n in names if n in port.rates_per_s]
    return float(sum(rates)) if rates else None


def _first(port: PortWindow, *names: str) -> float | None:
    for name in names:
        if name in port.rates_per_s:
            return float(port.rates_per_s[name])
    return None


def _wait_share(port: PortWindow, settings: NetworkSettings) -> float | None:
    """Share of the window the port had data to send and could not (0..1), from
    ``port_xmit_wait`` ticks/s x bytes per tick over the link's bytes/s."""
    ticks = port.rates_per_s.get("port_xmit_wait")
    if ticks is None or not port.min_rate_gbps:
        return None
    return min(1.0, ticks * settings.xmit_wait_bytes_per_tick / (port.min_rate_gbps * 1e9 / 8))


def _down(port: PortWindow, _: NetworkSettings) -> float | None:
    known = (port.end_ms - port.start_ms) / 1000 - port.unknown_s
    return port.down_s if known > 0 else None


@dataclass(frozen=True)
class NetFeature:
    """One compared feature: its ``name``, how it is read from a port's window, its bad
    direction (+1: higher is worse, -1: lower), the MAD floor and the material effect."""

    name: str
    value: Callable[[PortWindow, NetworkSettings], float | None]
    direction: int
    floor: Callable[[float, NetworkSettings], float]
    material: Callable[[float, float, NetworkSettings], bool]


# fmt: off
FEATURES: tuple[NetFeature, ...] = (
    NetFeature("net_errors", lambda p, s: _sum(p, ERROR_COUNTERS), 1,
               lambda m, s: s.peer_error_per_s, lambda v, m, s: v - m >= s.peer_error_per_s),
    NetFeature("net_retrans", lambda p, s: _sum(p, RETRANS_COUNTERS), 1,
               lambda m, s: s.peer_error_per_s, lambda v, m, s: v - m >= s.peer_error_per_s),
    NetFeature("net_cnp", lambda p, s: _sum(p, CNP_COUNTERS), 1,
               lambda m, s: s.peer_cnp_per_s, lambda v, m, s: v - m >= s.peer_cnp_per_s),
    NetFeature("net_wait", _wait_share, 1,
               lambda m, s: s.peer_wait_share / 4, lambda v, m, s: v - m >= s.peer_wait_share),
    NetFeature("net_rx", lambda p, s: _first(p, "port_rcv_data", "rx_bytes"), -1,
               lambda m, s: s.peer_throughput_rel / 4 * abs(m),
               lambda v, m, s: m - v >= s.peer_throughput_rel * m and m > 0),
    NetFeature("net_tx", lambda p, s: _first(p, "port_xmit_data", "tx_bytes"), -1,
               lambda m, s: s.peer_throughput_rel / 4 * abs(m),
               lambda v, m, s: m - v >= s.peer_throughput_rel * m and m > 0),
    NetFeature("net_down", _down, 1, lambda m, s: 0.5, lambda v, m, s: v - m >= 1.0),
)
# fmt: on


@dataclass(frozen=True)
class PortVerdict:
    """One port of one node in one window: the features that flag it (empty: clean), its
    evidence and the largest bad-direction z (None: not compared)."""

    node: str
    port: str
    flags: tuple[str, ...]
    evidence: tuple[FeatureEvidence, ...]
    score: float | None


def compare_ports(
    nodes: Mapping[str, Sequence[PortWindow]], settings: NetworkSettings
) -> list[PortVerdict]:
    """Every port of every node compared with the same port on the other nodes of the job.

    ``nodes``: node -> its ports' windows (one window). A port compared in a group smaller than
    ``peer_min_nodes`` (for a feature: nodes with a value) gets no flags and score None. A NaN or
    infinite value is left out (hostile counters). Verdicts sorted by (node, port).
    """
    by_port: dict[str, dict[str, PortWindow]] = {}
    for node, ports in nodes.items():
        for pw in ports:
            by_port.setdefault(pw.name, {})[node] = pw
    out: list[PortVerdict] = []
    for port in sorted(by_port):
        group = by_port[port]
        per_node: dict[str, tuple[list[str], list[FeatureEvidence], float | None]] = {
            n: ([], [], None) for n in group
        }
        for feat in FEATURES:
            values = {n: v for n, pw in group.items()
                      if (v := feat.value(pw, settings)) is not None and math.isfinite(v)}  # fmt: skip
            if len(values) < settings.peer_min_nodes:
                continue
            mid = robust_stats(list(values.values())).median
            stats = robust_stats(list(values.values()), floor_abs=feat.floor(mid, settings))
            for n, v in values.items():
                z = stats.z(v)
                flags, evidence, best = per_node[n]
                bad = z * feat.direction
                best = bad if best is None else max(best, bad)
                if bad >= settings.peer_z and feat.material(v, stats.median, settings):
                    flags.append(feat.name)
                    evidence.append({"feature": feat.name, "value": v,
                                     "peer_median": stats.median, "mad": stats.mad, "z": z})  # fmt: skip
                per_node[n] = (flags, evidence, best)
        for n in sorted(per_node):
            flags, evidence, best = per_node[n]
            out.append(PortVerdict(n, port, tuple(flags), tuple(evidence), best))
    return out


class NetworkPeers:
    """Per-job network peer comparison with persistence in seconds.

    Call :meth:`window` once per closed window of each job, in window order, with the job's
    nodes' port windows and whether the gate is open (the job slowed as a whole). :meth:`end_job` forgets a job.
    """

    def __init__(
        self, settings: NetworkSettings | None = None, detector: DetectorSettings | None = None
    ) -> None:
        self.settings = settings or NetworkSettings()
        self.detector = detector or DetectorSettings()
        window_s = self.detector.window_s
        self.k = max(1, math.ceil(self.settings.confirm_s / window_s))
        self.n = max(self.k, math.ceil(self.settings.confirm_span_s / window_s))
        self.jobs: dict[str, dict[str, GpuDetectorState]] = {}
        self.last_window: dict[str, int] = {}
        self.findings = 0

    def window(
        self,
        job_id: str,
        start_ms: int,
        end_ms: int,
        nodes: Mapping[str, Sequence[PortWindow]],
        gate: bool,
        explained: Collection[str] = (),
    ) -> list[StragglerFinding]:
        """One window of one job; returns the NETWORK findings it makes (sorted by node, port).

        ``gate``: the job is slowed as a whole in this window
        (:mod:`~peerwatch.streams.core.network_gate`); a port is named only while it is open.
        ``explained``: nodes whose symptom an open leaf-switch episode explains (compared, never
        flagged: the switch finding names the cause).
        A window at or before the job's last one (a redelivery) changes nothing and returns [].
        Ports of fewer than ``peer_min_nodes`` nodes are not judged. When more than half of a
        port's group stands out, no node is named (a shared cause: the leaf switch or the job's
        own traffic)."""
        if start_ms <= self.last_window.get(job_id, -(1 << 62)):
            return []
        self.last_window[job_id] = start_ms
        states = self.jobs.setdefault(job_id, {})
        verdicts = compare_ports(nodes, self.settings)
        flagged_per_port: dict[str, int] = {}
        group_per_port: dict[str, int] = {}
        for v in verdicts:
            group_per_port[v.port] = group_per_port.get(v.port, 0) + 1
            flagged_per_port[v.port] = flagged_per_port.get(v.port, 0) + bool(v.flags)
        out: list[StragglerFinding] = []
        for v in verdicts:
            if v.score is None:
                continue
            shared = flagged_per_port[v.port] * 2 > group_per_port[v.port]
            flagged = bool(v.flags) and not shared and v.node not in explained
            state = states.setdefault(f"{v.node}/{v.port}", GpuDetectorState())
            state.last_seen_ms = end_ms
            state.history = ([*state.history, 1 if flagged else 0])[-self.n :]
            if flagged and state.episode_start_ms is None:
                state.episode_start_ms = start_ms
            if not flagged:
                state.clean_streak += 1
                if state.clean_streak >= self.n:  # a whole span clean: the episode is over
                    state.reset_episode()
                continue
            state.clean_streak = 0
            if state.status is None and sum(state.history) >= self.k and gate:
                state.status = CONFIRMED
                out.append(self._finding(job_id, start_ms, end_ms, v, state, group_per_port))
        self.findings += len(out)
        return out

    def _finding(
        self,
        job_id: str,
        start_ms: int,
        end_ms: int,
        v: PortVerdict,
        state: GpuDetectorState,
        groups: Mapping[str, int],
    ) -> StragglerFinding:
        top = max(v.evidence, key=lambda e: abs(e["z"]))
        reason = (
            f"network: port {v.port} of {v.node} stands out while the job is slowed "
            f"({', '.join(v.flags)}; {top['feature']} {top['value']:.3g} vs median "
            f"{top['peer_median']:.3g}, z {top['z']:.1f})"
        )
        return {
            "finding_id": stable_id(
                job_id,
                v.node,
                v.port,
                CONFIRMED,
                "network",
                state.episode_start_ms,
                hex_chars=self.detector.id_hex_chars,
            ),
            "job_id": job_id,
            "node": v.node,
            "gpu_index": None,
            "gpu_uuid": None,
            "status": CONFIRMED,
            "window_start_ms": start_ms,
            "window_end_ms": end_ms,
            "features": list(v.evidence),
            "hard_rules": [],
            "windows_flagged": sum(state.history),
            "windows_considered": len(state.history),
            "first_flagged_ms": state.episode_start_ms,
            "peer_group_size": groups[v.port],
            "reason": reason,
            "cause": "NETWORK",
            "detected_ms": end_ms,
            "port": v.port,
            "switch": None,
        }

    def end_job(self, job_id: str) -> None:
        """Forget a job (it ended)."""
        self.jobs.pop(job_id, None)
        self.last_window.pop(job_id, None)

    def prune(self, before_ms: int) -> int:
        """Forget jobs whose last window started before ``before_ms`` (an end event lost, a
        job gone quiet); returns how many."""
        old = [j for j, start in self.last_window.items() if start < before_ms]
        for job_id in old:
            self.end_job(job_id)
        return len(old)

    def restore_job(self, job_id: str, ports: Mapping[str, Any], last_window: int | None) -> None:
        """Replace one job's memory (its ports' states as :meth:`snapshot` gives them under
        ``jobs``, and its last window start; the caller's own store)."""
        self.end_job(job_id)
        if ports:
            self.jobs[job_id] = {str(k): GpuDetectorState.from_dict(s) for k, s in ports.items()}
        if last_window is not None:
            self.last_window[job_id] = int(last_window)

    def snapshot(self) -> dict[str, object]:
        """Plain JSON data (:meth:`restore` takes it back)."""
        return {
            "jobs": {
                j: {k: s.to_dict() for k, s in ports.items()} for j, ports in self.jobs.items()
            },
            "last_window": dict(self.last_window),
        }

    def restore(self, data: Mapping[str, object]) -> None:
        """Replace the memory with a :meth:`snapshot` (the caller's own store)."""
        jobs = data["jobs"]
        last = data["last_window"]
        assert isinstance(jobs, Mapping) and isinstance(last, Mapping)
        self.jobs = {
            str(j): {str(k): GpuDetectorState.from_dict(s) for k, s in ports.items()}
            for j, ports in jobs.items()
        }
        self.last_window = {str(j): int(v) for j, v in last.items()}
