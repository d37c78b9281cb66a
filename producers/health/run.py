"""One health run: all checks for a phase, combined into a HealthCheckResult dict and exit code.

Choices (documented for operators):

* Status of the run = the worst check (CRITICAL > UNKNOWN > WARNING > OK); exit code = its Nagios
  code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN). Slurm drains a node whose prolog or epilog exits
  non-zero, so a WARNING there drains too: the CLI decides whether to map WARNING to 0 for Slurm.
* NVML unreachable (no library, driver not loaded) is CRITICAL in every phase when GPUs are
  expected: a GPU node without NVML cannot run GPU jobs. With ``expected_gpus == 0`` (a CPU node)
  the GPU checks are skipped and that is OK.
* ``dcgmi diag`` runs only in the phases listed in ``dcgm_phases`` (default: epilog only, because
  it takes the GPUs for minutes) and only when the binary is on PATH; absent binary is OK
  ("skipped"), not UNKNOWN, so nodes without DCGM are not flagged. A ``dcgmi`` that is there but
  cannot run (nv-hostengine down, timeout) is ``dcgm_unavailable_status``: WARNING by default, so
  a monitor's own broken tool does not drain every node it runs on at each epilog; UNKNOWN or
  CRITICAL for sites that want such nodes drained.
* A check that raises unexpectedly becomes UNKNOWN for that check; the run itself never raises.
"""

from __future__ import annotations

import json
import logging
import shutil
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml

from peerwatch.clock import Clock, SystemClock
from peerwatch.producers.health.checks import (
    check_ecc,
    check_gpu_count,
    check_pcie_width,
    check_remap,
    check_xids,
)
from peerwatch.producers.health.dcgm import (
    DEFAULT_UNAVAILABLE_STATUS,
    Runner,
    Which,
    check_dcgm_diag,
    subprocess_runner,
)
from peerwatch.producers.health.infiniband import (
    DEFAULT_SYSFS_ROOT,
    IbThresholds,
    check_ib_counters,
    check_ib_ports,
)
from peerwatch.producers.health.outcome import CRITICAL, EXIT_CODES, OK, UNKNOWN, outcome, worst
from peerwatch.producers.nvml.device import NvmlApi, NvmlUnavailableError, init_nvml, load_nvml

log = logging.getLogger(__name__)

PHASES: tuple[str, ...] = ("PROLOG", "EPILOG", "PERIODIC")


@dataclass(frozen=True)
class HealthSettings:
    """Settings of a health run. ``expected_gpus`` None accepts any count."""

    expected_gpus: int | None = None
    ib_sysfs_root: Path = DEFAULT_SYSFS_ROOT
    ib_ignore_ports: frozenset[str] = frozenset()
    ib_state: Path | None = None  # the IB counters of the previous run; None: no rates
    ib_thresholds: IbThresholds = field(default_factory=IbThresholds)
    ib_expected_rate_gbps: float | None = None  # None: the highest rate seen in earlier runs
    dcgm_level: int = 1
    dcgm_phases: frozenset[str] = frozenset({"EPILOG"})
    dcgm_timeout_s: float = 900.0
    dcgm_unavailable_status: str = DEFAULT_UNAVAILABLE_STATUS


@dataclass
class HealthDeps:
    """The outside world of a health run, injectable for tests."""

    nvml: NvmlApi | None = None  # None: the real pynvml module
    runner: Runner = subprocess_runner
    which: Which = shutil.which
    clock: Clock = field(default_factory=SystemClock)
    new_id: Callable[[], str] = lambda: uuid.uuid4().hex


def read_xid_events(path: Path, since_ms: int = 0) -> list[dict[str, Any]]:
    """XidEvent dicts from a JSON-lines state file with ``ts_ms >= since_ms``.

    A missing file means no events; malformed lines are skipped with a warning.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    events = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
            if int(event["ts_ms"]) >= since_ms:
                events.append(event)
        except (ValueError, KeyError, TypeError):
            log.warning("%s:%d: not an XID event, skipped", path, number)
    return events


def append_xid_event(path: Path, event: dict[str, Any]) -> None:
    """Append one XidEvent dict to the JSON-lines state file (the agent's side)."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(event, sort_keys=True) + "\n")


def _guard(name: str, check: Callable[[], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    try:
        return check()
    except Exception as exc:
        log.exception("health check %s crashed", name)
        return [outcome(name, UNKNOWN, f"check crashed: {type(exc).__name__}: {exc}")]


def _gpu_checks(
    nvml: NvmlApi, settings: HealthSettings, xids: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    if settings.expected_gpus == 0:
        return [outcome("gpu_count", OK, "no GPUs expected; GPU checks skipped")]
    try:
        init_nvml(nvml)
    except NvmlUnavailableError as exc:
        return [outcome("nvml", CRITICAL, f"NVML unreachable: {exc}")]
    try:
        results: list[dict[str, Any]] = [outcome("nvml", OK, "NVML reachable")]
        count_results, handles = check_gpu_count(nvml, settings.expected_gpus)
        results += count_results
        results += _guard("ecc_uncorrected", lambda: check_ecc(nvml, handles))
        results += _guard("remap", lambda: check_remap(nvml, handles))
        results += _guard("pcie_width", lambda: check_pcie_width(nvml, handles))
        results += _guard("xid", lambda: check_xids(xids))
        return results
    finally:
        try:
            nvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)


def run_health(
    phase: str,
    *,
    node: str,
    settings: HealthSettings | None = None,
    xids: Sequence[dict[str, Any]] = (),
    job_id: str | None = None,
    deps: HealthDeps | None = None,
) -> tuple[dict[str, Any], int]:
    """Run every check for ``phase`` (PROLOG, EPILOG or PERIODIC, case-insensitive).

    ``xids`` are the XidEvent dicts seen since the last check (see ``read_xid_events``).
    Returns the io.peerwatch.HealthCheckResult dict and the Nagios exit code. Never raises for
    check failures; raises ValueError for an unknown phase.
    """
    phase = phase.upper()
    if phase not in PHASES:
        raise ValueError(f"unknown health phase {phase!r}; expected one of {PHASES}")
    settings = settings or HealthSettings()
    deps = deps or HealthDeps()
    nvml = deps.nvml if deps.nvml is not None else load_nvml()
    start_ms = deps.clock.now_ms()

    checks = _guard("nvml", lambda: _gpu_checks(nvml, settings, xids))
    checks += _guard(
        "ib_port", lambda: check_ib_ports(settings.ib_sysfs_root, settings.ib_ignore_ports)
    )
    checks += _guard(
        "ib_errors",
        lambda: check_ib_counters(
            settings.ib_sysfs_root,
            state_path=settings.ib_state,
            now_ms=start_ms,
            thresholds=settings.ib_thresholds,
            expected_rate_gbps=settings.ib_expected_rate_gbps,
            ignore=settings.ib_ignore_ports,
        ),
    )
    if phase in settings.dcgm_phases:
        if deps.which("dcgmi") is None:
            checks.append(outcome("dcgm_diag", OK, "dcgmi not on PATH; skipped"))
        else:
            checks += _guard(
                "dcgm_diag",
                lambda: check_dcgm_diag(
                    deps.runner,
                    settings.dcgm_level,
                    timeout_s=settings.dcgm_timeout_s,
                    unavailable_status=settings.dcgm_unavailable_status,
                ),
            )

    status = worst([c["status"] for c in checks])
    end_ms = deps.clock.now_ms()
    result = {
        "event_id": deps.new_id(),
        "node": node,
        "ts_ms": end_ms,
        "phase": phase,
        "job_id": job_id,
        "status": status,
        "exit_code": EXIT_CODES[status],
        "checks": checks,
        "duration_ms": max(0, end_ms - start_ms),
    }
    return result, EXIT_CODES[status]
