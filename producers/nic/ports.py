"""Which NIC ports a node has, which of them to sample, and which GPUs sit next to each.

Two kinds of port, each named as operators name it:

* ``IB``: an RDMA port ``<hca>/<n>`` under ``class/infiniband`` (InfiniBand, RoCE or EFA; its
  ``link_layer`` says which).
* ``NETDEV``: a physical Ethernet interface ``<if>`` under ``class/net`` (one with a ``device``
  link and ARPHRD type 1; loopback, bridges, ifb and IPoIB interfaces are left out: an IPoIB
  interface's link is its IB port, already sampled).

Rail affinity: the port's PCI function (``device`` link, resolved) is compared with each GPU's
(``bus/pci/devices/<bus id>``): the GPUs that share the longest run of PCI bridges with the NIC
(the same PCIe switch on HGX boards) are its rail; when none shares a bridge, the GPUs on the
same NUMA node are. Without GPU bus ids, no affinity.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from peerwatch.producers.nic.sysfs import Reader

log = logging.getLogger(__name__)

IB_CLASS = "class/infiniband"
NET_CLASS = "class/net"
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_ETHER = 1  # ARPHRD_ETHER


@dataclass(frozen=True)
class NicPort:
    """One port to sample. ``path`` is its sysfs directory relative to the tree's root."""

    name: str
    kind: str  # "IB" or "NETDEV"
    device: str
    port: int | None
    path: str
    pci_address: str | None = None
    numa_node: int | None = None
    gpu_indices: tuple[int, ...] = ()


def pci_bus_id(nvml_bus_id: str) -> str | None:
    """NVML's ``00000000:18:00.0`` as sysfs names it (``0000:18:00.0``); None if malformed."""
    parts = nvml_bus_id.strip().lower().split(":")
    if len(parts) != 3:
        return None
    try:
        domain = int(parts[0], 16)
    except ValueError:
        return None
    address = f"{domain:04x}:{parts[1]}:{parts[2]}"
    return address if _PCI_ADDRESS.fullmatch(address) else None


def _listdir(reader: Reader, path: str) -> list[str]:
    try:
        return sorted(reader.tree.listdir(path))
    except OSError:
        return []


def _pci_chain(reader: Reader, path: str) -> list[str]:
    """The PCI addresses from the root port down to the function behind ``path``."""
    real = reader.tree.realpath(path)
    return [part for part in real.split("/") if _PCI_ADDRESS.fullmatch(part)]


def ib_ports(reader: Reader, class_dir: str = IB_CLASS) -> list[NicPort]:
    """Every RDMA port under ``class_dir`` (the tree's ``class/infiniband``; ``""`` when the
    tree is rooted at that folder itself), in name order. Never raises."""
    ports = []
    for hca in _listdir(reader, class_dir):
        hca_dir = f"{class_dir}/{hca}" if class_dir else hca
        for number in _listdir(reader, f"{hca_dir}/ports"):
            if not number.isdigit():
                continue
            path = f"{hca_dir}/ports/{number}"
            ports.append(NicPort(f"{hca}/{number}", "IB", hca, int(number), path))
    return ports


def _netdev_ports(reader: Reader) -> list[NicPort]:
    ports = []
    for name in _listdir(reader, NET_CLASS):
        path = f"{NET_CLASS}/{name}"
        if not _pci_chain(reader, f"{path}/device") or reader.integer(f"{path}/type") != _ETHER:
            continue
        ports.append(NicPort(name, "NETDEV", name, None, path))
    return ports


def link_up(kind: str, state: str | None, phys_state: str | None) -> bool | None:
    """IB: ``state`` ACTIVE and ``phys_state`` LinkUp; NETDEV: ``operstate`` (passed as
    ``state``) up. None when a needed state is unknown."""
    if kind == "IB":
        if state is None or phys_state is None:
            return None
        return state.upper() == "ACTIVE" and phys_state.lower() == "linkup"
    return None if state is None else state.lower() == "up"


def is_up(reader: Reader, port: NicPort) -> bool | None:
    """Whether ``port`` is up now (see ``link_up``)."""
    if port.kind == "IB":
        state = reader.text(f"{port.path}/state")
        return link_up("IB", state, reader.text(f"{port.path}/phys_state"))
    return link_up("NETDEV", reader.text(f"{port.path}/operstate"), None)


def _device_dir(port: NicPort) -> str:
    return f"{IB_CLASS}/{port.device}/device" if port.kind == "IB" else f"{port.path}/device"


def _with_affinity(
    reader: Reader, port: NicPort, gpus: Mapping[int, tuple[list[str], int | None]]
) -> NicPort:
    chain = _pci_chain(reader, _device_dir(port))
    numa = reader.integer(f"{_device_dir(port)}/numa_node") if chain else None
    numa = numa if numa is not None and numa >= 0 else None
    shared = {}
    for index, (gpu_chain, _) in gpus.items():
        n = 0
        while n < min(len(chain), len(gpu_chain)) and chain[n] == gpu_chain[n]:
            n += 1
        shared[index] = n
    best = max(shared.values(), default=0)
    if best > 0:
        near = tuple(sorted(i for i, n in shared.items() if n == best))
    elif numa is not None:
        near = tuple(sorted(i for i, (_, gpu_numa) in gpus.items() if gpu_numa == numa))
    else:
        near = ()
    return NicPort(port.name, port.kind, port.device, port.port, port.path,
                   chain[-1] if chain else None, numa, near)  # fmt: skip


def discover_ports(
    reader: Reader,
    gpu_bus_ids: Mapping[int, str] | None = None,
    select: Collection[str] = (),
) -> list[NicPort]:
    """The ports to sample: those named in ``select`` (``mlx5_0/1``, ``eth0``), or, when it is
    empty, every port that is up now. ``gpu_bus_ids`` maps GPU index to NVML bus id for the
    rail affinity. A selected name with no such port is logged and left out. Never raises."""
    every = ib_ports(reader) + _netdev_ports(reader)
    if select:
        by_name = {p.name: p for p in every}
        for name in select:
            if name not in by_name:
                log.warning("nic: configured port %r not found; not sampled", name)
        chosen = [by_name[n] for n in select if n in by_name]
    else:
        chosen = [p for p in every if is_up(reader, p)]
    gpus: dict[int, tuple[list[str], int | None]] = {}
    for index, bus_id in (gpu_bus_ids or {}).items():
        address = pci_bus_id(bus_id)
        if address is None:
            continue
        gpu_dir = f"bus/pci/devices/{address}"
        gpus[index] = (_pci_chain(reader, gpu_dir), reader.integer(f"{gpu_dir}/numa_node"))
    return [_with_affinity(reader, p, gpus) for p in chosen]
