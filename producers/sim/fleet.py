"""The simulated fleet: replays the schedule and generates every record, tick by tick.

``Fleet(scenario).ticks()`` yields, for each tick in event-time order, the list of records to
publish as :class:`SimRecord` ``(stream, key, value)`` tuples:

- ``("job-events", job_id, JobEvent)`` and ``("node-events", node, NodeStateEvent)`` that happened
  since the previous tick (they come first, so attribution knows the owner before the samples);
- ``("samples", node, NodeGpuSample)``, one per node, in node order;
- ``("step-times", job_id, StepTime)``, one per training rank, when ``fleet.step_times`` is on;
- ``("nic-samples", node, NodeNicSample)`` right after the node's GPU sample, with the same
  ``ts_ms``, when ``fleet.nics_per_node`` > 0 (see ``nic.py``; none otherwise).

A final, samples-free list carries scheduler events between the last tick and the scenario end.
Missing samples (``missing_samples`` confounder) are dropped: with ``mode: not_sampled`` (default)
the agent never produced them, so ``seq`` has no gap; with ``mode: lost`` they were produced and
lost in transit, so ``seq`` skips. Clock skew shifts the node's ``ts_ms`` (and its XID times) only;
job and node events carry the controller's true time. An ``agent_silent`` fault stops the
node's samples altogether (agent dead, NVML hung, network cut) while its GPUs run on; XIDs of
that time come with its first sample after.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from peerwatch.producers.sim import dynamics as dyn
from peerwatch.producers.sim.labels import build_labels
from peerwatch.producers.sim.nic import IDLE as NIC_IDLE
from peerwatch.producers.sim.nic import NIC_CONFOUNDERS, NIC_FAULTS, NicModel, NicWindow, leaf_nodes
from peerwatch.producers.sim.nic import PAUSED as NIC_PAUSED
from peerwatch.producers.sim.nic import TRAIN as NIC_TRAIN
from peerwatch.producers.sim.scenario import Injection, Scenario
from peerwatch.producers.sim.scheduler import JobRun, Schedule, build_schedule

STREAMS = ("samples", "job-events", "node-events", "step-times", "nic-samples")
_NIC = NIC_FAULTS | NIC_CONFOUNDERS
#: NIC confounders that act on every node of a job.
_NIC_JOB = frozenset({"alltoall_phase", "checkpoint_traffic"})
_JOB_WIDE = frozenset({"checkpoint", "eval_pause", "pipeline_stages", "network_slowdown"})
_NODE_WIDE = frozenset({"clock_skew", "missing_samples", "agent_silent"})
_FLEET_WIDE = frozenset({"cluster_power_cap", "cluster_cooling"})
_DEFAULT_STAGE_SM = (1.0, 0.92, 0.85, 0.78)


class SimRecord(NamedTuple):
    """One record to publish: ``stream`` is one of :data:`STREAMS`."""

    stream: str
    key: str
    value: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Window:
    inj: Injection
    start_ms: int  # relative to the scenario start
    end_ms: int

    def active(self, t_ms: int) -> bool:
        return self.start_ms <= t_ms < self.end_ms


def _fraction(*parts: object) -> float:
    """A deterministic value in [0, 1) for the given parts."""
    h = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


class Fleet:
    """A deterministic simulated fleet for one scenario; ``ticks()`` can be iterated many times
    and yields identical records each time."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        spec = self.spec = scenario.fleet
        self.schedule: Schedule = build_schedule(scenario)
        self.node_names = [spec.node_name(i) for i in range(spec.nodes)]
        self.interval_ms = spec.interval_ms
        self.n_ticks = -(-spec.duration_ms // spec.interval_ms)
        self.agent_run_ids = [
            hashlib.blake2b(f"{spec.seed}:{n}".encode(), digest_size=16).hexdigest()
            for n in self.node_names
        ]
        self._gpu_inj: dict[tuple[int, int], list[_Window]] = {}
        self._job_inj: dict[str, list[_Window]] = {}
        self._node_inj: dict[int, list[_Window]] = {}
        self._global: list[_Window] = []
        self._xids: list[tuple[int, int, int, int]] = []  # (onset ms, node, gpu, code)
        nic_windows: list[NicWindow] = []
        for inj in scenario.injections:
            if inj.name in _NIC:
                nic_windows.append(self._nic_window(inj))
            else:
                self._index(inj)
        self._special = {n for n, _ in self._gpu_inj} | set(self._node_inj)
        self.nic: NicModel | None = None
        if spec.nics_per_node > 0:
            self.nic = NicModel(spec.nodes, spec.nics_per_node, spec.nic_rate_gbps,
                                spec.gpus_per_node, spec.seed, nic_windows)  # fmt: skip

    def _nic_window(self, inj: Injection) -> NicWindow:
        """A NIC injection's nodes (its node, the nodes of its leaf switch, or of its job) and
        the jobs it slows (the owners of those nodes at onset)."""
        start = round(inj.start_s * 1000)
        end = round(inj.end_s * 1000) if inj.end_s is not None else self.spec.duration_ms + 1
        nodes: frozenset[int] = frozenset({inj.node}) if inj.node is not None else frozenset()
        if inj.name == "switch_congestion" and inj.node is not None:
            nodes = leaf_nodes(inj.node, self.spec.nodes_per_leaf, self.spec.nodes)
        runs = [r for n in nodes if (r := self.schedule.owner_at(n, None, start)) is not None]
        if inj.name in _NIC_JOB:
            wanted = inj.params.get("job_id")
            if wanted is not None:
                runs = [
                    r for r in self.schedule.runs if r.job.job_id == str(wanted) and r.covers(start)
                ]
            nodes = frozenset(n for r in runs for n, _ in r.alloc)
        port = int(inj.params["port"]) if "port" in inj.params else None
        if (
            inj.name
            in (
                "nic_port_flap",
                "nic_symbol_errors",
                "nic_port_down",
                "nic_half_rate",
                "nic_retransmit",
            )
            and port is None
        ):
            port = 0  # fmt: skip
        jobs = frozenset(r.job.job_id for r in runs)
        return NicWindow(inj.name, nodes, port, start, end, dict(inj.params), jobs)

    def _index(self, inj: Injection) -> None:
        start = round(inj.start_s * 1000)
        end = round(inj.end_s * 1000) if inj.end_s is not None else self.spec.duration_ms + 1
        win = _Window(inj, start, end)
        if inj.name in _FLEET_WIDE:
            self._global.append(win)
        elif inj.name in _JOB_WIDE:
            job_id = inj.params.get("job_id")
            if job_id is None and inj.node is not None:
                run = self.schedule.owner_at(inj.node, inj.gpu_index, start)
                job_id = run.job.job_id if run else None
            if job_id is not None:
                self._job_inj.setdefault(str(job_id), []).append(win)
        elif inj.name in _NODE_WIDE and inj.node is not None:
            self._node_inj.setdefault(inj.node, []).append(win)
        elif inj.node is not None and inj.gpu_index is not None:
            self._gpu_inj.setdefault((inj.node, inj.gpu_index), []).append(win)
            if inj.name == "xid":
                code = int(inj.params.get("xid", 79))
                self._xids.append((start, inj.node, inj.gpu_index, code))
        self._xids.sort()

    def labels(self) -> list[dict[str, Any]]:
        """Ground truth, one JSON-ready dict per fault and confounder (see ``labels.py``)."""
        return build_labels(self.scenario, self.schedule)

    # -- per-tick state -------------------------------------------------------------------------
    def _job_state(self, run: JobRun, t: int) -> tuple[int, float, tuple[float, ...] | None]:
        job, elapsed = run.job, t - run.start_ms
        mode = dyn.TRAIN
        if elapsed < job.warmup_s * 1000:
            mode = dyn.WARMUP
        else:
            work = run.work_done_ms + elapsed
            every, length = job.checkpoint_every_s * 1000, job.checkpoint_s * 1000
            e_every, e_len = job.eval_every_s * 1000, job.eval_s * 1000
            if every > 0 and length > 0 and work % every >= every - length:
                mode = dyn.CHECKPOINT
            elif e_every > 0 and e_len > 0 and work % e_every >= e_every - e_len:
                mode = dyn.EVAL
        smf, stages = 1.0, None
        for w in self._job_inj.get(job.job_id, ()):
            if not w.active(t):
                continue
            name = w.inj.name
            if name == "checkpoint":
                mode = dyn.CHECKPOINT
            elif name == "eval_pause" and mode != dyn.CHECKPOINT:
                mode = dyn.EVAL
            elif name == "network_slowdown":
                smf *= w.inj.param("sm_factor", 0.65)
            elif name == "pipeline_stages":
                stages = tuple(w.inj.params.get("sm_factors", _DEFAULT_STAGE_SM))
        if self.nic is not None:  # a slow or dead link: every rank of the job waits on it
            smf *= self.nic.job_sm_factor(job.job_id, t)
        return mode, smf, stages

    def _global_effects(self, t: int) -> dyn.Effects | None:
        eff = None
        for w in self._global:
            if not w.active(t):
                continue
            eff = eff or dyn.Effects()
            if w.inj.name == "cluster_cooling":  # every busy GPU in SW thermal slowdown
                eff.clock_factor *= 1.0 - w.inj.param("clock_drop_pct", 6.0) / 100.0
                eff.temp_floor_c = max(eff.temp_floor_c, w.inj.param("temp_c", 87.0))
                eff.reasons |= dyn.SW_THERMAL
                continue
            limit = w.inj.param("limit_w", 450.0)
            eff.power_limit_w = min(eff.power_limit_w or limit, limit)
        return eff

    def _gpu_effects(self, wins: list[_Window], t: int, base: dyn.Effects | None) -> dyn.Effects:
        eff = base.copy() if base is not None else dyn.Effects()
        for w in wins:
            if not w.active(t):
                continue
            inj, name = w.inj, w.inj.name
            if name == "thermal_throttle":
                eff.clock_factor *= 1.0 - inj.param("clock_drop_pct", 15.0) / 100.0
                eff.temp_floor_c = max(eff.temp_floor_c, inj.param("temp_c", 88.0))
                eff.reasons |= dyn.HW_THERMAL
            elif name == "power_brake":
                eff.clock_factor *= 1.0 - inj.param("clock_drop_pct", 25.0) / 100.0
                eff.reasons |= dyn.HW_POWER_BRAKE | dyn.HW_SLOWDOWN
            elif name == "sm_clock_drop":
                eff.clock_factor *= 1.0 - inj.param("pct", 8.0) / 100.0
            elif name == "gpu_lost" or (name == "xid" and int(inj.param("xid", 79)) == 79):
                eff.lost = True
            elif name == "nvlink_error_storm":
                eff.nvlink_replay_per_s += inj.param("replay_per_s", 40.0)
                eff.nvlink_recovery_per_s += inj.param("recovery_per_s", 0.2)
                eff.nvlink_crc_per_s += inj.param("crc_per_s", 15.0)
            elif name == "pcie_downtrain":
                eff.pcie_width = int(inj.param("width", 8))
            elif name == "dataloader_stall":
                eff.sm_factor *= inj.param("sm_factor", 0.4)
        return eff

    # -- generation -----------------------------------------------------------------------------
    def timed_ticks(self) -> Iterator[tuple[int, list[SimRecord]]]:
        """Like :meth:`ticks`, with each list's tick time (epoch ms, true clock)."""
        spec, sched, d = self.spec, self.schedule, dyn.Dynamics(self.spec)
        t0, iv, names = spec.start_ms, self.interval_ms, self.node_names
        states = [[d.new_gpu(n, g) for g in range(spec.gpus_per_node)] for n in range(spec.nodes)]
        owners: list[list[JobRun | None]] = [[None] * spec.gpus_per_node for _ in states]
        seqs = [0] * spec.nodes
        pending_xids: dict[int, list[dict[str, Any]]] = {}
        events, ei, xi = sched.events, 0, 0
        read, gpu_inj, special = d.read, self._gpu_inj, self._special
        nic = self.nic
        nic_train, nic_paused, nic_idle = NIC_TRAIN, NIC_PAUSED, NIC_IDLE
        for tick in range(self.n_ticks):
            t = tick * iv
            out: list[SimRecord] = []
            while ei < len(events) and events[ei].ts_ms - t0 <= t:
                ev = events[ei]
                self._apply(ev.start, ev.stop, owners)
                out.append(SimRecord(ev.stream, ev.key, ev.value))
                ei += 1
            while xi < len(self._xids) and self._xids[xi][0] <= t:
                onset, x_node, x_gpu, code = self._xids[xi]
                dyn.apply_xid(states[x_node][x_gpu], code)
                xid = {
                    "gpu_index": x_gpu,
                    "xid": code,
                    "ts_ms": t0 + onset + self._skew(x_node, onset),
                    "event_data": None,
                }
                pending_xids.setdefault(x_node, []).append(xid)
                xi += 1
            glob = self._global_effects(t)
            jstate: dict[JobRun, tuple[int, float, tuple[float, ...] | None]] = {}
            steps: list[SimRecord] = []
            for n, gpus in enumerate(states):
                own = owners[n]
                is_special = n in special
                readings = []
                activity = nic_idle
                for g in gpus:
                    run = own[g.index]
                    if run is None:
                        mode, smf = dyn.IDLE, 1.0
                    else:
                        js = jstate.get(run)
                        if js is None:
                            js = jstate[run] = self._job_state(run, t)
                        mode, smf, stages = js
                        if stages is not None:
                            smf *= stages[run.ranks[(n, g.index)] * len(stages) // run.gpus]
                    eff = glob
                    if is_special and (n, g.index) in gpu_inj:
                        eff = self._gpu_effects(gpu_inj[(n, g.index)], t, glob)
                    reading = read(g, tick, mode, smf, eff)
                    readings.append(reading)
                    if nic is not None and mode != dyn.IDLE:
                        activity = min(activity, nic_train if mode == dyn.TRAIN else nic_paused)
                    if spec.step_times and mode == dyn.TRAIN and reading["state"] == "OK":
                        assert run is not None
                        steps.append(self._step(run, n, g, reading, smf, eff, t, tick))
                skew, keep, advance = 0, True, True
                if is_special and n in self._node_inj:
                    skew, keep, advance = self._node_view(n, t, tick)
                if keep:
                    sample = {
                        "node": names[n],
                        "ts_ms": t0 + t + skew,
                        "seq": seqs[n],
                        "agent_run_id": self.agent_run_ids[n],
                        "interval_ms": iv,
                        "driver_version": spec.driver_version,
                        "gpus": readings,
                        "xids": pending_xids.pop(n, []),
                    }
                    out.append(SimRecord("samples", names[n], sample))
                    if nic is not None and nic.publishing(n, t):
                        nic_rec = nic.sample(n, names[n], t, t0 + t + skew, iv, activity,
                                             self.agent_run_ids[n])  # fmt: skip
                        out.append(SimRecord("nic-samples", names[n], dict(nic_rec)))
                if advance:
                    seqs[n] += 1
            out.extend(steps)
            yield t0 + t, out
        tail = []
        while ei < len(events) and events[ei].ts_ms - t0 < spec.duration_ms:
            tail.append(SimRecord(events[ei].stream, events[ei].key, events[ei].value))
            ei += 1
        if tail:
            yield t0 + spec.duration_ms, tail

    def ticks(self) -> Iterator[list[SimRecord]]:
        """Per tick, in event-time order, the records to publish (see the module docstring)."""
        for _, records in self.timed_ticks():
            yield records

    @staticmethod
    def _apply(start: JobRun | None, stop: JobRun | None, owners: list[list[Any]]) -> None:
        if stop is not None:
            for n, idx in stop.alloc:
                for g in idx:
                    if owners[n][g] is stop:
                        owners[n][g] = None
        if start is not None:
            for n, idx in start.alloc:
                for g in idx:
                    owners[n][g] = start

    def _skew(self, n: int, t: int) -> int:
        for w in self._node_inj.get(n, ()):
            if w.inj.name == "clock_skew" and w.active(t):
                return int(w.inj.param("offset_ms", 1500.0))
        return 0

    def _node_view(self, n: int, t: int, tick: int) -> tuple[int, bool, bool]:
        """(clock skew ms, publish this sample?, advance seq?) for node ``n`` at ``t``."""
        skew, keep, advance = 0, True, True
        for w in self._node_inj[n]:
            if not w.active(t):
                continue
            if w.inj.name == "clock_skew":
                skew = int(w.inj.param("offset_ms", 1500.0))
            elif w.inj.name == "agent_silent":  # the agent is dead or hung: no sample at all
                keep = advance = False
            elif _fraction(self.spec.seed, n, tick) < w.inj.param("drop_prob", 0.5):
                keep = False
                advance = w.inj.params.get("mode", "not_sampled") == "lost"
        return skew, keep, advance

    def _step(
        self,
        run: JobRun,
        n: int,
        g: dyn.GpuState,
        reading: dict[str, Any],
        smf: float,
        eff: dyn.Effects | None,
        t: int,
        tick: int,
    ) -> SimRecord:
        # The compute part of a step scales with the GPU's clock and SM share; jitter ~1%.
        clk_ratio = reading["sm_clock_mhz"] / (reading["sm_clock_max_mhz"] * g.clk_base)
        sm_share = smf * (eff.sm_factor if eff is not None else 1.0)
        jitter = 1.0 + 0.01 * _noise(tick, g.gid)
        work = run.work_done_ms + t - run.start_ms
        value = {
            "job_id": run.job.job_id,
            "node": self.node_names[n],
            "rank": run.ranks[(n, g.index)],
            "gpu_index": g.index,
            "step": int(work // run.job.step_ms),
            "ts_ms": self.spec.start_ms + t + self._skew(n, t),
            "step_duration_ms": run.job.step_ms / max(clk_ratio * sm_share, 0.05) * jitter,
        }
        return SimRecord("step-times", run.job.job_id, value)


def _noise(tick: int, gid: int) -> float:
    x = (tick * 2_654_435_761 + gid * 40_503) & 0xFFFF
    return x / 32_768.0 - 1.0
