"""What ``peerwatch health`` adds around ``health.run.run_health`` for Slurm and systemd.

Choices (documented for operators):

* Exit code. Slurm drains a node whose prolog or epilog exits non-zero. A WARNING (e.g. more GPUs
  than configured, a transient NVML error) should not take a node out of service, so in the
  PROLOG and EPILOG phases WARNING exits 0 by default; PERIODIC keeps the Nagios code 1.
  ``--warn-exit-code`` overrides both. CRITICAL (2) and UNKNOWN (3) always exit non-zero. The
  published record's ``exit_code`` is the code actually returned.
* XIDs since the last check. The agent appends every XID to a JSON-lines state file; each health
  run reads the events newer than its cursor (``<state>.cursor`` for prolog and epilog, which
  share it so an XID drains the node once, not again after an operator resumes it;
  ``<state>.periodic.cursor`` for periodic runs, which only publish) and then advances it. Keep
  the state file on tmpfs (``/run/peerwatch``): a reboot resets the GPUs and clears it.
* Kafka never holds up a job start: the result is handed to ``Delivery`` with a message timeout
  and close timeout inside ``kafka_timeout_s``, and the close itself is abandoned after that
  bound (what is not delivered by then is in the spool, replayed by the next run).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerwatch.files import write_atomic
from peerwatch.producers.delivery import Delivery, DeliveryStats
from peerwatch.producers.health.outcome import EXIT_CODES, WARNING
from peerwatch.producers.health.run import read_xid_events

log = logging.getLogger(__name__)

SLURM_PHASES = frozenset({"PROLOG", "EPILOG"})


def short_hostname() -> str:
    """This host's name up to the first dot (what Slurm calls the node by default)."""
    return socket.gethostname().split(".", 1)[0]


@dataclass(frozen=True)
class SlurmContext:
    node: str
    job_id: str | None


def slurm_context(phase: str, env: Mapping[str, str], node: str | None = None) -> SlurmContext:
    """Node and job of a health run: ``node`` if given, else ``SLURMD_NODENAME``, else the short
    hostname; the job id from ``SLURM_JOB_ID`` in the prolog/epilog phases only."""
    phase = phase.upper()
    name = node or env.get("SLURMD_NODENAME") or short_hostname()
    job_id = env.get("SLURM_JOB_ID") if phase in SLURM_PHASES else None
    return SlurmContext(node=name, job_id=job_id or None)


def exit_code_for(status: str, phase: str, warn_exit_code: int | None = None) -> int:
    """The process exit code for a run's worst ``status`` (see the module docstring)."""
    if status == WARNING:
        if warn_exit_code is not None:
            return warn_exit_code
        return 0 if phase.upper() in SLURM_PHASES else EXIT_CODES[WARNING]
    return EXIT_CODES[status]


def cursor_path(state: Path, phase: str) -> Path:
    """Where the XID cursor of ``phase`` lives next to the state file."""
    suffix = ".cursor" if phase.upper() in SLURM_PHASES else ".periodic.cursor"
    return state.with_name(state.name + suffix)


def read_cursor(path: Path) -> int:
    """The last XID time (ms) a previous run judged; 0 when there is none or it is unreadable."""
    try:
        return int(path.read_text().strip() or 0)
    except FileNotFoundError:
        return 0
    except (OSError, ValueError) as exc:
        log.warning("XID cursor %s unreadable (%s); considering every event", path, exc)
        return 0


def new_xid_events(state: Path, phase: str) -> tuple[list[dict[str, Any]], int]:
    """XidEvent dicts newer than ``phase``'s cursor, and the cursor value to save afterwards."""
    since_ms = read_cursor(cursor_path(state, phase))
    events = read_xid_events(state, since_ms=since_ms + 1)
    newest = max((int(e["ts_ms"]) for e in events), default=since_ms)
    return events, newest


def save_cursor(state: Path, phase: str, ts_ms: int) -> None:
    """Advance ``phase``'s cursor (atomically). Failures are logged: the next run then sees the
    same events again, which errs on the side of reporting."""
    path = cursor_path(state, phase)
    try:
        write_atomic(path, f"{ts_ms}\n".encode(), durable=False)
    except OSError as exc:
        log.warning("cannot save XID cursor %s: %s", path, exc)


def close_bounded(delivery: Delivery, timeout_s: float) -> DeliveryStats | None:
    """Close ``delivery`` within about ``timeout_s`` seconds: librdkafka gets all but 1.5 s of it
    to flush (what it cannot deliver is purged into the spool), and the close is abandoned
    after ``timeout_s + 1``. Returns the stats, or None when the close did not finish in time."""
    done: list[DeliveryStats] = []

    def close() -> None:
        done.append(delivery.close(timeout_s=max(0.5, timeout_s - 1.5)))

    thread = threading.Thread(target=close, name="peerwatch-health-close", daemon=True)
    thread.start()
    thread.join(timeout_s + 1.0)
    if not done:
        log.error("Kafka delivery did not close within %.1f s; result may be lost", timeout_s)
        return None
    return done[0]


def publish_outcome(stats: DeliveryStats | None, spool_left: int) -> str:
    """ "delivered", "spooled" or "unknown" for a one-record health delivery that ended with
    ``spool_left`` records in the spool. The spool replays oldest first, so while it holds any
    record this run's (the newest) is among them; with the spool empty, this run's record was
    delivered, directly or replayed at close, unless a record was refused or dropped."""
    if stats is None:
        return "unknown"
    if spool_left:
        return "spooled"
    if stats.refused or stats.dropped or not stats.delivered:
        return "unknown"
    return "delivered"


def summary_line(result: Mapping[str, Any], exit_code: int, published: str) -> str:
    """One Nagios-style line: ``PEERWATCH PROLOG CRITICAL - ecc_uncorrected: ...; ... | ...``."""
    bad = [c for c in result["checks"] if c["status"] != "OK"]
    parts = []
    for c in bad:
        where = "" if c["gpu_index"] is None else f"[gpu{c['gpu_index']}]"
        parts.append(f"{c['name']}{where}: {c['message']}")
    detail = "; ".join(parts) or f"{len(result['checks'])} checks passed"
    return (
        f"PEERWATCH {result['phase']} {result['status']} - {detail} | node={result['node']} "
        f"job={result['job_id'] or '-'} exit={exit_code} duration_ms={result['duration_ms']} "
        f"published={published}"
    )
