"""Typed records from the JSON of ``squeue --json``, ``sacct --json`` and ``sinfo --json``.

Supported: Slurm 22.05 (data_parser v0.0.38) through 25.x (v0.0.40 ... v0.0.44). The shapes
that differ between versions are normalised here:

* states: ``"RUNNING"`` (22.05) or ``["RUNNING", "COMPLETING"]`` (newer) -> main state + flags;
  node states ``"idle"`` + ``state_flags: ["DRAIN"]`` (22.05) or ``["IDLE", "DRAIN"]``;
* times: seconds as an int (0 = unset) or ``{"set", "infinite", "number"}`` -> int ms or None;
* exit codes: the raw wait status as an int (``squeue`` 22.05: 768 = exit 3) or
  ``{"status", "return_code", "signal"}`` with plain or ``{"set", ...}`` numbers;
* allocated nodes: the ``nodes`` hostlist, ``job_resources.allocated_nodes[].nodename``
  (<= v0.0.40) or ``job_resources.nodes.allocation[].name`` (>= v0.0.41).

Every function raises :class:`SlurmParseError` (a ``ValueError``) for input it cannot read,
naming the job or node and the field, never a bare ``KeyError`` or ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from peerwatch.producers.slurm import gres, hostlist
from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.fields import Ctx, exit_status, number, short, split_state, ts_ms

__all__ = [
    "JOB_BASE_STATES",
    "NODE_BASE_STATES",
    "Skipped",
    "SlurmJob",
    "SlurmNode",
    "data_parser_version",
    "parse_sacct",
    "parse_sacct_job",
    "parse_sacct_jobs",
    "parse_sinfo",
    "parse_sinfo_node",
    "parse_sinfo_nodes",
    "parse_squeue",
    "parse_squeue_job",
    "parse_squeue_jobs",
]

JOB_BASE_STATES = frozenset(
    [
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    ]
)
NODE_BASE_STATES = frozenset(["UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE"])

# A job in these states has no exit code yet, whatever the number in the JSON says.
_UNFINISHED = frozenset({"PENDING", "RUNNING", "SUSPENDED"})


@dataclass(frozen=True)
class SlurmJob:
    """A job (or one array task / het component) as squeue or sacct reports it.

    ``job_id`` is a string: ``"123"``, ``"123_4"`` (array task), ``"123_[5-7]"`` (pending
    array tasks), ``"123+1"`` (het component). Times are int ms since the epoch, None when
    unset. ``exit_code`` is the process return code (None when killed by a signal or not
    known, and always for PENDING/RUNNING/SUSPENDED jobs); ``exit_signal`` the signal number.
    For running jobs ``end_ts_ms`` is Slurm's expected end (start + time limit). ``gpu_indices`` maps each allocated node to
    the GPU indices the job owns there (squeue only; sacct does not record them);
    ``gpu_count`` is the total, from those indices or from sacct's TRES.
    """

    job_id: str
    state: str
    state_flags: tuple[str, ...]
    user: str | None
    partition: str | None
    account: str | None
    name: str | None
    submit_ts_ms: int | None
    start_ts_ms: int | None
    end_ts_ms: int | None
    exit_code: int | None
    exit_signal: int | None
    nodes: tuple[str, ...]
    gpu_indices: dict[str, tuple[int, ...]] = field(default_factory=dict)
    gpu_count: int | None = None


@dataclass(frozen=True)
class SlurmNode:
    """A node as sinfo reports it. ``reason_changed_ts_ms`` is int ms, None when unset."""

    name: str
    state: str
    state_flags: tuple[str, ...]
    reason: str | None
    reason_set_by_user: str | None
    reason_changed_ts_ms: int | None
    partitions: tuple[str, ...]
    gres: str | None = None
    gres_used: str | None = None


def _array_suffix_from_bitmap(task: str) -> str:
    """sacct shows pending array tasks as a hex bitmap (``0x7`` = tasks 0-2)."""
    if task.lower().startswith("0x"):
        try:
            bits = int(task, 16)
        except ValueError:
            return task
        ids = [i for i in range(bits.bit_length()) if bits >> i & 1]
        if not ids:
            return task
        ranges = hostlist.compress(str(i) for i in ids)
        return ranges[1:-1] if ranges.startswith("[") else ranges
    return task


def _job_id(job: Mapping[str, Any], ctx: Ctx, *, sacct: bool) -> str:
    job_id = number(ctx.require(job, "job_id", (int, Mapping)), ctx, "job_id")
    if job_id is None:
        raise ctx.fail("job_id", "unset")
    if sacct:
        array = ctx.get(job, "array", (Mapping,)) or {}
        array_id = number(array.get("job_id"), ctx, "array.job_id") or 0
        task_id = number(array.get("task_id"), ctx, "array.task_id")
        task_string = array.get("task") if isinstance(array.get("task"), str) else ""
        het = ctx.get(job, "het", (Mapping,)) or {}
        het_id = number(het.get("job_id"), ctx, "het.job_id") or 0
        het_offset = number(het.get("job_offset"), ctx, "het.job_offset")
    else:
        array_id = number(job.get("array_job_id"), ctx, "array_job_id") or 0
        task_id = number(job.get("array_task_id"), ctx, "array_task_id")
        task_string = ctx.get(job, "array_task_string", (str,)) or ""
        het_id = number(job.get("het_job_id"), ctx, "het_job_id") or 0
        het_offset = number(job.get("het_job_offset"), ctx, "het_job_offset")
    if array_id:
        if task_string:
            return f"{array_id}_[{_array_suffix_from_bitmap(task_string)}]"
        if task_id is not None:
            return f"{array_id}_{task_id}"
    if het_id and het_offset is not None:
        return f"{het_id}+{het_offset}"
    return str(job_id)


def _allocated_nodes(job: Mapping[str, Any], ctx: Ctx) -> tuple[str, ...]:
    resources = ctx.get(job, "job_resources", (Mapping,)) or {}
    nodes_field = resources.get("nodes")
    if isinstance(nodes_field, Mapping):  # >= v0.0.41
        allocation = nodes_field.get("allocation")
        if isinstance(allocation, Sequence) and allocation:
            entries = sorted(
                (e for e in allocation if isinstance(e, Mapping)),
                key=lambda e: e["index"] if isinstance(e.get("index"), int) else 0,
            )
            names = [e.get("name") for e in entries]
            if all(isinstance(n, str) and n for n in names):
                return tuple(names)  # type: ignore[arg-type]
            raise ctx.fail("job_resources.nodes.allocation", "entry without a name")
        if isinstance(nodes_field.get("list"), str) and nodes_field["list"]:
            return tuple(hostlist.expand(nodes_field["list"]))
    allocated = resources.get("allocated_nodes")
    if isinstance(allocated, Sequence) and allocated:  # <= v0.0.40
        names = [e.get("nodename") if isinstance(e, Mapping) else None for e in allocated]
        if all(isinstance(n, str) and n for n in names):
            return tuple(names)  # type: ignore[arg-type]
        raise ctx.fail("job_resources.allocated_nodes", "entry without a nodename")
    node_text = ctx.get(job, "nodes", (str,)) or ""
    try:
        return tuple(hostlist.expand(node_text))
    except SlurmParseError as exc:
        raise ctx.fail("nodes", str(exc)) from exc


def _gpu_map(
    job: Mapping[str, Any], nodes: tuple[str, ...], ctx: Ctx
) -> dict[str, tuple[int, ...]]:
    detail = ctx.get(job, "gres_detail", (list, tuple)) or []
    if not detail:
        return {}
    if len(detail) != len(nodes):
        raise ctx.fail("gres_detail", f"{len(detail)} entries for {len(nodes)} nodes {list(nodes)}")
    out: dict[str, tuple[int, ...]] = {}
    for node, text in zip(nodes, detail, strict=True):
        if not isinstance(text, str):
            raise ctx.fail("gres_detail", f"expected strings, got {short(text)}")
        try:
            indices = gres.gpu_indices(text)
        except SlurmParseError as exc:
            raise ctx.fail("gres_detail", str(exc)) from exc
        if indices:  # "gpu(IDX:N/A)" says nothing about which GPUs
            out[node] = out.get(node, ()) + indices
    return out


def _jobs_list(doc: Any, command: str) -> list[Any]:
    if not isinstance(doc, Mapping):
        raise SlurmParseError(f"{command}: expected a JSON object, got {type(doc).__name__}")
    errors = doc.get("errors")
    if errors:
        raise SlurmParseError(f"{command}: Slurm reported errors: {short(errors)}")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list):
        raise SlurmParseError(f"{command}: expected a 'jobs' list")
    return jobs


def parse_squeue_job(job: Any) -> SlurmJob:
    """One entry of ``squeue --json``'s ``jobs``. Raises SlurmParseError."""
    if not isinstance(job, Mapping):
        raise SlurmParseError(f"squeue job: expected an object, got {type(job).__name__}")
    ctx = Ctx(f"squeue job {short(job.get('job_id'))}")
    job_id = _job_id(job, ctx, sacct=False)
    ctx.what = f"squeue job {job_id}"
    state, flags = split_state(
        ctx.require(job, "job_state", (str, list)), None, JOB_BASE_STATES, ctx, "job_state"
    )
    code, signal = exit_status(job.get("exit_code"), ctx, "exit_code")
    if state in _UNFINISHED:
        code = signal = None
    nodes = _allocated_nodes(job, ctx)
    gpus = _gpu_map(job, nodes, ctx)
    return SlurmJob(
        job_id=job_id,
        state=state,
        state_flags=flags,
        user=ctx.text(job, "user_name"),
        partition=ctx.text(job, "partition"),
        account=ctx.text(job, "account"),
        name=ctx.text(job, "name"),
        submit_ts_ms=ts_ms(job.get("submit_time"), ctx, "submit_time"),
        start_ts_ms=ts_ms(job.get("start_time"), ctx, "start_time"),
        end_ts_ms=ts_ms(job.get("end_time"), ctx, "end_time"),
        exit_code=code,
        exit_signal=signal,
        nodes=nodes,
        gpu_indices=gpus,
        gpu_count=sum(len(v) for v in gpus.values()) if gpus else None,
    )


def _tres_gpus(job: Mapping[str, Any], ctx: Ctx) -> int | None:
    tres = ctx.get(job, "tres", (Mapping,)) or {}
    allocated = tres.get("allocated")
    if not isinstance(allocated, list):
        return None
    counts = [
        t.get("count")
        for t in allocated
        if isinstance(t, Mapping) and t.get("type") == "gres" and t.get("name") == "gpu"
    ]
    return sum(c for c in counts if isinstance(c, int)) if counts else None


def parse_sacct_job(job: Any) -> SlurmJob:
    """One entry of ``sacct --json``'s ``jobs``. Raises SlurmParseError."""
    if not isinstance(job, Mapping):
        raise SlurmParseError(f"sacct job: expected an object, got {type(job).__name__}")
    ctx = Ctx(f"sacct job {short(job.get('job_id'))}")
    job_id = _job_id(job, ctx, sacct=True)
    ctx.what = f"sacct job {job_id}"
    state_obj = ctx.require(job, "state", (Mapping,))
    state, flags = split_state(
        state_obj.get("current"), None, JOB_BASE_STATES, ctx, "state.current"
    )
    times = ctx.get(job, "time", (Mapping,)) or {}
    code, signal = exit_status(job.get("exit_code"), ctx, "exit_code")
    if state in _UNFINISHED:
        code = signal = None
    node_text = ctx.get(job, "nodes", (str,)) or ""
    # sacct says "None assigned" for jobs that never ran.
    try:
        nodes = () if " " in node_text else tuple(hostlist.expand(node_text))
    except SlurmParseError as exc:
        raise ctx.fail("nodes", str(exc)) from exc
    association = ctx.get(job, "association", (Mapping,)) or {}
    return SlurmJob(
        job_id=job_id,
        state=state,
        state_flags=flags,
        user=ctx.text(job, "user") or ctx.text(association, "user"),
        partition=ctx.text(job, "partition"),
        account=ctx.text(job, "account") or ctx.text(association, "account"),
        name=ctx.text(job, "name"),
        submit_ts_ms=ts_ms(times.get("submission"), ctx, "time.submission"),
        start_ts_ms=ts_ms(times.get("start"), ctx, "time.start"),
        end_ts_ms=ts_ms(times.get("end"), ctx, "time.end"),
        exit_code=code,
        exit_signal=signal,
        nodes=nodes,
        gpu_count=_tres_gpus(job, ctx),
    )


def parse_sinfo_node(node: Any) -> SlurmNode:
    """One entry of ``sinfo --json`` / ``scontrol show nodes --json`` ``nodes``.

    Raises SlurmParseError."""
    if not isinstance(node, Mapping):
        raise SlurmParseError(f"sinfo node: expected an object, got {type(node).__name__}")
    ctx = Ctx(f"sinfo node {short(node.get('name'))}")
    name = ctx.require(node, "name", (str,))
    if not name.isprintable() or any("\ud800" <= c <= "\udfff" for c in name):
        raise ctx.fail("name", f"not a node name: {short(name)}")
    state, flags = split_state(
        ctx.require(node, "state", (str, list)),
        node.get("state_flags"),
        NODE_BASE_STATES,
        ctx,
        "state",
    )
    partitions = ctx.get(node, "partitions", (list, str)) or []
    if isinstance(partitions, str):
        partitions = [p for p in partitions.split(",") if p]
    return SlurmNode(
        name=name,
        state=state,
        state_flags=flags,
        reason=ctx.text(node, "reason"),
        reason_set_by_user=ctx.text(node, "reason_set_by_user"),
        reason_changed_ts_ms=ts_ms(node.get("reason_changed_at"), ctx, "reason_changed_at"),
        partitions=tuple(str(p) for p in partitions),
        gres=ctx.text(node, "gres"),
        gres_used=ctx.text(node, "gres_used"),
    )


def parse_squeue(doc: Any) -> list[SlurmJob]:
    """All jobs of a parsed ``squeue --json`` document. Raises SlurmParseError."""
    return [parse_squeue_job(j) for j in _jobs_list(doc, "squeue --json")]


def parse_sacct(doc: Any) -> list[SlurmJob]:
    """All jobs of a parsed ``sacct --json`` document (steps are not returned).

    Raises SlurmParseError."""
    return [parse_sacct_job(j) for j in _jobs_list(doc, "sacct --json")]


def parse_sinfo(doc: Any) -> list[SlurmNode]:
    """All nodes of a parsed ``sinfo --json`` (or ``scontrol show nodes --json``) document.

    Raises SlurmParseError, also when Slurm reported errors in the document."""
    if not isinstance(doc, Mapping):
        raise SlurmParseError(f"sinfo --json: expected a JSON object, got {type(doc).__name__}")
    if doc.get("errors"):
        raise SlurmParseError(f"sinfo --json: Slurm reported errors: {short(doc['errors'])}")
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        hint = ""
        if "sinfo" in doc:
            # Newer sinfo prints partition/state aggregates, not per-node records.
            hint = " (this is the aggregated 'sinfo' shape: use `scontrol show nodes --json`)"
        raise SlurmParseError(f"sinfo --json: expected a 'nodes' list{hint}")
    return [parse_sinfo_node(n) for n in nodes]


def data_parser_version(doc: Any) -> str | None:
    """``"v0.0.38"`` ... ``"v0.0.44"`` from a document's ``meta``; None when not stated."""
    meta = doc.get("meta") if isinstance(doc, Mapping) else None
    plugin = meta.get("plugin") if isinstance(meta, Mapping) else None
    if not isinstance(plugin, Mapping):
        return None
    for key in ("data_parser", "type"):
        value = plugin.get(key)
        if isinstance(value, str) and "v0.0." in value:
            return "v" + value.rsplit("v", 1)[1]
    return None


@dataclass(frozen=True)
class Skipped:
    """An entry of a Slurm document that was not read: its job id or node name when that much
    could be read (else None), and why."""

    ident: str | None
    reason: str


#: What reading one hostile entry may raise besides SlurmParseError (defence in depth: the
#: parsers are meant to raise SlurmParseError only).
_ENTRY_ERRORS = (SlurmParseError, TypeError, ValueError, KeyError, AttributeError,
                 RecursionError, OverflowError)  # fmt: skip
_T = TypeVar("_T")


def _each(items: list[Any], parse_one: Callable[[Any], _T], ident: Callable[[Any], str | None]
          ) -> tuple[list[_T], list[Skipped]]:  # fmt: skip
    out: list[_T] = []
    skipped: list[Skipped] = []
    for item in items:
        try:
            out.append(parse_one(item))
        except _ENTRY_ERRORS as exc:
            try:
                name = ident(item)
            except _ENTRY_ERRORS:
                name = None
            skipped.append(Skipped(name, f"{type(exc).__name__}: {exc}"[:500]))
    return out, skipped


def _raw_job_id(job: Any, *, sacct: bool) -> str | None:
    if not isinstance(job, Mapping):
        return None
    return _job_id(job, Ctx("job"), sacct=sacct)


def _raw_node_name(node: Any) -> str | None:
    name = node.get("name") if isinstance(node, Mapping) else None
    return name if isinstance(name, str) and name else None


def parse_squeue_jobs(doc: Any) -> tuple[list[SlurmJob], list[Skipped]]:
    """The jobs of a ``squeue --json`` document that can be read, and those that cannot (each
    skipped alone). Raises SlurmParseError only for a document without a ``jobs`` list."""
    return _each(_jobs_list(doc, "squeue --json"), parse_squeue_job,
                 lambda j: _raw_job_id(j, sacct=False))  # fmt: skip


def parse_sacct_jobs(doc: Any) -> tuple[list[SlurmJob], list[Skipped]]:
    """As :func:`parse_squeue_jobs` for ``sacct --json``."""
    return _each(_jobs_list(doc, "sacct --json"), parse_sacct_job,
                 lambda j: _raw_job_id(j, sacct=True))  # fmt: skip


def parse_sinfo_nodes(doc: Any) -> tuple[list[SlurmNode], list[Skipped]]:
    """The nodes of a ``sinfo --json`` / ``scontrol show nodes --json`` document that can be
    read, and those that cannot. Raises SlurmParseError for a document without a ``nodes``
    list (or with Slurm's errors), as :func:`parse_sinfo` does."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("nodes"), list):
        parse_sinfo(doc)  # raises, naming what is wrong
        raise SlurmParseError("sinfo --json: expected a 'nodes' list")
    parse_sinfo({**doc, "nodes": []})  # Slurm's own errors
    return _each(doc["nodes"], parse_sinfo_node, _raw_node_name)
