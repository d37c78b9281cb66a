"""Scenario files for the simulated fleet: format, parser and frozen dataclasses.

A scenario is a JSON (or TOML) document with four sections (see ``docs/scenarios.md``):
``fleet`` (size, GPU model, sampling interval, duration, seed, start time), ``jobs`` (explicit jobs)
and/or ``workload`` (a seeded random workload), ``faults`` and ``confounders`` (injections). Every
problem is reported as :class:`peerwatch.errors.ConfigError` whose ``field`` is the dotted path of
the offending value, e.g. ``faults[2].start_s``.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from peerwatch.errors import ConfigError
from peerwatch.producers.sim._fields import Section as _Section
from peerwatch.producers.sim.nic import NIC_CONFOUNDERS, NIC_FAULTS

#: Injected faults: what the detector should find.
FAULT_KINDS: frozenset[str] = frozenset(
    {
        "thermal_throttle",
        "power_brake",
        "sm_clock_drop",
        "xid",
        "nvlink_error_storm",
        "pcie_downtrain",
        "gpu_lost",
        "agent_silent",
    }
    | NIC_FAULTS
)
#: Injected confounders: things that look odd but must not blame a GPU.
CONFOUNDER_KINDS: frozenset[str] = frozenset(
    {
        "checkpoint",
        "eval_pause",
        "pipeline_stages",
        "dataloader_stall",
        "network_slowdown",
        "cluster_power_cap",
        "cluster_cooling",
        "small_jobs",
        "requeue",
        "missing_samples",
        "clock_skew",
    }
    | NIC_CONFOUNDERS
)
#: Injections that need a node; the others may leave ``node`` out (fleet- or job-wide ones).
NODE_OPTIONAL: frozenset[str] = frozenset({"cluster_power_cap", "cluster_cooling", "small_jobs"})
#: Injections that act on one GPU and so need ``gpu_index``.
GPU_REQUIRED: frozenset[str] = frozenset(
    {
        "thermal_throttle",
        "power_brake",
        "sm_clock_drop",
        "xid",
        "nvlink_error_storm",
        "pcie_downtrain",
        "gpu_lost",
        "dataloader_stall",
    }
)
GPU_MODELS: frozenset[str] = frozenset({"H100", "H200"})
#: 2026-01-01T00:00:00Z: a fixed default so that output does not depend on the wall clock.
DEFAULT_START_MS = 1_767_225_600_000
MAX_JOB_GPUS = 512


@dataclass(frozen=True, slots=True)
class FleetSpec:
    """The simulated cluster and the sampling set-up."""

    nodes: int = 64
    gpus_per_node: int = 8
    node_name_pattern: str = "gpu{:05d}"
    gpu_model: str = "H100"
    interval_s: float = 1.0
    duration_s: float = 600.0
    seed: int = 0
    start_ms: int = DEFAULT_START_MS
    partition: str = "gpu"
    driver_version: str = "550.90.07"
    step_times: bool = False
    nics_per_node: int = 0
    nic_rate_gbps: float = 400.0
    nodes_per_leaf: int = 32

    def node_name(self, node_idx: int) -> str:
        """Slurm name of node number ``node_idx`` (0-based)."""
        return self.node_name_pattern.format(node_idx)

    @property
    def interval_ms(self) -> int:
        return round(self.interval_s * 1000)

    @property
    def duration_ms(self) -> int:
        return round(self.duration_s * 1000)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job. Times are seconds from the scenario start; ``nodes`` pins the placement."""

    job_id: str
    gpus: int
    start_s: float = 0.0
    duration_s: float = 3600.0
    nodes: tuple[int, ...] = ()
    user: str = "sim"
    partition: str | None = None
    account: str = "sim"
    name: str = "train"
    checkpoint_every_s: float = 0.0
    checkpoint_s: float = 0.0
    eval_every_s: float = 0.0
    eval_s: float = 0.0
    warmup_s: float = 30.0
    step_ms: float = 1000.0
    requeue_at_s: float | None = None
    requeue_delay_s: float = 60.0
    requeue_on_failure: bool = False


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A seeded random workload added to the explicit jobs."""

    count: int = 0
    initial_fill: float = 0.0
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    size_weights: tuple[float, ...] = (6, 4, 5, 8, 8, 6, 4, 2, 1, 0.5)
    duration_s: tuple[float, float] = (600.0, 7200.0)
    checkpoint_every_s: float = 900.0
    checkpoint_s: float = 45.0
    eval_every_s: float = 0.0
    eval_s: float = 0.0
    requeue_prob: float = 0.0


@dataclass(frozen=True, slots=True)
class Injection:
    """A fault or confounder. ``node`` is a node index (``None`` = fleet-wide or not needed)."""

    kind: str  # "fault" | "confounder"
    name: str
    node: int | None
    gpu_index: int | None
    start_s: float
    end_s: float | None
    params: Mapping[str, Any] = field(default_factory=dict)

    def param(self, key: str, default: float) -> float:
        return float(self.params.get(key, default))


@dataclass(frozen=True, slots=True)
class Scenario:
    fleet: FleetSpec
    jobs: tuple[JobSpec, ...] = ()
    workload: WorkloadSpec = WorkloadSpec()
    faults: tuple[Injection, ...] = ()
    confounders: tuple[Injection, ...] = ()

    @property
    def injections(self) -> tuple[Injection, ...]:
        return self.faults + self.confounders


# Defaults read by the parser (slotted dataclasses keep no class-level defaults).
_FD = FleetSpec()
_JD = JobSpec(job_id="", gpus=1)
_WD = WorkloadSpec()


def _parse_fleet(data: object) -> FleetSpec:
    sec = _Section(data, "fleet")
    sec.reject_unknown(set(FleetSpec.__slots__))
    pattern = sec.text("node_name_pattern", _FD.node_name_pattern)
    try:
        pattern.format(0)
    except (IndexError, KeyError, ValueError) as exc:
        raise ConfigError(sec.at("node_name_pattern"), f"not a format pattern: {exc}") from exc
    model = sec.text("gpu_model", _FD.gpu_model).upper()
    if model not in GPU_MODELS:
        raise ConfigError(sec.at("gpu_model"), f"must be one of {sorted(GPU_MODELS)}")
    spec = FleetSpec(
        nodes=sec.num("nodes", _FD.nodes, 1, 100_000, integer=True),
        gpus_per_node=sec.num("gpus_per_node", _FD.gpus_per_node, 1, 16, integer=True),
        node_name_pattern=pattern,
        gpu_model=model,
        interval_s=sec.num("interval_s", _FD.interval_s, 0.1, 600),
        duration_s=sec.num("duration_s", _FD.duration_s, 0.1, 30 * 86400),
        seed=sec.num("seed", _FD.seed, integer=True),
        start_ms=sec.num("start_ms", DEFAULT_START_MS, 0, integer=True),
        partition=sec.text("partition", _FD.partition),
        driver_version=sec.text("driver_version", _FD.driver_version),
        step_times=sec.flag("step_times", _FD.step_times),
        nics_per_node=sec.num("nics_per_node", _FD.nics_per_node, 0, 16, integer=True),
        nic_rate_gbps=sec.num("nic_rate_gbps", _FD.nic_rate_gbps, 1, 3200),
        nodes_per_leaf=sec.num("nodes_per_leaf", _FD.nodes_per_leaf, 1, 100_000, integer=True),
    )
    names = {spec.node_name(i) for i in range(min(spec.nodes, 2))}
    if spec.nodes > 1 and len(names) < 2:
        raise ConfigError(sec.at("node_name_pattern"), "must contain a {} for the node number")
    return spec


def _node_index(value: object, fleet: FleetSpec, names: Mapping[str, int], path: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < fleet.nodes:
            raise ConfigError(path, f"node index {value} outside 0..{fleet.nodes - 1}")
        return value
    if isinstance(value, str) and value in names:
        return names[value]
    raise ConfigError(path, f"unknown node {value!r}")


def _parse_job(data: object, path: str, fleet: FleetSpec, names: Mapping[str, int]) -> JobSpec:
    sec = _Section(data, path)
    sec.reject_unknown(set(JobSpec.__slots__) | {"first_node"})
    gpus = sec.num("gpus", None, 1, min(MAX_JOB_GPUS, fleet.nodes * fleet.gpus_per_node), True)
    need_nodes = -(-gpus // fleet.gpus_per_node)
    nodes: tuple[int, ...] = ()
    if "nodes" in sec.data:
        raw = sec.data["nodes"]
        if not isinstance(raw, list):
            raise ConfigError(sec.at("nodes"), "expected a list of node names or indices")
        nodes = tuple(
            _node_index(v, fleet, names, f"{sec.at('nodes')}[{i}]") for i, v in enumerate(raw)
        )
    elif "first_node" in sec.data:
        first = sec.num("first_node", None, 0, fleet.nodes - need_nodes, integer=True)
        nodes = tuple(range(first, first + need_nodes))
    if nodes and (len(nodes) != need_nodes or len(set(nodes)) != len(nodes)):
        raise ConfigError(sec.at("nodes"), f"{gpus} GPUs need {need_nodes} distinct nodes")
    requeue_at = sec.num("requeue_at_s", None, 0) if "requeue_at_s" in sec.data else None
    return JobSpec(
        job_id=sec.text("job_id", None),
        gpus=gpus,
        start_s=sec.num("start_s", 0.0, 0),
        duration_s=sec.num("duration_s", _JD.duration_s, 1),
        nodes=nodes,
        user=sec.text("user", _JD.user),
        partition=sec.text("partition", fleet.partition),
        account=sec.text("account", _JD.account),
        name=sec.text("name", _JD.name),
        checkpoint_every_s=sec.num("checkpoint_every_s", 0.0, 0),
        checkpoint_s=sec.num("checkpoint_s", 0.0, 0),
        eval_every_s=sec.num("eval_every_s", 0.0, 0),
        eval_s=sec.num("eval_s", 0.0, 0),
        warmup_s=sec.num("warmup_s", _JD.warmup_s, 0),
        step_ms=sec.num("step_ms", _JD.step_ms, 1),
        requeue_at_s=requeue_at,
        requeue_delay_s=sec.num("requeue_delay_s", _JD.requeue_delay_s, 0),
        requeue_on_failure=sec.flag("requeue_on_failure", False),
    )


def _parse_workload(data: object) -> WorkloadSpec:
    sec = _Section(data, "workload")
    sec.reject_unknown(set(WorkloadSpec.__slots__))
    sizes = tuple(sec.data.get("sizes", _WD.sizes))
    weights = tuple(sec.data.get("size_weights", _WD.size_weights))
    if not sizes or any(not isinstance(s, int) or not 1 <= s <= MAX_JOB_GPUS for s in sizes):
        raise ConfigError(sec.at("sizes"), f"expected GPU counts in 1..{MAX_JOB_GPUS}")
    if len(weights) != len(sizes) or any(not isinstance(w, int | float) or w < 0 for w in weights):
        raise ConfigError(sec.at("size_weights"), "expected one weight >= 0 per size")
    dur = sec.data.get("duration_s", list(_WD.duration_s))
    if not (isinstance(dur, list | tuple) and len(dur) == 2 and 0 < dur[0] <= dur[1]):
        raise ConfigError(sec.at("duration_s"), "expected [min_s, max_s] with 0 < min <= max")
    return WorkloadSpec(
        count=sec.num("count", 0, 0, 1_000_000, integer=True),
        initial_fill=sec.num("initial_fill", 0.0, 0, 1),
        sizes=sizes,
        size_weights=tuple(float(w) for w in weights),
        duration_s=(float(dur[0]), float(dur[1])),
        checkpoint_every_s=sec.num("checkpoint_every_s", _WD.checkpoint_every_s, 0),
        checkpoint_s=sec.num("checkpoint_s", _WD.checkpoint_s, 0),
        eval_every_s=sec.num("eval_every_s", 0.0, 0),
        eval_s=sec.num("eval_s", 0.0, 0),
        requeue_prob=sec.num("requeue_prob", 0.0, 0, 1),
    )


def _check_params(name: str, params: Mapping[str, Any], path: str) -> None:
    for key, value in params.items():
        if name == "xid" and key == "xid":
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 255:
                raise ConfigError(f"{path}.{key}", f"expected an XID code 1..255, got {value!r}")
        elif key in {"pct", "clock_drop_pct"}:
            if not isinstance(value, int | float) or not 0 <= value < 100:
                raise ConfigError(f"{path}.{key}", f"expected a percentage 0..<100, got {value!r}")
        elif key == "offset_ms":
            if not isinstance(value, int | float) or abs(value) > 10_000:
                raise ConfigError(f"{path}.{key}", f"expected |offset_ms| <= 10000, got {value!r}")
        elif key == "sm_factors":
            if (
                not isinstance(value, list)
                or not value
                or any(not isinstance(f, int | float) or not 0 < f <= 1 for f in value)
            ):
                raise ConfigError(f"{path}.{key}", "expected a list of factors in (0, 1]")
        elif key in {"job_id", "mode"}:
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise ConfigError(f"{path}.{key}", f"expected a string, got {value!r}")
        elif not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{path}.{key}", f"expected a number >= 0, got {value!r}")
    if params.get("mode", "not_sampled") not in {"not_sampled", "lost"}:
        raise ConfigError(f"{path}.mode", "expected 'not_sampled' or 'lost'")


def _parse_injection(
    data: object, path: str, kind: str, fleet: FleetSpec, names: Mapping[str, int]
) -> Injection:
    sec = _Section(data, path)
    sec.reject_unknown({"name", "node", "gpu_index", "start_s", "end_s", "params"})
    allowed = FAULT_KINDS if kind == "fault" else CONFOUNDER_KINDS
    name = sec.text("name", None)
    if name not in allowed:
        raise ConfigError(sec.at("name"), f"unknown {kind} {name!r}; one of {sorted(allowed)}")
    node: int | None = None
    if sec.data.get("node") is not None:
        node = _node_index(sec.data["node"], fleet, names, sec.at("node"))
    elif name not in NODE_OPTIONAL and "job_id" not in sec.data.get("params", {}):
        raise ConfigError(sec.at("node"), f"{name} needs a node")
    gpu: int | None = None
    if sec.data.get("gpu_index") is not None:
        gpu = sec.num("gpu_index", None, 0, fleet.gpus_per_node - 1, integer=True)
    elif name in GPU_REQUIRED:
        raise ConfigError(sec.at("gpu_index"), f"{name} needs a gpu_index")
    start_s = sec.num("start_s", None, 0, fleet.duration_s)
    end_s = sec.num("end_s", None, 0) if sec.data.get("end_s") is not None else None
    if end_s is not None and end_s <= start_s:
        raise ConfigError(sec.at("end_s"), f"must be after start_s ({start_s}), got {end_s}")
    params = sec.data.get("params", {})
    if not isinstance(params, Mapping):
        raise ConfigError(sec.at("params"), "expected a table/object")
    _check_params(name, params, sec.at("params"))
    if name in NIC_FAULTS | NIC_CONFOUNDERS:
        if fleet.nics_per_node <= 0:
            raise ConfigError(sec.at("name"), f"{name} needs fleet.nics_per_node > 0")
        if "port" in params and not (
            isinstance(params["port"], int) and 0 <= params["port"] < fleet.nics_per_node
        ):
            raise ConfigError(f"{sec.at('params')}.port", f"expected 0..{fleet.nics_per_node - 1}")
    return Injection(kind, name, node, gpu, start_s, end_s, dict(params))


def _list(doc: Mapping[str, Any], key: str) -> list[Any]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(key, "expected a list")
    return value


def parse_scenario(doc: Mapping[str, Any]) -> Scenario:
    """Build a :class:`Scenario` from a parsed document. Raises ConfigError naming the field."""
    top = _Section(doc, "")
    top.reject_unknown({"fleet", "jobs", "workload", "faults", "confounders", "description"})
    fleet = _parse_fleet(doc.get("fleet", {}))
    names = {fleet.node_name(i): i for i in range(fleet.nodes)}
    jobs = tuple(
        _parse_job(j, f"jobs[{i}]", fleet, names) for i, j in enumerate(_list(doc, "jobs"))
    )
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        if job.job_id in seen:
            raise ConfigError(f"jobs[{i}].job_id", f"duplicate job id {job.job_id!r}")
        seen.add(job.job_id)
    return Scenario(
        fleet=fleet,
        jobs=jobs,
        workload=_parse_workload(doc.get("workload", {})),
        faults=tuple(
            _parse_injection(f, f"faults[{i}]", "fault", fleet, names)
            for i, f in enumerate(_list(doc, "faults"))
        ),
        confounders=tuple(
            _parse_injection(c, f"confounders[{i}]", "confounder", fleet, names)
            for i, c in enumerate(_list(doc, "confounders"))
        ),
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read a ``.json`` or ``.toml`` scenario file. Raises ConfigError (field ``scenario``) when the
    file cannot be read or parsed, or naming the bad field otherwise."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        doc = tomllib.loads(raw.decode()) if p.suffix == ".toml" else json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError("scenario", f"cannot read {p}: {exc}") from exc
    return parse_scenario(doc)


def default_scenario(
    nodes: int = 64,
    gpus_per_node: int = 8,
    duration_s: float = 600.0,
    seed: int = 0,
    interval_s: float = 1.0,
) -> Scenario:
    """A healthy fleet about 80% busy with a seeded random workload (the CLI's no-file default)."""
    fleet = FleetSpec(nodes, gpus_per_node, interval_s=interval_s, duration_s=duration_s, seed=seed)
    return Scenario(fleet=fleet, workload=WorkloadSpec(count=max(1, nodes // 8), initial_fill=0.8))


def with_fleet(scenario: Scenario, **changes: Any) -> Scenario:
    """The scenario with some fleet settings replaced (CLI overrides such as ``seed=``); the
    result is re-validated, so a bad override raises ConfigError like a bad file would."""
    fleet = replace(scenario.fleet, **changes)
    fields = {k: getattr(fleet, k) for k in FleetSpec.__slots__}
    _parse_fleet(fields)
    nodes = [i.node for i in scenario.injections if i.node is not None]
    nodes += [n for j in scenario.jobs for n in j.nodes]
    if nodes and max(nodes) >= fleet.nodes:
        raise ConfigError("fleet.nodes", f"the scenario uses node index {max(nodes)}")
    gpus = [i.gpu_index for i in scenario.injections if i.gpu_index is not None]
    if gpus and max(gpus) >= fleet.gpus_per_node:
        raise ConfigError("fleet.gpus_per_node", f"the scenario uses GPU index {max(gpus)}")
    big = max((j.gpus for j in scenario.jobs), default=0)
    if big > fleet.nodes * fleet.gpus_per_node:
        raise ConfigError("fleet.nodes", f"a job needs {big} GPUs")
    return replace(scenario, fleet=fleet)
