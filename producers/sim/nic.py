"""The simulated nodes' NIC ports: NodeNicSample records beside the GPU samples, NIC faults and
their effect on the job's GPUs.

Enabled by ``fleet.nics_per_node`` > 0 (default 0: no NIC records, and the fleet's other output
is byte-for-byte what it was). Each node has that many InfiniBand ports ``mlx5_<p>/1`` at
``fleet.nic_rate_gbps``, rail ``p`` nearest GPU ``p`` (when there are as many ports as GPUs).
Records are built as the agent builds them (:class:`~peerwatch.schemas.records.NodeNicSample`,
:class:`~peerwatch.schemas.records.NicPortReading`, ``up`` by the agent's own
:func:`~peerwatch.producers.nic.ports.link_up`): raw cumulative counters, ``port_*_data`` in
4-byte words, the legacy error counters saturating at their width
(:func:`~peerwatch.producers.nic.counters.saturation_value`; the data, packet and wait counters as
64-bit extended counters).

Traffic per port (bytes/s): ``TRAIN_BPS`` while the node's job trains (±3%), a tenth of it in a
checkpoint or eval, almost nothing idle; ``port_xmit_wait`` grows by the share of the tick the
port waits (ticks of 8 bytes at the link rate); a PAM4 trickle of symbol errors on every port
and a boot total, which no rule may alarm on.

Faults (``node``, params ``port`` (index, default 0)): ``nic_port_flap`` (down ``flap_down_s``
every ``flap_every_s``; each flap a ``link_downed``), ``nic_symbol_errors`` (``errors_per_s``),
``nic_port_down`` (down for the whole injection), ``nic_half_rate`` (trained at half the rate,
waiting ``wait_share`` of the time), ``nic_retransmit`` (``retrans_per_s`` out-of-sequence and
sequence errors, ``ack_timeouts_per_s`` transport timeouts (default 0: under the hard rate rule),
waiting ``wait_share``), ``switch_congestion`` (every node under the leaf switch
of ``node``, ``fleet.nodes_per_leaf`` nodes a leaf: ``wait_share`` and ``cnp_per_s``). Each slows
every GPU of the jobs that own an affected node: SM activity times ``sm_factor`` (a port down
stalls the job: 0.05).

Confounders: ``alltoall_phase`` (a job's every node waits and sends more: shared, blames
nobody), ``checkpoint_traffic`` (a job's nodes send ``tx_factor`` times more), ``nic_counter_reset``
(``perfquery -x``: the node's counters restart at 0), ``node_reboot`` (the node's NIC records stop
for ``down_s`` seconds, then restart with counters at 0 and a new agent run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peerwatch.producers.nic.counters import HW_COUNTERS, IB_COUNTERS, saturation_value
from peerwatch.producers.nic.ports import link_up
from peerwatch.schemas.records import NicPortReading, NodeNicSample

NIC_FAULTS = frozenset(
    {"nic_port_flap", "nic_symbol_errors", "nic_port_down", "nic_half_rate", "nic_retransmit",
     "switch_congestion"}
)  # fmt: skip
NIC_CONFOUNDERS = frozenset(
    {"alltoall_phase", "checkpoint_traffic", "nic_counter_reset", "node_reboot"}
)
#: Injections that act on the jobs of the affected nodes (the job's every GPU slows).
JOB_SLOWING = frozenset(
    {"nic_port_flap", "nic_port_down", "nic_half_rate", "nic_retransmit", "switch_congestion"}
)
#: Their default SM-activity factor on every GPU of the job.
DEFAULT_SM_FACTOR = {"nic_port_down": 0.05, "nic_port_flap": 0.5}
TRAIN_BPS = 20e9
#: The legacy error counters, which saturate at their width; the data, packet and wait counters
#: are modelled as an HCA with extended (64-bit) counters shows them.
NARROW = frozenset(c for c in IB_COUNTERS if (saturation_value(c) or 0) < 2**32 - 1)
_PAM4_PER_S = 0.05  # symbol errors a healthy NDR port shows (corrected by FEC): normal
_BOOT_SYMBOL_ERRORS = 1200

# activity of a node's job, as the fleet passes it
TRAIN, PAUSED, IDLE = range(3)


def _noise(*parts: object) -> float:
    """A deterministic value in [-1, 1)."""
    h = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**63 - 1.0


@dataclass(frozen=True, slots=True)
class NicWindow:
    """One NIC injection: ``nodes`` it touches (indices), its port (None: every port), its time
    span in ms from the scenario start, its parameters and the jobs it slows."""

    name: str
    nodes: frozenset[int]
    port: int | None
    start_ms: int
    end_ms: int
    params: Mapping[str, Any]
    jobs: frozenset[str] = frozenset()

    def active(self, t_ms: int) -> bool:
        return self.start_ms <= t_ms < self.end_ms

    def param(self, key: str, default: float) -> float:
        return float(self.params.get(key, default))


def leaf_nodes(node: int, nodes_per_leaf: int, n_nodes: int) -> frozenset[int]:
    """The nodes under the leaf switch of ``node`` (consecutive blocks of ``nodes_per_leaf``)."""
    first = node // nodes_per_leaf * nodes_per_leaf
    return frozenset(range(first, min(first + nodes_per_leaf, n_nodes)))


def topology_conf(n_nodes: int, nodes_per_leaf: int, node_name: Callable[[int], str]) -> str:
    """The simulated fleet's switch layout as a Slurm ``topology.conf`` (one leaf switch
    ``leaf<k>`` per block of ``nodes_per_leaf`` nodes, a ``spine`` above them), the text the
    stream parses as it parses a real one (:func:`~peerwatch.streams.core.topology.parse_topology`)."""
    leaves = [
        f"SwitchName=leaf{k} Nodes={','.join(node_name(n) for n in sorted(leaf_nodes(first, nodes_per_leaf, n_nodes)))}"
        for k, first in enumerate(range(0, n_nodes, nodes_per_leaf))
    ]
    spine = f"SwitchName=spine Switches=leaf[0-{len(leaves) - 1}]" if leaves else ""
    return "\n".join([*leaves, spine]) + "\n"


class NicModel:
    """The NIC ports of every node over the ticks (cumulative counters kept per port)."""

    def __init__(
        self,
        n_nodes: int,
        ports: int,
        rate_gbps: float,
        gpus_per_node: int,
        seed: int,
        windows: Sequence[NicWindow],
    ) -> None:
        self.ports = ports
        self.rate_gbps = rate_gbps
        self.seed = seed
        self.rails = [[p] if ports == gpus_per_node else [] for p in range(ports)]
        self.windows = tuple(windows)
        self.acc = [[self._fresh(n, p) for p in range(ports)] for n in range(n_nodes)]
        self.was_up = [[True] * ports for _ in range(n_nodes)]
        self.runs = [0] * n_nodes
        self.seqs = [0] * n_nodes
        self._done: set[tuple[int, str, int]] = set()  # one-shot injections already applied
        self.by_node: dict[int, list[NicWindow]] = {}
        for w in self.windows:
            for n in w.nodes:
                self.by_node.setdefault(n, []).append(w)

    def _fresh(self, n: int, p: int) -> dict[str, float]:
        acc = {c: 0.0 for c in (*IB_COUNTERS, *HW_COUNTERS)}
        acc["symbol_error"] = float(_BOOT_SYMBOL_ERRORS + int(50 * (1 + _noise(self.seed, n, p))))
        return acc

    def job_sm_factor(self, job_id: str, t_ms: int) -> float:
        """SM-activity factor of every GPU of ``job_id`` at ``t_ms`` from the NIC faults on its
        nodes (1.0: none)."""
        factor = 1.0
        for w in self.windows:
            if w.name in JOB_SLOWING and job_id in w.jobs and w.active(t_ms):
                if w.name == "nic_port_flap" and not self._flap_down(w, t_ms):
                    continue
                factor *= w.param("sm_factor", DEFAULT_SM_FACTOR.get(w.name, 0.7))
        return factor

    @staticmethod
    def _flap_down(w: NicWindow, t_ms: int) -> bool:
        every = max(1.0, w.param("flap_every_s", 20.0)) * 1000
        return (t_ms - w.start_ms) % every < w.param("flap_down_s", 2.0) * 1000

    def publishing(self, n: int, t_ms: int) -> bool:
        """False while node ``n`` reboots (no NIC record)."""
        return not any(
            w.name == "node_reboot"
            and w.start_ms <= t_ms < w.start_ms + w.param("down_s", 120.0) * 1000
            for w in self.by_node.get(n, ())
        )

    def sample(
        self,
        n: int,
        node: str,
        t_ms: int,
        ts_ms: int,
        interval_ms: int,
        activity: int,
        agent_run_id: str,
    ) -> NodeNicSample:
        """Node ``n``'s record at tick time ``t_ms`` (ms from the start; ``ts_ms`` the record's
        epoch time, the GPU sample's), the counters advanced by one interval. ``activity``: the
        node's job is training, paused (checkpoint/eval) or idle."""
        dt = interval_ms / 1000
        here = [w for w in self.by_node.get(n, ()) if w.active(t_ms)]
        for w in here:  # one-shot resets at their first tick
            if (
                w.name in ("nic_counter_reset", "node_reboot")
                and (n, w.name, w.start_ms) not in self._done
            ):
                self._done.add((n, w.name, w.start_ms))
                self.acc[n] = [{c: 0.0 for c in self.acc[n][p]} for p in range(self.ports)]
                self.runs[n] += w.name == "node_reboot"
        readings: list[NicPortReading] = []
        for p in range(self.ports):
            readings.append(self._port(n, p, t_ms, dt, activity, here))
        seq = self.seqs[n]
        self.seqs[n] += 1
        run_id = agent_run_id if not self.runs[n] else f"{agent_run_id[:-4]}r{self.runs[n]:03d}"
        return {
            "node": node,
            "ts_ms": ts_ms,
            "seq": seq,
            "agent_run_id": run_id,
            "interval_ms": interval_ms,
            "ports": readings,
            "read_errors": 0,
        }

    def _port(
        self,
        n: int,
        p: int,
        t_ms: int,
        dt: float,
        activity: int,
        here: Sequence[NicWindow],
    ) -> NicPortReading:
        acc = self.acc[n][p]
        up, rate, wait = True, self.rate_gbps, 0.0
        bps = {TRAIN: TRAIN_BPS, PAUSED: TRAIN_BPS / 10, IDLE: 1e6}[activity]
        bps *= 1 + 0.03 * _noise(self.seed, n, p, t_ms)
        tx = rx = bps
        wait = 0.01 * (1 + 0.2 * _noise(self.seed, n, p, t_ms, "w")) if activity == TRAIN else 0.0
        acc["symbol_error"] += _PAM4_PER_S * dt
        for w in here:
            if w.port is not None and w.port != p:
                continue
            name = w.name
            if name == "nic_port_down" or (name == "nic_port_flap" and self._flap_down(w, t_ms)):
                up = False
            elif name == "nic_symbol_errors":
                acc["symbol_error"] += w.param("errors_per_s", 200.0) * dt
            elif name == "nic_half_rate":
                rate = self.rate_gbps / 2
                wait = max(wait, w.param("wait_share", 0.5))
            elif name == "nic_retransmit":
                r = w.param("retrans_per_s", 500.0) * dt
                acc["local_ack_timeout_err"] += w.param("ack_timeouts_per_s", 0.0) * dt
                acc["out_of_sequence"] += r
                acc["packet_seq_err"] += r / 2
                wait = max(wait, w.param("wait_share", 0.2))
            elif name == "switch_congestion":
                wait = max(wait, w.param("wait_share", 0.4))
                acc["np_cnp_sent"] += w.param("cnp_per_s", 5000.0) * dt
                acc["rp_cnp_handled"] += w.param("cnp_per_s", 5000.0) * dt
            elif name == "alltoall_phase":
                tx *= w.param("tx_factor", 2.0)
                rx *= w.param("tx_factor", 2.0)
                wait = max(wait, w.param("wait_share", 0.3))
            elif name == "checkpoint_traffic":
                tx *= w.param("tx_factor", 3.0)
        if not up:
            tx = rx = 0.0
            wait = 0.0
            if self.was_up[n][p]:
                acc["link_downed"] += 1
                acc["link_error_recovery"] += 1
        self.was_up[n][p] = up
        acc["port_xmit_data"] += tx * dt / 4
        acc["port_rcv_data"] += rx * dt / 4
        acc["port_xmit_packets"] += tx * dt / 4096
        acc["port_rcv_packets"] += rx * dt / 4096
        acc["port_xmit_wait"] += wait * dt * rate * 1e9 / 8 / 8
        counters: dict[str, int | None] = {}
        for c in IB_COUNTERS:
            top = saturation_value(c) if c in NARROW else None
            value = int(acc[c])
            counters[c] = min(value, top) if top is not None else value
        hw: dict[str, int | None] = {c: int(acc[c]) for c in HW_COUNTERS}
        state, phys = ("ACTIVE", "LinkUp") if up else ("DOWN", "Polling")
        return {
            "name": f"mlx5_{p}/1",
            "kind": "IB",
            "device": f"mlx5_{p}",
            "port": 1,
            "link_layer": "InfiniBand",
            "state": state,
            "phys_state": phys,
            "up": link_up("IB", state, phys),
            "rate_gbps": rate if up else None,
            "pci_address": f"0000:{0x18 + 0x10 * p:02x}:00.1",
            "numa_node": p * 2 // max(self.ports, 1),
            "gpu_indices": list(self.rails[p]),
            "counters": counters,
            "hw_counters": hw,
            "read_errors": 0,
        }
