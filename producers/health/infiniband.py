"""InfiniBand ports from sysfs (``<root>`` is ``/sys/class/infiniband``): their state, and their
counters as rates between two runs.

The kernel writes ``state`` as e.g. ``4: ACTIVE`` and ``phys_state`` as e.g. ``5: LinkUp``.
Counters are read through ``peerwatch.producers.nic`` (the agent's reader: hostile files give
null) and judged with its counter arithmetic; the previous run's readings are kept in a small
JSON state file, as the XID cursor is (``--ib-state``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerwatch.files import write_atomic
from peerwatch.producers.health.outcome import CRITICAL, OK, UNKNOWN, WARNING, outcome
from peerwatch.producers.nic.counters import counter_delta, saturation_value
from peerwatch.producers.nic.ports import ib_ports
from peerwatch.producers.nic.sampler import hw_counter_names, read_port
from peerwatch.producers.nic.sysfs import Reader, SysfsTree

log = logging.getLogger(__name__)

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


# -- counters between runs -------------------------------------------------------------------

#: Counters whose every rise between two runs is CRITICAL (a link that went down, lost its
#: integrity, overran its buffers, or a queue pair that ran out of RNR retries).
RISE_CRITICAL: tuple[str, ...] = (
    "link_downed",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "rnr_nak_retry_err",
)
STATE_VERSION = 1


@dataclass(frozen=True)
class IbThresholds:
    """Error-rate limits between two runs (NVSentinel's documented defaults). A rate above one
    is CRITICAL. Totals since boot are never judged: on PAM4 links (HDR, NDR) raw bit errors are
    normal, only their rate says anything."""

    symbol_error_per_s: float = 10.0
    link_error_recovery_per_min: float = 5.0
    port_rcv_errors_per_s: float = 10.0
    local_ack_timeout_err_per_s: float = 1.0
    port_xmit_discards_per_s: float = 100.0
    roce_slow_restart_per_s: float = 10.0

    def limits(self) -> dict[str, tuple[float, float, str]]:
        """counter -> (limit, seconds per unit, unit) for the rate checks."""
        return {
            "symbol_error": (self.symbol_error_per_s, 1.0, "/s"),
            "link_error_recovery": (self.link_error_recovery_per_min, 60.0, "/min"),
            "port_rcv_errors": (self.port_rcv_errors_per_s, 1.0, "/s"),
            "local_ack_timeout_err": (self.local_ack_timeout_err_per_s, 1.0, "/s"),
            "port_xmit_discards": (self.port_xmit_discards_per_s, 1.0, "/s"),
            "roce_slow_restart": (self.roce_slow_restart_per_s, 1.0, "/s"),
        }


def load_ib_state(path: Path) -> dict[str, Any]:
    """The previous run's readings ``{"ts_ms": int, "ports": {name: {...}}}``; an empty state
    when the file is missing or not what this module writes (logged: the run then takes a new
    baseline instead of judging garbage)."""
    try:
        state: Any = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("IB counter state %s unreadable (%s); taking a new baseline", path, exc)
        return {}
    ok = (
        isinstance(state, dict)
        and state.get("version") == STATE_VERSION
        and isinstance(state.get("ts_ms"), int)
        and isinstance(state.get("ports"), dict)
    )
    if not ok:
        log.warning("IB counter state %s is not a state file; taking a new baseline", path)
        return {}
    return {"ts_ms": state["ts_ms"], "ports": state["ports"]}


def _values(entry: Any, key: str) -> dict[str, int | None]:
    raw = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(raw, dict):
        return {}
    return {k: v if isinstance(v, int) and not isinstance(v, bool) else None
            for k, v in raw.items()}  # fmt: skip


def _judge_port(
    name: str,
    reading: dict[str, Any],
    before: Any,
    elapsed_s: float,
    thresholds: IbThresholds,
) -> dict[str, Any]:
    if before is None:
        return outcome("ib_errors", OK, f"{name}: baseline recorded; rates from the next run")
    now = {**reading["counters"], **reading["hw_counters"]}
    prev = {**_values(before, "counters"), **_values(before, "hw_counters")}
    critical: list[str] = []
    notes: list[str] = []
    limits = thresholds.limits()
    for counter, value in now.items():
        d = counter_delta(counter, prev.get(counter), value, elapsed_s)
        if d.reset:
            notes.append(f"{counter} reset")
            continue
        top = saturation_value(counter)
        rose = d.delta is not None and d.delta > 0
        if d.saturated:
            p = prev.get(counter)
            rose = p is not None and top is not None and p < top
            notes.append(f"{counter} saturated")
        if counter in RISE_CRITICAL and rose:
            how = f"by {d.delta}" if d.delta is not None else f"to its maximum {top}"
            critical.append(f"{counter} rose {how}")
        if counter in limits and d.rate_per_s is not None:
            limit, per, unit = limits[counter]
            rate = d.rate_per_s * per
            if rate > limit:
                critical.append(f"{counter} {rate:.3g}{unit} > {limit:g}{unit}")
    span = f"over {elapsed_s:.0f} s"
    if critical:
        return outcome("ib_errors", CRITICAL, f"{name}: " + "; ".join(critical) + f" ({span})")
    extra = f" ({', '.join(notes)})" if notes else ""
    return outcome("ib_errors", OK, f"{name}: error rates within limits {span}{extra}")


def _judge_rate(name: str, rate: float | None, expected: float | None) -> dict[str, Any] | None:
    if rate is None or expected is None:
        return None
    if rate < expected:
        msg = f"{name}: link at {rate:g} Gb/s, below its expected {expected:g} Gb/s"
        return outcome("ib_rate", WARNING, msg)
    return outcome("ib_rate", OK, f"{name}: link at {rate:g} Gb/s")


def check_ib_counters(
    root: Path = DEFAULT_SYSFS_ROOT,
    *,
    state_path: Path | None,
    now_ms: int,
    thresholds: IbThresholds = IbThresholds(),
    expected_rate_gbps: float | None = None,
    ignore: Collection[str] = (),
) -> list[dict[str, Any]]:
    """The IB ports' counters as rates since the previous run, and their link rate.

    ``state_path`` keeps each port's readings between runs (written atomically after the
    checks; None: no comparison at all). Per port: ``ib_errors`` CRITICAL on any rise of a
    ``RISE_CRITICAL`` counter or an error rate above ``thresholds``; a counter that went down
    (reset, reboot, ``perfquery -x``) restarts its baseline; a saturated counter gives no rate.
    ``ib_rate`` WARNING when the link runs below ``expected_rate_gbps`` (None: the highest rate
    this port has reported in earlier runs). A port that is not ACTIVE is left to
    ``check_ib_ports``. Never raises for sysfs or state-file trouble.
    """
    if not root.is_dir():
        return []
    reader = Reader(SysfsTree(root))
    ports = [p for p in ib_ports(reader, "") if p.name not in ignore]
    readings = {p.name: read_port(reader, p, hw_counter_names(reader, p)) for p in ports}
    state = load_ib_state(state_path) if state_path is not None else {}
    before_ports = state.get("ports", {})
    elapsed_s = (now_ms - state["ts_ms"]) / 1000 if state else 0.0
    results: list[dict[str, Any]] = []
    new_ports: dict[str, Any] = {}
    for name, reading in readings.items():
        before = before_ports.get(name) if isinstance(before_ports.get(name), dict) else None
        seen = before.get("max_rate_gbps") if before else None
        seen = float(seen) if isinstance(seen, int | float) and not isinstance(seen, bool) else None
        rate = reading["rate_gbps"]
        expected = expected_rate_gbps if expected_rate_gbps is not None else seen
        if reading["up"]:
            judged = _judge_rate(name, rate, expected)
            if judged is not None:
                results.append(judged)
            if state_path is not None:
                usable = before if elapsed_s > 0 else None
                results.append(_judge_port(name, reading, usable, elapsed_s, thresholds))
        new_ports[name] = {
            "counters": reading["counters"],
            "hw_counters": reading["hw_counters"],
            "max_rate_gbps": max(r for r in (rate, seen) if r is not None)
            if rate is not None or seen is not None else None,
        }  # fmt: skip
    if state_path is not None:
        data = {"version": STATE_VERSION, "ts_ms": now_ms, "ports": new_ports}
        try:
            state_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(state_path, json.dumps(data, sort_keys=True).encode())
        except OSError as exc:
            results.append(outcome("ib_errors", UNKNOWN, f"IB counter state not saved: {exc}"))
    if reader.stats.total:
        log.warning("IB counters: %d values unreadable (%s)", reader.stats.total, reader.stats)
    return results
