"""JobEvents from slurmd's Prolog and Epilog environment (pure: no I/O).

``Prolog`` runs on every node of a job before it starts, ``Epilog`` after it ends, both as
root with the job described in environment variables. Each hook reports its own node only:
a STARTED (prolog) or ENDED (epilog) :class:`JobEvent` dict whose ``allocations`` hold this
node and the GPU indices the job owns here.

Where the GPU indices come from, first hit wins:

1. ``SLURM_JOB_GPUS`` (``0,1,2``: GRES indices);
2. ``CUDA_VISIBLE_DEVICES``, then ``GPU_DEVICE_ORDINAL``, when they are plain integers
   (UUIDs and MIG names say nothing about the index and are skipped);
3. the caller's ``detail_gpus``: the ``GRES=...(IDX:...)`` lines of ``scontrol show job -d``,
   parsed by :func:`parse_job_detail_gpus` (the CLI asks in the prolog and keeps the answer
   on the node for the epilog, since a finished job's detail no longer names indices). On the
   test cluster (Slurm 22.05.8, GPUs backed by plain files that slurmd rejects as devices)
   slurmd set none of the variables above for Prolog/Epilog, so there this is the only source.

Other variables read: ``SLURM_JOB_ID``, ``SLURMD_NODENAME``, ``SLURM_JOB_USER``,
``SLURM_JOB_PARTITION``, ``SLURM_JOB_ACCOUNT``, ``SLURM_JOB_NAME`` (not set by 22.05),
``SLURM_JOB_RESTART_COUNT`` (or ``SLURM_RESTART_COUNT``), and in the epilog
``SLURM_JOB_EXIT_CODE2`` (``3:0``, return code and signal) or ``SLURM_JOB_EXIT_CODE`` (the raw
``wait()`` status, ``768`` = exit 3).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from peerwatch.producers.slurm import gres, hostlist
from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.event_ids import event_id
from peerwatch.schemas.records import EventSource, JobEvent, JobEventKind

__all__ = [
    "HOOKS",
    "gpu_indices_from_env",
    "hook_event",
    "parse_job_detail_gpus",
]

#: hook name -> (JobEvent kind, EventSource)
HOOKS: dict[str, tuple[JobEventKind, EventSource]] = {
    "prolog": ("STARTED", "PROLOG"),
    "epilog": ("ENDED", "EPILOG"),
}

_GPU_ENV_VARS = ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
_INDEX_LIST = re.compile(r"^\d+(,\d+)*$")
# One node block of `scontrol show job -d` (plain or -o): "Nodes=gpu[01-02] CPU_IDs=0-3 Mem=0
# GRES=gpu:h100:2(IDX:0-1)". "NumNodes=" does not match: no word boundary inside it.
_DETAIL = re.compile(r"\bNodes=(\S+)\s+CPU_IDs=\S*\s+Mem=\S*\s+GRES=(\S*)")


def gpu_indices_from_env(env: Mapping[str, str]) -> tuple[tuple[int, ...], str] | None:
    """(indices, variable name) from the first GPU variable holding plain indices, else None.

    ``NoDevFiles`` (Slurm's value when a job has no GPU devices) gives ``()``."""
    for var in _GPU_ENV_VARS:
        value = env.get(var, "").strip().replace(" ", "")
        if not value:
            continue
        if value == "NoDevFiles":
            return (), var
        if _INDEX_LIST.match(value) and all(len(i) <= 5 for i in value.split(",")):
            indices = tuple(int(i) for i in value.split(","))
            if max(indices) <= gres.MAX_INDEX:  # else not indices a record can hold: next one
                return indices, var
    return None


def parse_job_detail_gpus(text: str) -> dict[str, tuple[int, ...]]:
    """Node -> GPU indices from ``scontrol show job -d`` output (``-o`` or multi-line).

    Nodes whose GRES names no GPU index are left out. Raises SlurmParseError for a node
    expression or GRES string it cannot read."""
    out: dict[str, tuple[int, ...]] = {}
    for nodes_expr, gres_text in _DETAIL.findall(text):
        indices = gres.gpu_indices(gres_text)
        if not indices:
            continue
        for node in hostlist.expand(nodes_expr):
            out[node] = out.get(node, ()) + indices
    return out


def _int(value: str | None) -> int | None:
    """An environment variable's int; None when unset, not a number or beyond a 32-bit int (no
    record field holds it: the rest of the event is still published)."""
    if value is None:
        return None
    value = value.strip()
    if not value.lstrip("-").isdigit() or len(value) > 11:
        return None
    number = int(value)
    return number if -(1 << 31) <= number < 1 << 31 else None


def _exit_code(env: Mapping[str, str]) -> int | None:
    """The job's return code; None when it was killed by a signal or the variables are absent."""
    pair = env.get("SLURM_JOB_EXIT_CODE2", "")
    code_text, sep, signal_text = pair.partition(":")
    code, signal = _int(code_text), _int(signal_text)
    if sep and code is not None and signal is not None:
        return None if signal else code
    raw = _int(env.get("SLURM_JOB_EXIT_CODE"))
    if raw is None or raw < 0:
        return None
    return None if raw & 0x7F else (raw >> 8) & 0xFF


def hook_event(
    hook: str,
    env: Mapping[str, str],
    now_ms: int,
    *,
    node: str | None = None,
    detail_gpus: Mapping[str, tuple[int, ...]] | None = None,
) -> JobEvent:
    """The JobEvent a ``prolog`` or ``epilog`` hook publishes for its node.

    ``now_ms`` (ms since the epoch) is the event time; ``node`` is used when
    ``SLURMD_NODENAME`` is unset. The event id hashes job, kind, source, node and restart
    count, so a hook re-run for the same job and node repeats it. Raises SlurmParseError when
    ``hook`` is unknown or the environment names no job or node."""
    if hook not in HOOKS:
        raise SlurmParseError(f"unknown hook {hook!r}: expected one of {sorted(HOOKS)}")
    kind, source = HOOKS[hook]
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise SlurmParseError(f"{hook}: SLURM_JOB_ID is not set (not run by slurmd?)")
    this_node = env.get("SLURMD_NODENAME") or node
    if not this_node:
        raise SlurmParseError(f"{hook}: SLURMD_NODENAME is not set and no node was given")
    found = gpu_indices_from_env(env)
    indices = found[0] if found is not None else tuple((detail_gpus or {}).get(this_node, ()))
    restarts = _int(env.get("SLURM_JOB_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT"))
    return {
        "event_id": event_id("hook", job_id, kind, source, this_node, restarts),
        "job_id": job_id,
        "kind": kind,
        "ts_ms": now_ms,
        "source": source,
        "state": "RUNNING" if kind == "STARTED" else None,
        "exit_code": _exit_code(env) if kind == "ENDED" else None,
        "user": env.get("SLURM_JOB_USER") or None,
        "partition": env.get("SLURM_JOB_PARTITION") or None,
        "account": env.get("SLURM_JOB_ACCOUNT") or None,
        "job_name": env.get("SLURM_JOB_NAME") or None,
        "allocations": [{"node": this_node, "gpu_indices": list(indices)}],
        "start_ms": now_ms if kind == "STARTED" else None,
        "end_ms": now_ms if kind == "ENDED" else None,
        "restart_count": restarts,
    }
