"""Record this machine's NIC sysfs tree as a test fixture (the files the agent reads, real values).

    python scripts/record_sysfs.py OUT [--root /sys]

Copies, for every interface under ``class/net`` and every port under ``class/infiniband``, the
attributes ``peerwatch.producers.nic`` reads (state, rate, counters, statistics, operstate,
speed, type, carrier_changes, hw_counters) and rebuilds the ``device`` link as a relative
symlink into a ``devices/`` skeleton with each PCI function's ``numa_node``. A file the kernel
refuses to read (``speed`` of a virtual or down link answers EINVAL) is left out, so the
fixture reads it as missing. MAC and GUID files are not copied.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

NET_FILES = ("operstate", "speed", "type", "carrier_changes", "mtu")
IB_PORT_FILES = ("state", "phys_state", "rate", "link_layer")


def _copy(src: Path, dst: Path) -> None:
    try:
        data = src.read_bytes()
    except OSError:
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)


def _copy_dir(src: Path, dst: Path) -> None:
    if src.is_dir():
        for entry in sorted(src.iterdir()):
            if entry.is_file():
                _copy(entry, dst / entry.name)


def _device_link(root: Path, out: Path, entry: Path) -> None:
    """Rebuild ``entry/device`` as a symlink into ``out/devices/...`` with the numa_node files."""
    link = entry / "device"
    if not link.exists():
        return
    real = Path(os.path.realpath(link)).relative_to(os.path.realpath(root))
    target = out / real
    target.mkdir(parents=True, exist_ok=True)
    walk = Path(os.path.realpath(root))
    for part in real.parts:
        walk = walk / part
        _copy(walk / "numa_node", out / walk.relative_to(os.path.realpath(root)) / "numa_node")
    rel_entry = out / entry.relative_to(root)
    rel_entry.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, rel_entry), rel_entry / "device")


def record(root: Path, out: Path) -> None:
    net = root / "class/net"
    for iface in sorted(net.iterdir()) if net.is_dir() else []:
        dst = out / "class/net" / iface.name
        dst.mkdir(parents=True, exist_ok=True)
        for name in NET_FILES:
            _copy(iface / name, dst / name)
        _copy_dir(iface / "statistics", dst / "statistics")
        _device_link(root, out, iface)
    ib = root / "class/infiniband"
    for hca in sorted(ib.iterdir()) if ib.is_dir() else []:
        _device_link(root, out, hca)
        for port in sorted((hca / "ports").iterdir()):
            dst = out / "class/infiniband" / hca.name / "ports" / port.name
            for name in IB_PORT_FILES:
                _copy(port / name, dst / name)
            _copy_dir(port / "counters", dst / "counters")
            _copy_dir(port / "hw_counters", dst / "hw_counters")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--root", type=Path, default=Path("/sys"))
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    record(args.root, args.out)


if __name__ == "__main__":
    main()
