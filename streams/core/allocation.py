"""Stage 1: the allocation table. Which job owned which GPU of a node at which event time.

Built from JobEvent dicts (STARTED / ENDED / REQUEUED / UPDATED with per-node ``gpu_indices``)
as closed-open intervals ``[start_ms, end_ms)`` per (node, GPU index), so a late sample is
attributed to the job that owned the GPU at the sample's own ``ts_ms``, not to today's owner.
It is a pure structure (no clock, no I/O): the live stream keeps one table per node partition
(JobEvents re-keyed by node with :func:`split_by_node`), replay and evaluation keep one for all.

Bounded: :meth:`AllocationTable.prune` forgets intervals that ended more than a retention ago,
and the metadata of jobs with no interval left. Serialisable with ``to_dict`` / ``from_dict``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from peerwatch.streams.core.model import InvalidRecordError, JobContext, require

#: Default retention of ended intervals (ms): longer than any allowed lateness.
DEFAULT_RETENTION_MS = 3600 * 1000
_OPEN = None


@dataclass
class JobMeta:
    """What downstream stages need to know about a job (times int ms, UTC).

    ``alloc`` maps node -> GPU indices of the current run; ``expected_gpus`` is their sum.
    ``requeue_ms`` is the time of the last REQUEUED event, ``start_ms`` the current run's start.
    """

    job_id: str
    user: str | None = None
    partition: str | None = None
    account: str | None = None
    start_ms: int | None = None
    requeue_ms: int | None = None
    end_ms: int | None = None
    alloc: dict[str, list[int]] = field(default_factory=dict)

    @property
    def expected_gpus(self) -> int | None:
        total = sum(len(v) for v in self.alloc.values())
        return total or None

    def context(self, roles: Mapping[str, str] | None = None) -> JobContext:
        """The detector's :class:`JobContext` for this job."""
        return JobContext(
            job_id=self.job_id,
            expected_gpus=self.expected_gpus,
            start_ms=self.start_ms,
            requeue_ms=self.requeue_ms,
            partition=self.partition,
            roles=dict(roles or {}),
            end_ms=self.end_ms,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "partition": self.partition,
            "account": self.account,
            "start_ms": self.start_ms,
            "requeue_ms": self.requeue_ms,
            "end_ms": self.end_ms,
            "alloc": {k: list(v) for k, v in sorted(self.alloc.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobMeta:
        return cls(
            job_id=str(data["job_id"]),
            user=data.get("user"),
            partition=data.get("partition"),
            account=data.get("account"),
            start_ms=data.get("start_ms"),
            requeue_ms=data.get("requeue_ms"),
            end_ms=data.get("end_ms"),
            alloc={str(k): [int(i) for i in v] for k, v in (data.get("alloc") or {}).items()},
        )


#: One ownership interval: [job_id, start_ms, end_ms or None while open].
Interval = list[Any]


class AllocationTable:
    """Per node and GPU index, the ownership intervals; plus per job, its metadata.

    ``version(node)`` grows whenever the node's intervals change, so a caller may cache a
    lookup (see :meth:`segment`) and revalidate it cheaply.
    """

    __slots__ = ("_gpus", "_jobs", "_versions", "generation", "retention_ms")

    def __init__(self, retention_ms: int = DEFAULT_RETENTION_MS) -> None:
        self.retention_ms = retention_ms
        self._gpus: dict[str, dict[int, list[Interval]]] = {}
        self._jobs: dict[str, JobMeta] = {}
        self._versions: dict[str, int] = {}
        #: Grows with every change of any node's intervals (a cheap "anything changed?").
        self.generation = 0

    def _bump(self, node: str) -> None:
        self._versions[node] = self._versions.get(node, 0) + 1
        self.generation += 1

    # -- updates --------------------------------------------------------------------------------
    def apply_event(self, event: Mapping[str, Any]) -> list[str]:
        """Apply one JobEvent dict; returns the nodes whose intervals changed (sorted).

        STARTED opens intervals at ``start_ms`` (else ``ts_ms``) for the listed GPUs (a newer
        start than known begins a new run); ENDED and REQUEUED close the job's intervals at
        ``end_ms`` (else ``ts_ms``) on the listed nodes, or on all its nodes when none are
        listed; UPDATED replaces the listed nodes' GPU sets from ``ts_ms``. Idempotent:
        re-applying an event changes nothing. Raises InvalidRecordError when ``job_id``,
        ``kind`` or ``ts_ms`` is missing.
        """
        require(event, "job_id", "kind", "ts_ms", what="JobEvent")
        job_id, kind, ts_ms = str(event["job_id"]), str(event["kind"]), int(event["ts_ms"])
        allocs = _allocations(event)
        meta = self._jobs.get(job_id)
        if meta is None:
            if kind not in ("STARTED", "UPDATED"):
                return []  # nothing of this job is known here: nothing to close
            meta = self._jobs[job_id] = JobMeta(job_id)
        for name in ("user", "partition", "account"):
            if event.get(name) is not None:
                setattr(meta, name, event[name])
        if kind == "STARTED":
            start = int(event.get("start_ms") or ts_ms)
            if meta.start_ms is None or start > meta.start_ms:
                meta.start_ms, meta.end_ms, meta.alloc = start, None, {}
            changed = []
            for node, gpus in allocs.items():
                meta.alloc[node] = sorted(set(meta.alloc.get(node, [])) | set(gpus))
                if self._open(node, gpus, job_id, start):
                    changed.append(node)
            return sorted(changed)
        if kind in ("ENDED", "REQUEUED"):
            end = int(event.get("end_ms") or ts_ms)
            if kind == "REQUEUED":
                meta.requeue_ms = max(meta.requeue_ms or 0, ts_ms)
            meta.end_ms = end
            nodes = list(allocs) or list(meta.alloc)
            return sorted(n for n in nodes if self._close(n, None, job_id, end))
        if kind == "UPDATED":
            changed = []
            for node, gpus in allocs.items():
                old = set(meta.alloc.get(node, []))
                meta.alloc[node] = sorted(gpus)
                a = self._close(node, sorted(old - set(gpus)), job_id, ts_ms)
                b = self._open(node, sorted(set(gpus) - old), job_id, ts_ms)
                if a or b:
                    changed.append(node)
            return sorted(changed)
        return []

    def _open(self, node: str, gpus: Iterable[int], job_id: str, start_ms: int) -> bool:
        per_gpu = self._gpus.setdefault(node, {})
        changed = False
        for gpu in gpus:
            intervals = per_gpu.setdefault(int(gpu), [])
            if any(iv[0] == job_id and iv[1] == start_ms for iv in intervals):
                continue  # already known (a redelivered event)
            for iv in intervals:  # a new owner closes whatever was still open before it
                if iv[2] is _OPEN and iv[1] <= start_ms:
                    iv[2] = start_ms
            intervals.append([job_id, start_ms, _OPEN])
            intervals.sort(key=lambda iv: (iv[1], iv[0]))
            changed = True
        if changed:
            self._bump(node)
        return changed

    def _close(self, node: str, gpus: list[int] | None, job_id: str, end_ms: int) -> bool:
        per_gpu = self._gpus.get(node, {})
        changed = False
        for gpu, intervals in per_gpu.items():
            if gpus is not None and gpu not in gpus:
                continue
            for iv in intervals:
                if iv[0] == job_id and iv[2] is _OPEN and iv[1] <= end_ms:
                    iv[2] = end_ms
                    changed = True
        if changed:
            self._bump(node)
        return changed

    def prune(self, now_ms: int) -> int:
        """Forget intervals that ended before ``now_ms - retention_ms`` and jobs left without
        any interval that ended before then too; returns how many intervals were dropped."""
        horizon = now_ms - self.retention_ms
        dropped = 0
        live_jobs: set[str] = set()
        live = live_jobs.add
        for node, per_gpu in list(self._gpus.items()):
            node_dropped = 0
            for gpu, intervals in list(per_gpu.items()):
                if len(intervals) == 1 and intervals[0][2] is _OPEN:  # the usual GPU: one job
                    live(intervals[0][0])
                    continue
                kept = [iv for iv in intervals if iv[2] is _OPEN or iv[2] >= horizon]
                node_dropped += len(intervals) - len(kept)
                if kept:
                    per_gpu[gpu] = kept
                    live_jobs.update(iv[0] for iv in kept)
                else:
                    del per_gpu[gpu]
            if node_dropped:
                dropped += node_dropped
                self._bump(node)
            if not per_gpu:
                del self._gpus[node]
        for job_id, meta in list(self._jobs.items()):
            if job_id not in live_jobs and (meta.end_ms is None or meta.end_ms < horizon):
                del self._jobs[job_id]
        return dropped

    # -- lookups --------------------------------------------------------------------------------
    def owner(self, node: str, gpu_index: int, ts_ms: int) -> str | None:
        """The job that owned ``(node, gpu_index)`` at ``ts_ms``, or None."""
        for job_id, start, end in reversed(self._gpus.get(node, {}).get(gpu_index, ())):
            if start <= ts_ms and (end is _OPEN or ts_ms < end):
                return str(job_id)
        return None

    def segment(self, node: str, ts_ms: int) -> tuple[dict[int, str], int, int | None]:
        """Owners of every GPU of ``node`` at ``ts_ms`` and the span ``[from_ms, until_ms)``
        (``until_ms`` None = open-ended) over which that answer stays the same.

        The hot path caches the answer and calls again only when a sample falls outside the
        span or :meth:`version` changed.
        """
        owners: dict[int, str] = {}
        lo, hi = -(1 << 62), None
        for gpu, intervals in self._gpus.get(node, {}).items():
            for job_id, start, end in intervals:
                if start <= ts_ms:
                    lo = max(lo, start)
                    if end is _OPEN or ts_ms < end:
                        owners[gpu] = job_id
                        if end is not _OPEN:
                            hi = end if hi is None else min(hi, end)
                    else:
                        lo = max(lo, end)
                else:
                    hi = start if hi is None else min(hi, start)
        return owners, lo, hi

    def version(self, node: str) -> int:
        return self._versions.get(node, 0)

    def open_nodes(self) -> dict[str, tuple[str, int]]:
        """Nodes with a GPU allocated now (an interval not yet ended): node -> (job id, start
        ms) of the latest such interval. Walks every interval: callers cache it by
        :attr:`generation`."""
        out: dict[str, tuple[str, int]] = {}
        for node, per_gpu in self._gpus.items():
            for intervals in per_gpu.values():
                for job_id, start, end in intervals:
                    if end is _OPEN and (node not in out or start > out[node][1]):
                        out[node] = (str(job_id), int(start))
        return out

    def job(self, job_id: str) -> JobMeta | None:
        """Metadata of ``job_id`` or None when unknown (never started here, or pruned)."""
        return self._jobs.get(job_id)

    def nodes(self) -> list[str]:
        return sorted(self._gpus)

    def nodes_of(self, job_id: str) -> list[str]:
        meta = self._jobs.get(job_id)
        return sorted(meta.alloc) if meta is not None else []

    def for_nodes(self, nodes: Iterable[str]) -> AllocationTable:
        """A copy holding only ``nodes`` (and the jobs on them): one node partition's table."""
        wanted = set(nodes)
        out = AllocationTable(self.retention_ms)
        data = self.to_dict()
        data["gpus"] = {n: v for n, v in data["gpus"].items() if n in wanted}
        jobs = {
            iv[0] for per_gpu in data["gpus"].values() for ivs in per_gpu.values() for iv in ivs
        }
        data["jobs"] = {j: v for j, v in data["jobs"].items() if j in jobs}
        out._load(data)
        return out

    # -- state ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly state (GPU indices as string keys)."""
        return {
            "retention_ms": self.retention_ms,
            "gpus": {
                node: {str(g): [list(iv) for iv in ivs] for g, ivs in sorted(per_gpu.items())}
                for node, per_gpu in sorted(self._gpus.items())
            },
            "jobs": {j: m.to_dict() for j, m in sorted(self._jobs.items())},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AllocationTable:
        out = cls(int(data.get("retention_ms") or DEFAULT_RETENTION_MS))
        out._load(data)
        return out

    def _load(self, data: Mapping[str, Any]) -> None:
        self._gpus = {
            str(node): {
                int(g): [
                    [str(iv[0]), int(iv[1]), None if iv[2] is None else int(iv[2])] for iv in ivs
                ]
                for g, ivs in per_gpu.items()
            }
            for node, per_gpu in (data.get("gpus") or {}).items()
        }
        self._jobs = {str(j): JobMeta.from_dict(m) for j, m in (data.get("jobs") or {}).items()}
        # Every node's version moves on, so no cached lookup survives a reload.
        self._versions = {
            node: self._versions.get(node, 0) + 1 for node in set(self._gpus) | set(self._versions)
        }
        self.generation += 1


def _allocations(event: Mapping[str, Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for a in event.get("allocations") or []:
        if a.get("node") is None:
            raise InvalidRecordError("JobEvent allocation lacks 'node'")
        out.setdefault(str(a["node"]), []).extend(int(i) for i in a.get("gpu_indices") or [])
    return out


def split_by_node(
    event: Mapping[str, Any], table: AllocationTable | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """Re-key a JobEvent by node: one copy per node, each listing only that node's allocation.

    An ENDED/REQUEUED event without allocations is sent to the nodes ``table`` (a job-keyed
    table that has seen the job's earlier events) knows for the job. Returns (node, event) pairs
    sorted by node; none for an event that names no node.
    """
    allocs = _allocations(event)
    if not allocs and table is not None:
        allocs = {n: [] for n in table.nodes_of(str(event.get("job_id")))}
    out = []
    for node in sorted(allocs):
        copy = dict(event)
        copy["allocations"] = [{"node": node, "gpu_indices": list(allocs[node])}]
        out.append((node, copy))
    return out
