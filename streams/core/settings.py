"""The ``[stream]``, ``[detector]`` and ``[policy]`` tables of the settings tree (DETECTION.md;
every number a setting).

The tables are frozen and validate themselves on construction (:mod:`peerwatch.settings_base`):
a bad value raises :class:`peerwatch.errors.ConfigError` whose ``field`` is ``<table>.<name>``.
The tree, its loader and the environment names are in :mod:`peerwatch.settings`. ``to_dict`` /
``from_dict`` give a JSON-friendly form (sets become sorted lists) for replay manifests and the
settings record the stream worker publishes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from peerwatch.errors import ConfigError
from peerwatch.settings_base import (
    POSITIVE,
    check_one_of,
    check_types,
    from_mapping,
    setting,
    to_plain,
)
from peerwatch.topics import NODE_PARTITIONS

DAY_S = 86400
PERSISTENCE_MODES = ("k_of_n", "cusum")
FEATURES = ("clk", "thr", "sm", "step")

#: XIDs that blame the GPU/node (DETECTION.md "hard errors").
HARD_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
#: XIDs that are usually application faults: recorded, never blamed.
APP_XIDS = frozenset({13, 31, 43, 45, 68})


@dataclass(frozen=True)
class StreamSettings:
    """``[stream]``: the stages around the detector, shared by the live worker and replay (a
    replay with these values gives what the live worker gave). The window length is
    ``detector.window_s``."""

    app_id: str = setting("peerwatch-stream", "faust app id and consumer group of the workers")
    lateness_s: float = setting(
        5.0, "allowed lateness of samples (s): node clock skew and delivery jitter", lo=0, hi=3600
    )
    job_grace_s: float = setting(
        30.0, "how long past a window's end a job waits for nodes still missing (s)", lo=0, hi=3600
    )
    pending_hold_s: float = setting(
        5.0,
        "how long stage 3 keeps a waiting window batch in memory only, its input offset "
        "uncommitted, before writing it to its pending changelog (s): most are released sooner "
        "and never written; a crash re-reads at most this much of the window batches",
        lo=0, hi=600,
    )  # fmt: skip
    batch_max: int = setting(
        25000,
        "most node records the hot stage takes in one batch: a worker catching up on a backlog "
        "takes big batches (each closes more windows of more partitions at once: fewer, bigger "
        "messages to stage 3); one keeping up takes what came within batch_within_s",
        lo=1, hi=1000000,
    )  # fmt: skip
    batch_within_s: float = setting(
        0.2, "longest wait to fill a hot-stage batch (s)", lo=0.001, hi=60
    )
    node_partitions: int = setting(
        NODE_PARTITIONS,
        "partitions of the samples topic and of the topics co-partitioned with it (node events, "
        "health results, job windows): the most workers the hot path can use; fixed when the "
        "topics are created (docs/sizing.md: how many, and how to grow it)",
        lo=1,
        hi=100_000,
    )
    hot_process: bool = setting(
        True,
        "run the hot stage in a process of its own, beside the faust agents (a core each); "
        "false: a thread of the worker's process",
    )
    allocation_retention_s: int = setting(
        3600, "how long an ended job's allocation is kept for late samples (s)", lo=0, hi=30 * DAY_S
    )
    fan_out_job_wide: bool = setting(
        True, "copy a JOB_WIDE finding to every node of the job (one INFO alert per node)"
    )
    counters_path: str | None = setting(
        None, "write the worker's counters as JSON to this file (benchmarks, tests)"
    )
    counters_interval_s: float = setting(
        5.0, "how often counters_path is rewritten (s)", lo=0.1, hi=3600
    )
    silent_after_s: float = setting(
        30.0,
        "a node with allocated GPUs and no sample for this long is SILENT (s)",
        lo=0.001,
        hi=DAY_S,
    )
    silent_group_s: float = setting(
        10.0,
        "nodes within this much of going silent with it are one silence event (s)",
        lo=0,
        hi=DAY_S,
    )
    silent_fleet_min_nodes: int = setting(
        8,
        "a silence event of this many nodes over several jobs is one FLEET_WIDE finding",
        lo=2,
        hi=1000000,
    )
    silent_check_s: float = setting(
        2.0, "how often the silence watch looks (event time, s)", lo=0.001, hi=3600
    )
    clock_skew_warn_s: float = setting(
        1.0,
        "a node whose clock runs this far from the fleet's median clock (sample times against "
        "receive times) "
        "is logged and counted in clock_skewed_nodes (s)",
        lo=0.001,
        hi=3600,
    )

    recovery_timeout_s: float = setting(
        600.0,
        "a worker whose faust table recovery reads no changelog record for this long logs an "
        "error and exits (status 3) to be restarted (s)",
        lo=1,
        hi=86400,
    )

    def __post_init__(self) -> None:
        t = "stream"
        check_types(self, t)
        if self.silent_group_s >= self.silent_after_s:
            raise ConfigError(f"{t}.silent_group_s", "must be below silent_after_s")
        if not self.app_id.strip():
            raise ConfigError(f"{t}.app_id", "must not be empty")

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StreamSettings:
        return from_mapping(cls, "stream", data)


@dataclass(frozen=True)
class DetectorSettings:
    """``[detector]``: per-job peer comparison (DETECTION.md steps 1-8). Times in seconds,
    fractions 0..1."""

    window_s: int = setting(
        5,
        "event-time window length (s); every duration below is in seconds and counts the "
        "windows it spans (ceil(duration / window_s))",
        lo=1,
        hi=3600,
    )
    min_job_sm: float = setting(
        0.2,
        "gate: a job median SM activity below this is checkpoint/eval/compile (0..1)",
        lo=0,
        hi=1,
    )
    min_reported_frac: float = setting(
        0.9, "gate: share of the job's expected GPUs that must report a window (0..1)", lo=0, hi=1
    )
    warmup_s: int = setting(
        60, "gate: seconds skipped after a job start or requeue", lo=0, hi=DAY_S
    )
    ending_s: int = setting(
        30, "gate: windows ending this close to the job's end (teardown)", lo=0, hi=DAY_S
    )
    phase_change_sm: float = setting(
        0.2,
        "gate: the job median SM activity moved this much since the last window (a checkpoint, "
        "eval or restart transition, where node clock skew shifts peers against each other)",
        lo=0,
        hi=1,
    )
    phase_change_thr: float = setting(
        0.2,
        "gate: the job median throttled share moved this much since the last window (a power "
        "cap or cooling event starting or ending, where node clock skew shifts peers against "
        "each other)",
        lo=0,
        hi=1,
    )
    min_peers: int = setting(
        8, "peer statistics need at least this many GPUs in the group", lo=1, hi=100000
    )
    z_scale: float = setting(
        0.6745, "robust-z consistency constant: z = z_scale*(x-median)/MAD", lo=POSITIVE, hi=100
    )
    # DETECTION.md's 1% clk floor puts the detection limit at 3.5 / 0.6745 = 5.19% (a 5% drop is
    # never flagged), while the target is recall >= 0.99 for drops >= 5%. 0.9% moves the
    # limit to 4.67%; the evaluation shows no new findings on 3-4% drops and no false drains.
    mad_floor_clk_rel: float = setting(
        0.009, "MAD floor of clk, relative to the group median", lo=POSITIVE, hi=1
    )
    mad_floor_sm: float = setting(
        0.02, "MAD floor of SM activity (absolute, 0..1)", lo=POSITIVE, hi=1
    )
    mad_floor_thr: float = setting(
        0.02, "MAD floor of the throttled share (absolute, 0..1)", lo=POSITIVE, hi=1
    )
    mad_floor_step_rel: float = setting(
        0.01, "MAD floor of step time, relative to the median", lo=POSITIVE, hi=1
    )
    mad_floor_power: float = setting(
        0.02, "MAD floor of the power ratio (evidence only)", lo=POSITIVE, hi=10
    )
    z_threshold: float = setting(
        3.5, "|z| at or above this (slow direction) makes a candidate", lo=POSITIVE, hi=1000
    )
    effect_clk_rel: float = setting(
        0.03, "material effect: clk this share below the median", lo=POSITIVE, hi=1
    )
    effect_thr: float = setting(
        0.05, "material effect: throttled share this much above", lo=POSITIVE, hi=1
    )
    effect_sm: float = setting(
        0.15, "material effect: |SM activity difference| this much", lo=POSITIVE, hi=1
    )
    effect_step_rel: float = setting(
        0.10, "material effect: step time this share above", lo=POSITIVE, hi=100
    )
    job_wide_frac: float = setting(
        0.25,
        "job-wide abstain: more than this share of the group are candidates (0..1)",
        lo=0,
        hi=1,
    )
    job_wide_min_gpus: int = setting(
        2, "job-wide abstain needs at least this many candidates", lo=1, hi=100000
    )
    job_wide_report_min_gpus: int = setting(
        8,
        "a job of fewer GPUs abstains silently (no JOB_WIDE finding: 'n of n slow' in a small "
        "job tells an operator nothing)",
        lo=1,
        hi=100000,
    )
    confirm_features: tuple[str, ...] = setting(
        ("clk", "thr", "step"), "features whose flags confirm (sm alone only makes a SUSPECT)"
    )
    suspect_flagged_s: int = setting(
        5,
        "SUSPECT: windows flagged by a confirming feature covering this many seconds ...",
        lo=1,
        hi=DAY_S,
    )
    suspect_sm_s: int = setting(
        10,
        "... or flagged windows of any feature (sm alone) covering this many seconds ...",
        lo=1,
        hi=DAY_S,
    )
    suspect_span_s: int = setting(
        15, "... within the last this many evaluated seconds", lo=1, hi=DAY_S
    )
    node_wide_min_gpus: int = setting(
        4,
        "a window where this many GPUs of one node are candidates at once takes the slower "
        "suspect_sm_s rule for them (node clock skew at a fleet-wide change, a shared cause)",
        lo=1,
        hi=1024,
    )
    persistence_mode: str = setting("k_of_n", "persistence rule: k_of_n or cusum")
    confirm_flagged_s: int = setting(
        40,
        "k_of_n CONFIRMED: windows flagged by a confirming feature covering this many s ...",
        lo=1,
        hi=DAY_S,
    )
    confirm_span_s: int = setting(
        60, "... within the last this many evaluated seconds", lo=1, hi=DAY_S
    )
    cusum_k: float = setting(0.5, "cusum: allowance subtracted from each window's z", lo=0, hi=100)
    cusum_h: float = setting(5.0, "cusum: decision threshold", lo=POSITIVE, hi=1000000)
    cusum_z_cap: float = setting(
        3.5,
        "cusum: most z one window adds (one extreme window cannot confirm)",
        lo=POSITIVE,
        hi=1000,
    )
    clear_after_s: int = setting(
        300,
        "consecutive clean evaluated seconds that end an episode (and hard-rule memory)",
        lo=1,
        hi=7 * DAY_S,
    )
    confirmed_heartbeat_s: int = setting(
        300,
        "re-emit CONFIRMED every this many evaluated seconds (0: only on the transition)",
        lo=0,
        hi=DAY_S,
    )
    baseline_s: int = setting(
        300,
        "small groups: rolling median of the GPU's own clk over this many clean seconds",
        lo=1,
        hi=7 * DAY_S,
    )
    baseline_min_s: int = setting(
        90, "small groups: clean seconds needed before the baseline is used", lo=1, hi=7 * DAY_S
    )
    cause_power_cap_frac: float = setting(
        0.5,
        "cause: a slow GPU at the SW power cap this share of the window is named POWER",
        lo=0,
        hi=1,
    )
    fleet_cap_frac: float = setting(
        0.5,
        "fleet context: a GPU counts as capped (at the SW power cap) or hot (in thermal "
        "slowdown) this share of a window",
        lo=0,
        hi=1,
    )
    fleet_cap_share: float = setting(
        0.5,
        "fleet context: this share of a partition's busy GPUs capped (or hot) at once is one "
        "fleet-wide power (or cooling) event: one FLEET_WIDE finding, no GPU blamed, and small "
        "jobs' own-baseline comparisons judged against the partition's clock move",
        lo=0,
        hi=1,
    )
    fleet_min_gpus: int = setting(
        16,
        "fleet context: a partition needs this many busy GPUs reporting to judge",
        lo=1,
        hi=1000000,
    )
    baseline_power_cap_excuse: float = setting(
        0.5,
        "small groups: clk drop excused when at the SW power cap this share of the window",
        lo=0,
        hi=1,
    )
    hard_xids: frozenset[int] = setting(
        HARD_XIDS, "XIDs that blame the GPU (hard errors)", lo=0, hi=100000
    )
    app_xids: frozenset[int] = setting(
        APP_XIDS, "XIDs of application faults: recorded, never blamed", lo=0, hi=100000
    )
    id_hex_chars: int = setting(32, "length of the hex ids (sha256, truncated)", lo=16, hi=64)

    def __post_init__(self) -> None:
        t = "detector"
        check_types(self, t)
        if self.confirm_flagged_s > self.confirm_span_s:
            raise ConfigError(f"{t}.confirm_flagged_s", "must not exceed confirm_span_s")
        for name in ("suspect_flagged_s", "suspect_sm_s"):
            if getattr(self, name) > self.suspect_span_s:
                raise ConfigError(f"{t}.{name}", "must not exceed suspect_span_s")
        if self.baseline_min_s > self.baseline_s:
            raise ConfigError(f"{t}.baseline_min_s", "must not exceed baseline_s")
        check_one_of(self, t, "persistence_mode", PERSISTENCE_MODES)
        if not self.confirm_features or any(f not in FEATURES for f in self.confirm_features):
            raise ConfigError(
                f"{t}.confirm_features", f"must be a non-empty subset of {', '.join(FEATURES)}"
            )
        for name in ("hard_xids", "app_xids"):
            if any(x < 0 for x in getattr(self, name)):
                raise ConfigError(f"{t}.{name}", "must be a set of non-negative XID numbers")
        if self.hard_xids & self.app_xids:
            raise ConfigError(f"{t}.app_xids", "an XID cannot be both hard and application")

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000

    # The durations in windows are cached (the detector reads them per GPU and window); the
    # table is frozen, so they never go stale.
    def windows_for(self, seconds: int) -> int:
        """How many windows a duration in seconds spans (at least one; 0 stays 0)."""
        return 0 if seconds <= 0 else max(1, -(-seconds // self.window_s))

    @cached_property
    def warmup_windows(self) -> int:
        return self.windows_for(self.warmup_s) if self.warmup_s else 0

    @cached_property
    def suspect_k(self) -> int:
        return self.windows_for(self.suspect_flagged_s)

    @cached_property
    def suspect_sm_k(self) -> int:
        return self.windows_for(self.suspect_sm_s)

    @cached_property
    def suspect_n(self) -> int:
        return max(self.suspect_k, self.suspect_sm_k, self.windows_for(self.suspect_span_s))

    @cached_property
    def persist_k(self) -> int:
        return self.windows_for(self.confirm_flagged_s)

    @cached_property
    def persist_n(self) -> int:
        return max(self.persist_k, self.windows_for(self.confirm_span_s))

    @cached_property
    def history_n(self) -> int:
        """Windows of history a GPU keeps: the longer of the suspect and confirm spans."""
        return max(self.persist_n, self.suspect_n)

    @cached_property
    def clear_after_windows(self) -> int:
        return self.windows_for(self.clear_after_s)

    @cached_property
    def confirmed_heartbeat_windows(self) -> int:
        return self.windows_for(self.confirmed_heartbeat_s)

    @cached_property
    def baseline_windows(self) -> int:
        return self.windows_for(self.baseline_s)

    @cached_property
    def baseline_min_windows(self) -> int:
        return min(self.baseline_windows, self.windows_for(self.baseline_min_s))

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (sets as sorted lists)."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DetectorSettings:
        """Build from a mapping of overrides; raises ConfigError for an unknown or bad field."""
        return from_mapping(cls, "detector", data)


@dataclass(frozen=True)
class PolicySettings:
    """``[policy]``: the drain policy (DETECTION.md "Drain recommendation"). Times in seconds."""

    drain_after_confirmed_s: int = setting(
        600,
        "a straggler confirmed this long, with clk or thr evidence, is drained (s)",
        lo=0,
        hi=7 * DAY_S,
    )
    repeat_offender_jobs: int = setting(
        2, "repeat offender: confirmed in this many different jobs ...", lo=2, hi=1000
    )
    repeat_offender_window_s: int = setting(
        7 * 24 * 3600, "... within this horizon (s)", lo=0, hi=90 * DAY_S
    )
    evidence_clk_rel: float = setting(
        0.03, "clk effect that counts as clock evidence (0..1)", lo=POSITIVE, hi=1
    )
    evidence_thr: float = setting(
        0.05, "throttled share that counts as throttle evidence (0..1)", lo=POSITIVE, hi=1
    )
    evidence_z: float = setting(
        3.5, "features with |z| at least this are named in reasons", lo=POSITIVE, hi=1000
    )
    hard_expiry_s: int = setting(
        7 * 24 * 3600, "lifetime of a hard-error recommendation (s)", lo=1, hi=365 * DAY_S
    )
    drain_expiry_s: int = setting(
        24 * 3600, "lifetime of a drain recommendation (s)", lo=1, hi=365 * DAY_S
    )
    alert_expiry_s: int = setting(
        3600, "lifetime of an alert recommendation (s)", lo=1, hi=365 * DAY_S
    )
    reason_max_chars: int = setting(
        100, "longest reason text, without the controller's prefix", lo=20, hi=1000
    )
    alert_on_suspect: bool = setting(True, "ALERT on a SUSPECT episode")
    alert_on_confirmed: bool = setting(True, "ALERT on a CONFIRMED episode")
    alert_on_health_warning: bool = setting(True, "ALERT on a WARNING health result")
    alert_on_silent: bool = setting(True, "ALERT on a node whose samples stopped (SILENT)")
    drain_on_silent: bool = setting(
        False, "DRAIN (not only alert) a node whose samples stopped while its GPUs are allocated"
    )
    id_hex_chars: int = setting(32, "length of the hex ids (sha256, truncated)", lo=16, hi=64)

    def __post_init__(self) -> None:
        t = "policy"
        check_types(self, t)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicySettings:
        """Build from a mapping of overrides; raises ConfigError for an unknown or bad field."""
        return from_mapping(cls, "policy", data)


@dataclass(frozen=True)
class NetworkSettings:
    """``[network]``: the NIC link rules on arrival, the per-job network peer comparison and the
    leaf-switch grouping (DETECTION.md "Network"). Times in seconds; rates per second unless the
    name says otherwise (NVSentinel's documented defaults)."""

    port_down_s: float = setting(
        7.0,
        "HARD: a port not ACTIVE/LinkUp for longer than this while its node's GPUs are allocated "
        "(NCCL's IB timeout tears the job's connections at about 7 s)",
        lo=0.1,
        hi=3600,
    )
    max_gap_intervals: float = setting(
        2.0,
        "a port reading's state holds this many sampling intervals (a missing tick is unknown)",
        lo=1,
        hi=100,
    )
    rate_span_s: float = setting(
        10.0,
        "per-second rate rules are judged over spans of this many seconds",
        lo=1,
        hi=3600,
    )
    symbol_error_per_s: float = setting(
        10.0,
        "HARD: symbol_error above this rate",
        lo=0.001,
        hi=1e9,
    )
    link_error_recovery_per_min: float = setting(
        5.0,
        "HARD: link_error_recovery above this per min",
        lo=0.001,
        hi=1e9,
    )
    port_rcv_errors_per_s: float = setting(
        10.0,
        "HARD: port_rcv_errors above this rate",
        lo=0.001,
        hi=1e9,
    )
    local_ack_timeout_err_per_s: float = setting(
        1.0,
        "HARD: local_ack_timeout_err above this rate",
        lo=0.001,
        hi=1e9,
    )
    port_xmit_discards_per_s: float = setting(
        100.0,
        "HARD: port_xmit_discards above this rate",
        lo=0.001,
        hi=1e9,
    )
    roce_slow_restart_per_s: float = setting(
        10.0,
        "HARD: roce_slow_restart above this rate",
        lo=0.001,
        hi=1e9,
    )
    rated_gbps: float = setting(
        0.0,
        "a port's rated speed (Gb/s) for the below-rated finding; 0: the highest rate the port "
        "has shown since it was first seen",
        lo=0,
        hi=10000,
    )
    repeat_after_s: float = setting(
        300.0,
        "a link rule that fired on a port does not fire again on it within this (a storm)",
        lo=0,
        hi=86400,
    )
    peer_min_nodes: int = setting(
        4,
        "peer comparison needs at least this many nodes in the job",
        lo=2,
        hi=100000,
    )
    peer_z: float = setting(
        3.5,
        "|z| at or above this (in the bad direction) flags a node's port",
        lo=0.1,
        hi=100,
    )
    xmit_wait_bytes_per_tick: float = setting(
        8.0,
        "bytes of lost transmission one port_xmit_wait tick stands for (NVIDIA ibdiagnet manual: "
        "Quantum switches and ConnectX count every 8 bytes), to turn it into a share of the window",
        lo=0.001,
        hi=1e6,
    )
    peer_wait_share: float = setting(
        0.10,
        "material effect: port_xmit_wait share of the window this much above the median",
        lo=0,
        hi=1,
    )
    peer_throughput_rel: float = setting(
        0.25,
        "material effect: rx or tx bytes/s this share below the median",
        lo=0,
        hi=1,
    )
    peer_error_per_s: float = setting(
        1.0,
        "material effect (and MAD floor): error/retransmit rate this much above the median",
        lo=0.001,
        hi=1e9,
    )
    peer_cnp_per_s: float = setting(
        100.0,
        "material effect (and MAD floor): CNP rate this much above the median",
        lo=0.001,
        hi=1e9,
    )
    confirm_s: float = setting(
        10.0,
        "a port stands out in windows covering this many seconds before it is named",
        lo=0.001,
        hi=86400,
    )
    confirm_span_s: float = setting(
        30.0,
        "... within the last this many seconds of windows",
        lo=0.001,
        hi=86400,
    )
    slow_rel: float = setting(
        0.10,
        "gate: a job window is slowed when the job's median SM activity is this share below "
        "(or its median step time this share above) the median of its recent normal windows",
        lo=0.001,
        hi=0.99,
    )
    pace_windows: int = setting(
        12,
        "gate: the job's own reference is the median of this many recent normal windows",
        lo=3,
        hi=10000,
    )
    pace_memory_s: float = setting(
        600.0,
        "gate: a slowdown lasting longer than this becomes the job's new normal",
        lo=1,
        hi=86400,
    )
    topology: str = setting(
        "",
        "the leaf-switch layout for the switch grouping: empty (none), 'scontrol' (`scontrol "
        "show topology` when the worker starts) or the path of a topology.conf or of saved "
        "`scontrol show topology` output",
    )
    switch_min_nodes: int = setting(
        2,
        "nodes under one leaf switch with the same symptom that make one switch finding",
        lo=2,
        hi=100000,
    )
    switch_window_s: float = setting(
        60.0,
        "the nodes' symptoms count together when they fall within this many seconds",
        lo=0.001,
        hi=86400,
    )

    def __post_init__(self) -> None:
        t = "network"
        check_types(self, t)
        if self.confirm_s > self.confirm_span_s:
            raise ConfigError(f"{t}.confirm_s", "must not exceed confirm_span_s")

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NetworkSettings:
        """Build from a mapping of overrides; raises ConfigError for an unknown or bad field."""
        return from_mapping(cls, "network", data)


class StageSettings(Protocol):
    """What the stages read of the settings tree: its ``[stream]``, ``[detector]`` and
    ``[policy]`` tables. :class:`peerwatch.settings.Settings` is one, so the live worker and a
    replay are given the same objects; a protocol because the core does not import the tree
    (whose other tables belong to the edges)."""

    @property
    def stream(self) -> StreamSettings: ...

    @property
    def detector(self) -> DetectorSettings: ...

    @property
    def policy(self) -> PolicySettings: ...

    @property
    def network(self) -> NetworkSettings: ...
