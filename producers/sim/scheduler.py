"""A small deterministic Slurm-like scheduler for the simulated fleet.

Jobs of >= ``gpus_per_node`` GPUs get whole nodes (exclusive, lowest free node numbers first);
smaller jobs are packed best-fit onto partly used nodes. Pending jobs are tried in submit order
with backfill (a later job that fits may start before an earlier one that does not). The whole
timeline is computed up front (:func:`build_schedule`), so the fleet only replays it.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from peerwatch.producers.sim.scenario import MAX_JOB_GPUS, Injection, JobSpec, Scenario

#: Faults after which the owning job crashes (a GPU that fell off the bus kills NCCL).
JOB_KILLING = frozenset({"gpu_lost"})
USERS = ("alice", "bob", "chen", "dana", "emeka", "farah", "goran", "hana", "ivan", "jun")


def _event_id(*parts: object) -> str:
    return hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=16).hexdigest()


@dataclass(slots=True, eq=False)
class JobRun:
    """One run of a job on one allocation; a requeued job has a run per restart."""

    job: JobSpec
    restart_count: int
    alloc: tuple[tuple[int, tuple[int, ...]], ...]  # (node index, GPU indices)
    start_ms: int
    work_done_ms: int  # training time done by earlier runs (steps and phases continue)
    end_ms: int | None = None  # None: still running at the scenario end
    end_state: str | None = None  # COMPLETED | FAILED | REQUEUED
    ranks: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        return sum(len(g) for _, g in self.alloc)

    def covers(self, ts_ms: int) -> bool:
        return self.start_ms <= ts_ms and (self.end_ms is None or ts_ms < self.end_ms)


@dataclass(frozen=True, slots=True)
class SchedEvent:
    """A record to publish at ``ts_ms``; ``start``/``stop`` tell the fleet to (re)assign GPUs."""

    ts_ms: int
    stream: str  # "job-events" | "node-events"
    key: str
    value: dict[str, Any]
    start: JobRun | None = None
    stop: JobRun | None = None


@dataclass(slots=True)
class _Pending:
    job: JobSpec
    submit_ms: int
    remaining_ms: int
    restart_count: int = 0
    work_done_ms: int = 0
    prefer: tuple[int, ...] = ()
    order: int = 0


def _random_jobs(scenario: Scenario, taken: set[str]) -> list[tuple[JobSpec, int]]:
    """The seeded random workload and the small_jobs confounders: (spec, submit_ms) pairs."""
    fleet, wl = scenario.fleet, scenario.workload
    rng = random.Random(f"{fleet.seed}:workload")
    total = fleet.nodes * fleet.gpus_per_node
    sizes = [s for s in wl.sizes if s <= total] or [1]
    weights = [w for s, w in zip(wl.sizes, wl.size_weights, strict=True) if s <= total] or [1.0]
    out: list[tuple[JobSpec, int]] = []
    next_id = 100_000

    def make(gpus: int, submit_s: float, duration_s: float, **kw: Any) -> None:
        nonlocal next_id
        while str(next_id) in taken:
            next_id += 1
        job_id = str(next_id)
        taken.add(job_id)
        next_id += 1
        user = USERS[rng.randrange(len(USERS))]
        spec = JobSpec(
            job_id=job_id,
            gpus=gpus,
            start_s=submit_s,
            duration_s=duration_s,
            user=user,
            partition=fleet.partition,
            account=f"proj-{user}",
            name=f"{'train' if gpus >= 8 else 'dev'}-{job_id}",
            step_ms=rng.uniform(400.0, 2000.0),
            **kw,
        )
        out.append((spec, round(submit_s * 1000)))

    phases = {
        "checkpoint_every_s": wl.checkpoint_every_s,
        "checkpoint_s": wl.checkpoint_s,
        "eval_every_s": wl.eval_every_s,
        "eval_s": wl.eval_s,
    }
    filled = 0
    while filled < wl.initial_fill * total * 0.999:
        gpus = min(rng.choices(sizes, weights)[0], total - filled)
        # Already running at t0, so the remaining time is anywhere in the duration range.
        dur = rng.uniform(wl.duration_s[0] * 0.1, wl.duration_s[1])
        make(gpus, 0.0, dur, warmup_s=0.0, **phases)
        filled += gpus
    for _ in range(wl.count):
        gpus = rng.choices(sizes, weights)[0]
        dur = rng.uniform(*wl.duration_s)
        requeue = dur * rng.uniform(0.2, 0.8) if rng.random() < wl.requeue_prob else None
        make(gpus, rng.uniform(0.0, fleet.duration_s * 0.9), dur, requeue_at_s=requeue, **phases)
    for inj in scenario.confounders:
        if inj.name != "small_jobs":
            continue
        end_s = inj.end_s if inj.end_s is not None else inj.start_s + 60.0
        for _ in range(int(inj.param("count", 6))):
            gpus = min(rng.choice((1, 1, 2, 2, 4)), fleet.gpus_per_node)
            make(gpus, rng.uniform(inj.start_s, end_s), inj.param("duration_s", 300.0))
    return out


class _Sim:
    def __init__(self, scenario: Scenario) -> None:
        self.sc = scenario
        self.gpn = scenario.fleet.gpus_per_node
        self.t0 = scenario.fleet.start_ms
        self.horizon_ms = scenario.fleet.duration_ms
        self.free: list[set[int]] = [set(range(self.gpn)) for _ in range(scenario.fleet.nodes)]
        self.empty: list[int] = list(range(scenario.fleet.nodes))  # sorted
        self.partial: set[int] = set()  # nodes with some but not all GPUs free
        self.pending: list[_Pending] = []
        self.running: dict[str, JobRun] = {}
        self.runs: list[JobRun] = []
        self.events: list[SchedEvent] = []
        self.node_state = ["IDLE"] * scenario.fleet.nodes
        self.order = 0
        self.touched: set[int] = set(range(scenario.fleet.nodes))  # all nodes report at t0
        # Nodes with a lost GPU are not given to new jobs while the fault lasts.
        self.blocked = [
            (i.node, round(i.start_s * 1000), round((i.end_s or 1e12) * 1000))
            for i in scenario.faults
            if i.node is not None and _loses_gpu(i)
        ]

    # -- placement ------------------------------------------------------------------------------
    def _available(self, node: int, t: int) -> bool:
        return not any(n == node and a <= t < b for n, a, b in self.blocked)

    def _place(self, p: _Pending, t: int) -> tuple[tuple[int, tuple[int, ...]], ...] | None:
        gpus, gpn = p.job.gpus, self.gpn
        if gpus >= gpn or p.job.nodes:
            need = -(-gpus // gpn)
            wanted = p.job.nodes or p.prefer
            if wanted and all(len(self.free[n]) == gpn and self._available(n, t) for n in wanted):
                nodes = list(wanted)
            elif p.job.nodes:
                return None  # pinned jobs wait for their nodes
            else:
                nodes = []
                for n in self.empty:
                    if self._available(n, t):
                        nodes.append(n)
                        if len(nodes) == need:
                            break
                if len(nodes) < need:
                    return None
            counts = [gpn] * (need - 1) + [gpus - gpn * (need - 1)]
            return tuple((n, tuple(range(c))) for n, c in zip(nodes, counts, strict=True))
        best: int | None = None
        for n in self.partial:  # best fit among partly used nodes; ties to the lowest number
            free = len(self.free[n])
            better = best is None or (free, n) < (len(self.free[best]), best)
            if gpus <= free and better and self._available(n, t):
                best = n
        if best is None:
            best = next((n for n in self.empty if self._available(n, t)), None)
            if best is None:
                return None
        return ((best, tuple(sorted(self.free[best])[:gpus])),)

    def _take(self, alloc: tuple[tuple[int, tuple[int, ...]], ...], give: bool) -> None:
        for node, idx in alloc:
            self.touched.add(node)
            was_empty = len(self.free[node]) == self.gpn
            if give:
                self.free[node].update(idx)
                if len(self.free[node]) == self.gpn:
                    bisect.insort(self.empty, node)
            else:
                self.free[node].difference_update(idx)
                if was_empty:
                    del self.empty[bisect.bisect_left(self.empty, node)]
            if 0 < len(self.free[node]) < self.gpn:
                self.partial.add(node)
            else:
                self.partial.discard(node)

    # -- events ---------------------------------------------------------------------------------
    def _job_event(self, run: JobRun, kind: str, t: int, **extra: Any) -> None:
        job = run.job
        nodes = [self.sc.fleet.node_name(n) for n, _ in run.alloc]
        value: dict[str, Any] = {
            "event_id": _event_id(job.job_id, kind, ",".join(nodes), t, run.restart_count),
            "job_id": job.job_id,
            "kind": kind,
            "ts_ms": self.t0 + t,
            "source": "SIMULATOR",
            "state": "RUNNING",
            "exit_code": None,
            "user": job.user,
            "partition": job.partition or self.sc.fleet.partition,
            "account": job.account,
            "job_name": job.name,
            "allocations": [
                {"node": name, "gpu_indices": list(idx)}
                for name, (_, idx) in zip(nodes, run.alloc, strict=True)
            ],
            "start_ms": self.t0 + run.start_ms,
            "end_ms": None,
            "restart_count": run.restart_count,
        }
        value.update(extra)
        is_start = kind == "STARTED"
        self.events.append(
            SchedEvent(
                self.t0 + t,
                "job-events",
                job.job_id,
                value,
                start=run if is_start else None,
                stop=None if is_start else run,
            )
        )

    def _start(self, p: _Pending, alloc: tuple[tuple[int, tuple[int, ...]], ...], t: int) -> None:
        self._take(alloc, give=False)
        run = JobRun(p.job, p.restart_count, alloc, t, p.work_done_ms)
        rank = 0
        for node, idx in alloc:
            for g in idx:
                run.ranks[(node, g)] = rank
                rank += 1
        self.running[p.job.job_id] = run
        self.runs.append(run)
        self._job_event(run, "STARTED", t)
        self._push(t + p.remaining_ms, 0, "end", run)
        job = p.job
        if job.requeue_at_s is not None and p.restart_count == 0:
            at = round(job.requeue_at_s * 1000)
            if at < p.remaining_ms:
                self._push(t + at, 1, "requeue", (run, round(job.requeue_delay_s * 1000)))

    def _stop(self, run: JobRun, t: int, state: str, requeue_delay_ms: int | None) -> None:
        if self.running.get(run.job.job_id) is not run:
            return  # this run already ended
        del self.running[run.job.job_id]
        self._take(run.alloc, give=True)
        run.end_ms, run.end_state = t, state
        end_ms = self.t0 + t
        if requeue_delay_ms is None:
            exit_code = 0 if state == "COMPLETED" else 1
            self._job_event(
                run, "ENDED", t, state=state, end_ms=end_ms, exit_code=exit_code
            )  # fmt: skip
            return
        self._job_event(run, "REQUEUED", t, state="PENDING", end_ms=end_ms)
        done = run.work_done_ms + (t - run.start_ms)
        remaining = max(1000, round(run.job.duration_s * 1000) - done)
        self.order += 1
        again = _Pending(
            run.job, t, remaining, run.restart_count + 1, done, tuple(n for n, _ in run.alloc)
        )
        again.order = self.order
        self._push(t + requeue_delay_ms, 2, "submit", again)

    def _owner(self, node: int, gpu: int | None) -> JobRun | None:
        for run in self.running.values():
            for n, idx in run.alloc:
                if n == node and (gpu is None or gpu in idx):
                    return run
        return None

    def _push(self, t: int, prio: int, action: str, payload: Any) -> None:
        self.order += 1
        heapq.heappush(self.heap, (t, prio, self.order, action, payload))

    def run(self) -> None:
        self.heap: list[tuple[int, int, int, str, Any]] = []
        self._push(0, 3, "wake", None)  # so every node reports its state at t0
        explicit = {j.job_id for j in self.sc.jobs}
        jobs = [(j, round(j.start_s * 1000)) for j in self.sc.jobs]
        jobs += _random_jobs(self.sc, explicit)
        for job, submit in jobs:
            p = _Pending(job, submit, round(job.duration_s * 1000))
            self._push(submit, 2, "submit", p)
            p.order = self.order
        for inj in self.sc.injections:
            if inj.name == "requeue" or (inj.name in JOB_KILLING or _loses_gpu(inj)):
                fail_after = inj.param("fail_job_after_s", 30.0)
                at = inj.start_s if inj.name == "requeue" else inj.start_s + fail_after
                self._push(round(at * 1000), 1, "inject", inj)
            if inj.end_s is not None and _loses_gpu(inj):
                self._push(round(inj.end_s * 1000), 3, "wake", None)
        while self.heap and self.heap[0][0] < self.horizon_ms:
            t = self.heap[0][0]
            while self.heap and self.heap[0][0] == t:
                _, _, _, action, payload = heapq.heappop(self.heap)
                self._handle(action, payload, t)
            self._schedule(t)
            self._node_events(t)

    def _handle(self, action: str, payload: Any, t: int) -> None:
        if action == "submit":
            self.pending.append(payload)
        elif action == "end":
            self._stop(payload, t, "COMPLETED", None)
        elif action == "requeue":
            run, delay = payload
            self._stop(run, t, "REQUEUED", delay)
        elif action == "inject":
            inj: Injection = payload
            run = self._inj_owner(inj)
            if run is None:
                return
            if inj.name == "requeue":
                end_s = inj.end_s if inj.end_s is not None else inj.start_s + 60.0
                self._stop(run, t, "REQUEUED", round((end_s - inj.start_s) * 1000))
            elif run.job.requeue_on_failure:
                self._stop(run, t, "REQUEUED", round(run.job.requeue_delay_s * 1000))
            else:
                self._stop(run, t, "FAILED", None)

    def _inj_owner(self, inj: Injection) -> JobRun | None:
        if "job_id" in inj.params:
            return self.running.get(str(inj.params["job_id"]))
        return self._owner(inj.node, inj.gpu_index) if inj.node is not None else None

    def _schedule(self, t: int) -> None:
        self.pending.sort(key=lambda p: (p.submit_ms, p.order))
        still: list[_Pending] = []
        # A job that did not fit means no larger unpinned job of its kind fits either at `t`.
        too_big = {True: MAX_JOB_GPUS + 1, False: MAX_JOB_GPUS + 1}
        for p in self.pending:
            whole = p.job.gpus >= self.gpn
            free_choice = not p.job.nodes and not p.prefer
            if free_choice and p.job.gpus >= too_big[whole]:
                still.append(p)
                continue
            alloc = self._place(p, t)
            if alloc is None:
                still.append(p)
                if free_choice:
                    too_big[whole] = min(too_big[whole], p.job.gpus)
            else:
                self._start(p, alloc, t)
        self.pending = still

    def _node_events(self, t: int) -> None:
        gpn, fleet = self.gpn, self.sc.fleet
        for n in sorted(self.touched):
            used = gpn - len(self.free[n])
            state = "IDLE" if used == 0 else "ALLOCATED" if used == gpn else "MIXED"
            if state == self.node_state[n] and t > 0:
                continue
            self.node_state[n] = state
            name = fleet.node_name(n)
            value = {
                "event_id": _event_id(name, state, None, self.t0 + t),
                "node": name,
                "ts_ms": self.t0 + t,
                "state": state,
                "flags": [],
                "reason": None,
                "reason_user": None,
                "reason_set_ms": None,
                "partitions": [fleet.partition],
                "source": "SIMULATOR",
            }
            self.events.append(SchedEvent(self.t0 + t, "node-events", name, value))
        self.touched.clear()


def _loses_gpu(inj: Injection) -> bool:
    return inj.kind == "fault" and (
        inj.name == "gpu_lost" or (inj.name == "xid" and int(inj.param("xid", 79)) == 79)
    )


@dataclass(frozen=True, slots=True)
class Schedule:
    """Every job run and every scheduler record, in time order."""

    runs: tuple[JobRun, ...]
    events: tuple[SchedEvent, ...]

    def owner_at(self, node: int, gpu: int | None, t_ms: int) -> JobRun | None:
        """The run that owned ``(node, gpu)`` (any GPU of the node if ``gpu`` is None) at
        ``t_ms`` (ms from the scenario start), or None."""
        for run in self.runs:
            if run.covers(t_ms):
                for n, idx in run.alloc:
                    if n == node and (gpu is None or gpu in idx):
                        return run
        return None


def build_schedule(scenario: Scenario) -> Schedule:
    """Simulate the scheduler over the scenario's duration. Run times (``start_ms``, ``end_ms``)
    are ms from the scenario start; event ``ts_ms`` values are absolute epoch ms."""
    sim = _Sim(scenario)
    sim.run()
    return Schedule(tuple(sim.runs), tuple(sim.events))
