"""The watcher's pure core: Slurm snapshots in, JobEvents and NodeStateEvents out, only on change.

:func:`diff` compares what the watcher already reported (:class:`WatchState`, persisted between
runs) with the current ``squeue`` jobs and node records and returns the events to publish plus
the new state. Rules:

* a job seen for the first time gives SUBMITTED; a job running on nodes gives STARTED once per
  run (with per-node GPU indices); a job in a final state gives ENDED once per run; a restart
  count that grew, a new start time, or a finished job back in PENDING gives REQUEUED.
  Pending array ranges (``123_[4-7]``) are skipped: their tasks are reported one by one.
* a job that vanished from squeue before it was seen to end is closed from ``sacct`` (state,
  exit code, end time); :func:`vanished_jobs` says which, so ``sacct`` is only asked then. One
  that sacct does not know either is closed with state None after ``vanish_grace_ms``.
* a node event is published when its availability changes: DOWN/ERROR/... or the flags
  (DRAIN, NOT_RESPONDING...), reason, reason user or reason time. IDLE/MIXED/ALLOCATED and the
  COMPLETING flag follow jobs and are not node-state changes.

Event ids hash the facts of the transition (job, kind, start time, node set, restart count;
node, state, reason and the previous state), never the time of observation: a watcher that lost
its state and re-reads the same Slurm state produces the same ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.event_ids import event_id
from peerwatch.producers.slurm.fields import Ctx, number
from peerwatch.producers.slurm.parse import SlurmJob, SlurmNode, parse_squeue_job
from peerwatch.schemas.records import JobEvent, JobEventKind, NodeAllocation, NodeStateEvent

__all__ = [
    "FINAL_STATES",
    "JobMemo",
    "NodeMemo",
    "WatchEvent",
    "WatchState",
    "diff",
    "restart_counts",
    "vanished_jobs",
]

FINAL_STATES = frozenset(
    ["COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
     "DEADLINE", "OUT_OF_MEMORY"]
)  # fmt: skip
_UP_STATES = frozenset(["IDLE", "MIXED", "ALLOCATED", "COMPLETING"])
_TRANSIENT_FLAGS = frozenset(["COMPLETING", "PLANNED"])
STATE_VERSION = 1
#: A restart count beyond this is not read (the record field is a 32-bit int).
MAX_RESTARTS = (1 << 31) - 1


@dataclass(frozen=True)
class WatchEvent:
    """One record to publish: ``schema`` (``JobEvent``/``NodeStateEvent``), ``key``, value."""

    schema: str
    key: str
    record: JobEvent | NodeStateEvent


@dataclass(frozen=True)
class JobMemo:
    """What was reported about one job (per run: ``restart_count`` counts requeues)."""

    submit_ms: int | None
    restart_count: int = 0
    start_ms: int | None = None
    nodes: tuple[str, ...] = ()
    gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    user: str | None = None
    partition: str | None = None
    account: str | None = None
    name: str | None = None
    started: bool = False
    ended: bool = False
    last_seen_ms: int = 0


@dataclass(frozen=True)
class NodeMemo:
    key: tuple[Any, ...]
    digest: str


@dataclass(frozen=True)
class WatchState:
    """Everything reported so far; small, JSON-serialisable (:meth:`to_json`)."""

    jobs: Mapping[str, JobMemo] = field(default_factory=dict)
    nodes: Mapping[str, NodeMemo] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        jobs = {}
        for job_id, m in self.jobs.items():
            doc = {k: getattr(m, k) for k in JobMemo.__dataclass_fields__}
            doc["nodes"] = list(m.nodes)
            doc["gpus"] = {n: list(v) for n, v in m.gpus.items()}
            jobs[job_id] = doc
        nodes = {n: {"key": list(m.key), "digest": m.digest} for n, m in self.nodes.items()}
        return {"version": STATE_VERSION, "jobs": jobs, "nodes": nodes}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> WatchState:
        """Inverse of :meth:`to_json`. Raises ValueError for another version or a bad shape."""
        if doc.get("version") != STATE_VERSION:
            raise ValueError(
                f"watch state version {doc.get('version')!r}, expected {STATE_VERSION}"
            )
        try:
            jobs = {
                job_id: JobMemo(
                    **{
                        **m,
                        "nodes": tuple(m["nodes"]),
                        "gpus": {n: tuple(v) for n, v in m["gpus"].items()},
                    }
                )
                for job_id, m in doc["jobs"].items()
            }
            nodes = {
                n: NodeMemo(
                    tuple(tuple(k) if isinstance(k, list) else k for k in m["key"]), m["digest"]
                )
                for n, m in doc["nodes"].items()
            }
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"watch state has a bad shape: {exc!r}") from exc
        return cls(jobs=jobs, nodes=nodes)


def restart_counts(doc: Mapping[str, Any]) -> dict[str, int]:
    """Job id -> ``restart_cnt`` from a raw ``squeue --json`` document, for the jobs
    :func:`parse_squeue` returns. Jobs without the field, or that cannot be read, are left out."""
    out: dict[str, int] = {}
    jobs = doc.get("jobs")
    for raw in jobs if isinstance(jobs, list) else []:
        if not isinstance(raw, Mapping) or "restart_cnt" not in raw:
            continue
        try:
            count = number(raw.get("restart_cnt"), Ctx("squeue job"), "restart_cnt")
            if count is not None and 0 <= count <= MAX_RESTARTS:
                out[parse_squeue_job(raw).job_id] = count
        except SlurmParseError:  # that job is skipped (and counted) by the squeue read itself
            continue
    return out


def _skip(job: SlurmJob) -> bool:
    return "[" in job.job_id


def vanished_jobs(
    state: WatchState, jobs: Iterable[SlurmJob], held: Iterable[str] = ()
) -> list[str]:
    """Ids of jobs reported but not yet ended that squeue no longer lists (ask sacct about them);
    ``held``: ids squeue lists but that could not be read (not vanished)."""
    seen = {j.job_id for j in jobs} | set(held)
    return sorted(i for i, m in state.jobs.items() if not m.ended and i not in seen)


def _allocations(nodes: Sequence[str], gpus: Mapping[str, tuple[int, ...]]) -> list[NodeAllocation]:
    return [{"node": n, "gpu_indices": list(gpus.get(n, ()))} for n in nodes]


def _job_event(
    kind: JobEventKind,
    job_id: str,
    m: JobMemo,
    ts_ms: int,
    eid: str,
    *,
    state: str | None,
    exit_code: int | None = None,
    end_ms: int | None = None,
) -> WatchEvent:
    """A JobEvent of ``m``; a SUBMITTED one has no allocations and no start yet."""
    submitted = kind == "SUBMITTED"
    record: JobEvent = {
        "event_id": eid, "job_id": job_id, "kind": kind, "ts_ms": ts_ms, "source": "WATCHER",
        "state": state, "exit_code": exit_code, "user": m.user, "partition": m.partition,
        "account": m.account, "job_name": m.name,
        "allocations": [] if submitted else _allocations(m.nodes, m.gpus),
        "start_ms": None if submitted else m.start_ms, "end_ms": end_ms,
        "restart_count": m.restart_count,
    }  # fmt: skip
    return WatchEvent("JobEvent", job_id, record)


def _ended(job_id: str, m: JobMemo, job: SlurmJob, now_ms: int, known: bool = True) -> WatchEvent:
    """The ENDED event; ``known`` False: Slurm no longer knows the job (state null)."""
    eid = event_id(job_id, "ENDED", m.restart_count, m.start_ms, sorted(m.nodes))
    return _job_event(
        "ENDED", job_id, m, job.end_ts_ms or now_ms, eid,
        state=job.state if known else None, exit_code=job.exit_code, end_ms=job.end_ts_ms,
    )  # fmt: skip


def _observe_job(
    job: SlurmJob, memo: JobMemo | None, restarts: int | None, now_ms: int
) -> tuple[JobMemo, list[WatchEvent]]:
    events: list[WatchEvent] = []
    jid = job.job_id
    if memo is None:
        memo = JobMemo(submit_ms=job.submit_ts_ms, restart_count=restarts or 0)
        events.append(
            _job_event(
                "SUBMITTED", jid, _with_meta(memo, job), job.submit_ts_ms or now_ms,
                event_id(jid, "SUBMITTED", job.submit_ts_ms), state=job.state,
            )
        )  # fmt: skip
    new_run = (
        (restarts is not None and restarts > memo.restart_count)
        or (memo.started and job.start_ts_ms is not None and job.nodes
            and job.start_ts_ms != memo.start_ms and job.state not in FINAL_STATES)
        or (memo.ended and job.state not in FINAL_STATES)
    )  # fmt: skip
    if new_run:
        count = max(restarts or 0, memo.restart_count + 1)
        events.append(
            _job_event(
                "REQUEUED", jid, replace(_with_meta(memo, job), restart_count=count), now_ms,
                event_id(jid, "REQUEUED", count, memo.start_ms), state=job.state,
            )
        )  # fmt: skip
        memo = replace(memo, restart_count=count, started=False, ended=False, start_ms=None,
                       nodes=(), gpus={})  # fmt: skip
    memo = _with_meta(memo, job)
    running = job.state not in FINAL_STATES and job.state != "PENDING"
    if (
        not memo.started
        and job.nodes
        and job.start_ts_ms is not None
        and (running or job.state in FINAL_STATES)
    ):
        memo = replace(memo, started=True, start_ms=job.start_ts_ms)
        eid = event_id(jid, "STARTED", memo.restart_count, memo.start_ms, sorted(memo.nodes))
        events.append(_job_event("STARTED", jid, memo, job.start_ts_ms, eid, state=job.state))
    if not memo.ended and job.state in FINAL_STATES:
        events.append(_ended(jid, memo, job, now_ms))
        memo = replace(memo, ended=True)
    return replace(memo, last_seen_ms=now_ms), events


def _with_meta(memo: JobMemo, job: SlurmJob) -> JobMemo:
    # Finished jobs lose their GRES detail in squeue: keep what the running job showed.
    return replace(
        memo,
        nodes=job.nodes or memo.nodes,
        gpus=job.gpu_indices or memo.gpus,
        user=job.user or memo.user,
        partition=job.partition or memo.partition,
        account=job.account or memo.account,
        name=job.name or memo.name,
    )


def _close_vanished(
    job_id: str, memo: JobMemo, accounted: Mapping[str, SlurmJob], now_ms: int, grace_ms: int
) -> tuple[JobMemo | None, list[WatchEvent]]:
    acct = accounted.get(job_id)
    if acct is not None and acct.state in FINAL_STATES:
        # sacct 22.05 reports exit code 0 for failed jobs: a zero there is not evidence.
        code = acct.exit_code if (acct.state == "COMPLETED" or acct.exit_code) else None
        acct = replace(acct, exit_code=code)
        memo = _with_meta(memo, acct) if memo.nodes else replace(memo, nodes=acct.nodes)
        return None, [_ended(job_id, memo, acct, now_ms)]
    if acct is None and now_ms - memo.last_seen_ms >= grace_ms:
        unknown = SlurmJob(
            job_id=job_id, state="UNKNOWN", state_flags=(), user=None, partition=None,
            account=None, name=None, submit_ts_ms=None, start_ts_ms=None, end_ts_ms=None,
            exit_code=None, exit_signal=None, nodes=(),
        )  # fmt: skip
        return None, [_ended(job_id, memo, unknown, memo.last_seen_ms, known=False)]
    return memo, []


def _node_key(node: SlurmNode) -> tuple[Any, ...]:
    state = "UP" if node.state in _UP_STATES else node.state
    flags = tuple(sorted(set(node.state_flags) - _TRANSIENT_FLAGS))
    return (state, flags, node.reason, node.reason_set_by_user, node.reason_changed_ts_ms)


def _observe_node(
    node: SlurmNode, memo: NodeMemo | None, now_ms: int
) -> tuple[NodeMemo, list[WatchEvent]]:
    key = _node_key(node)
    if memo is not None and memo.key == key:
        return memo, []
    digest = event_id("node", node.name, key[0], key[1], *key[2:], memo.digest if memo else None)
    record: NodeStateEvent = {
        "event_id": digest, "node": node.name, "ts_ms": now_ms, "state": node.state,
        "flags": [f for f in node.state_flags if f not in _TRANSIENT_FLAGS],
        "reason": node.reason, "reason_user": node.reason_set_by_user,
        "reason_set_ms": node.reason_changed_ts_ms, "partitions": list(node.partitions),
        "source": "WATCHER",
    }  # fmt: skip
    return NodeMemo(key, digest), [WatchEvent("NodeStateEvent", node.name, record)]


def diff(
    state: WatchState,
    jobs: Sequence[SlurmJob],
    nodes: Sequence[SlurmNode] | None,
    now_ms: int,
    *,
    restarts: Mapping[str, int] | None = None,
    accounted: Sequence[SlurmJob] | None = None,
    vanish_grace_ms: int = 600_000,
    held_jobs: frozenset[str] = frozenset(),
    held_nodes: frozenset[str] = frozenset(),
) -> tuple[WatchState, list[WatchEvent]]:
    """Events for what changed since ``state``, and the state to persist after publishing them.

    ``jobs``: all squeue jobs now; ``nodes``: node records (None: not read this time, node
    state is left as it was); ``restarts``: :func:`restart_counts`; ``accounted``: sacct jobs
    covering :func:`vanished_jobs` (None: sacct not asked, vanished jobs wait; pass ``[]``
    when sacct failed, so that jobs unknown for ``vanish_grace_ms`` are closed anyway);
    ``now_ms``: the poll time, ms since the epoch. ``held_jobs``/``held_nodes``: jobs and nodes
    listed but unreadable this time (skipped): what was reported about them is kept as it is
    (a held job has not vanished). Pure; raises nothing for well-typed input."""
    restarts = restarts or {}
    events: list[WatchEvent] = []
    new_jobs: dict[str, JobMemo] = {}
    for job in jobs:
        if _skip(job):
            continue
        memo, evs = _observe_job(job, state.jobs.get(job.job_id), restarts.get(job.job_id), now_ms)
        new_jobs[job.job_id] = memo
        events.extend(evs)
    by_id = {j.job_id: j for j in accounted or ()}
    for job_id in sorted(set(state.jobs) - set(new_jobs)):
        old = state.jobs[job_id]
        if job_id in held_jobs:
            new_jobs[job_id] = old
            continue
        if old.ended:
            continue  # reported and gone from squeue: forget it
        if accounted is None:
            new_jobs[job_id] = old
            continue
        kept, evs = _close_vanished(job_id, old, by_id, now_ms, vanish_grace_ms)
        if kept is not None:
            new_jobs[job_id] = kept
        events.extend(evs)
    new_nodes = dict(state.nodes)
    if nodes is not None:
        new_nodes = {}
        for node in sorted(nodes, key=lambda n: n.name):
            node_memo, evs = _observe_node(node, state.nodes.get(node.name), now_ms)
            new_nodes[node.name] = node_memo
            events.extend(evs)
        for name in held_nodes:
            if name in state.nodes and name not in new_nodes:
                new_nodes[name] = state.nodes[name]
    return WatchState(jobs=new_jobs, nodes=new_nodes), events
