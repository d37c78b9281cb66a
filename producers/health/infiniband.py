"""InfiniBand port state from sysfs: ``<root>/<hca>/ports/<n>/state`` and ``phys_state``.

The kernel writes ``state`` as e.g. ``4: ACTIVE`` and ``phys_state`` as e.g. ``5: LinkUp``.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from peerwatch.producers.health.outcome import CRITICAL, OK, UNKNOWN, outcome

DEFAULT_SYSFS_ROOT = Path("/sys/class/infiniband")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _words(value: str) -> str:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; a value without the numeric prefix is kept as it is."""
    return value.split(":", 1)[1].strip() if ":" in value else value


def check_ib_ports(
    root: Path = DEFAULT_SYSFS_ROOT, ignore: Collection[str] = ()
) -> list[dict[str, Any]]:
    """One outcome per port: ACTIVE and LinkUp is OK, anything else CRITICAL (the node cannot
    take part in multi-node jobs). ``ignore`` holds ``"<hca>/<port>"`` names (e.g. an unused
    port). No ``root`` or no HCA: a single OK ("no InfiniBand"), since CPU-only or Ethernet-only
    nodes are legitimate; an unreadable state file is UNKNOWN."""
    if not root.is_dir():
        return [outcome("ib_port", OK, f"no InfiniBand devices ({root} absent)")]
    results: list[dict[str, Any]] = []
    for hca in sorted(p for p in root.iterdir() if (p / "ports").is_dir()):
        for port in sorted((hca / "ports").iterdir(), key=lambda p: (len(p.name), p.name)):
            name = f"{hca.name}/{port.name}"
            if name in ignore:
                continue
            state, phys = _read(port / "state"), _read(port / "phys_state")
            if state is None or phys is None:
                results.append(outcome("ib_port", UNKNOWN, f"{name}: state unreadable"))
                continue
            state_w, phys_w = _words(state), _words(phys)
            if state_w.upper() == "ACTIVE" and phys_w.lower() == "linkup":
                results.append(outcome("ib_port", OK, f"{name}: {state_w}, {phys_w}"))
            else:
                results.append(outcome("ib_port", CRITICAL, f"{name}: {state_w}, {phys_w}"))
    if not results:
        return [outcome("ib_port", OK, f"no InfiniBand ports under {root}")]
    return results
