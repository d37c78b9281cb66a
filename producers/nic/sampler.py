"""One NodeNicSample per tick: the raw state and counters of the node's chosen NIC ports.

The record carries raw counter values, not deltas: a lost or late record then costs nothing
(the next one spans the gap) and every consumer applies the same arithmetic
(``peerwatch.producers.nic.counters``). A value that cannot be read is null and counted in the
port's ``read_errors`` and the record's total; a tick never raises for sysfs trouble.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from peerwatch.clock import Clock
from peerwatch.producers.nic.counters import HW_COUNTERS, IB_COUNTERS, NETDEV_COUNTERS
from peerwatch.producers.nic.ports import NicPort, link_up
from peerwatch.producers.nic.sysfs import Reader


def hw_counter_names(reader: Reader, port: NicPort) -> tuple[str, ...]:
    """The ``HW_COUNTERS`` that ``port`` has (an IB port's ``hw_counters/``; none otherwise)."""
    if port.kind != "IB":
        return ()
    try:
        present = set(reader.tree.listdir(f"{port.path}/hw_counters"))
    except OSError:
        return ()
    return tuple(n for n in HW_COUNTERS if n in present)


def read_port(reader: Reader, port: NicPort, hw_names: Iterable[str] = ()) -> dict[str, Any]:
    """One NicPortReading dict of ``port`` now (``hw_names``: the hw_counters to read). Values
    that cannot be read are None and counted in ``read_errors``; never raises."""
    r = reader
    errors0 = r.stats.total
    path = port.path
    if port.kind == "IB":
        counters = {n: r.counter(f"{path}/counters/{n}") for n in IB_COUNTERS}
        hw = {n: r.counter(f"{path}/hw_counters/{n}") for n in hw_names}
        state = r.text(f"{path}/state")
        phys = r.text(f"{path}/phys_state")
        link_layer = r.text(f"{path}/link_layer")
        rate = r.ib_rate_gbps(f"{path}/rate")
    else:
        counters = {n: r.counter(f"{path}/statistics/{n}") for n in NETDEV_COUNTERS}
        # carrier_changes sits beside statistics/, not in it.
        counters["carrier_changes"] = r.counter(f"{path}/carrier_changes")
        hw = {}
        state = r.text(f"{path}/operstate")
        phys = None
        link_layer = "Ethernet"
        speed_mbps = r.integer(f"{path}/speed")
        # -1 (or EINVAL) is the kernel's "unknown" (link down, virtual NIC).
        rate = speed_mbps / 1000 if speed_mbps is not None and speed_mbps > 0 else None
    return {
        "name": port.name,
        "kind": port.kind,
        "device": port.device,
        "port": port.port,
        "link_layer": link_layer,
        "state": state,
        "phys_state": phys,
        "up": link_up(port.kind, state, phys),
        "rate_gbps": rate,
        "pci_address": port.pci_address,
        "numa_node": port.numa_node,
        "gpu_indices": list(port.gpu_indices),
        "counters": counters,
        "hw_counters": hw,
        "read_errors": r.stats.total - errors0,
    }


class NicSampler:
    """Reads ``ports`` (from ``discover_ports``) through ``reader`` into NodeNicSample dicts.

    ``hw_counters/`` is read only for ports where it existed at start (listed once: the set of
    counters an HCA exposes does not change while its driver is loaded).
    """

    def __init__(
        self,
        reader: Reader,
        ports: Iterable[NicPort],
        *,
        node: str,
        interval_ms: int,
        clock: Clock,
        agent_run_id: str,
    ) -> None:
        self.reader = reader
        self.ports = tuple(ports)
        self.node = node
        self.interval_ms = interval_ms
        self.agent_run_id = agent_run_id
        self._clock = clock
        self._hw = {p.name: hw_counter_names(reader, p) for p in self.ports}

    def sample(self, seq: int, ts_ms: int | None = None) -> dict[str, Any]:
        """The NodeNicSample dict of this tick: ``ts_ms`` is the tick's time (the agent passes
        its GPU record's, so the two join on it), else the clock's before the reads."""
        if ts_ms is None:
            ts_ms = self._clock.now_ms()
        ports = [read_port(self.reader, p, self._hw[p.name]) for p in self.ports]
        return {
            "node": self.node,
            "ts_ms": ts_ms,
            "seq": seq,
            "agent_run_id": self.agent_run_id,
            "interval_ms": self.interval_ms,
            "ports": ports,
            "read_errors": sum(p["read_errors"] for p in ports),
        }
