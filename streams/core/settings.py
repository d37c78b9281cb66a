"""Settings of the straggler detector and the drain policy (DETECTION.md; every number a setting).

Both objects are frozen and validate themselves on construction: a bad value raises
:class:`peerwatch.errors.ConfigError` whose ``field`` is ``detector.<name>`` or ``policy.<name>``.
``to_dict`` / ``from_dict`` give a JSON-friendly form (sets become sorted lists) so a process
settings file or a replay manifest can carry them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from peerwatch.errors import ConfigError

PERSISTENCE_MODES = ("k_of_n", "cusum")
FEATURES = ("clk", "thr", "sm", "step")

#: XIDs that blame the GPU/node (DETECTION.md "hard errors").
HARD_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
#: XIDs that are usually application faults: recorded, never blamed.
APP_XIDS = frozenset({13, 31, 43, 45, 68})

_S = TypeVar("_S", "DetectorSettings", "PolicySettings")


def _check_positive(prefix: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"{prefix}.{name}", f"must be a positive number, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{prefix}.{name}", f"must be finite, got {value!r}")


def _check_int(prefix: str, obj: object, names: tuple[str, ...], minimum: int) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{prefix}.{name}", f"must be an integer >= {minimum}, got {value!r}")


def _check_fraction(prefix: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise ConfigError(f"{prefix}.{name}", f"must be a number in [0, 1], got {value!r}")


def _check_bool(prefix: str, obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        if not isinstance(getattr(obj, name), bool):
            raise ConfigError(f"{prefix}.{name}", "must be true or false")


def _to_dict(obj: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        out[f.name] = sorted(value) if isinstance(value, frozenset | set | tuple) else value
    return out


def _from_dict(cls: type[_S], prefix: str, data: Mapping[str, Any]) -> _S:
    known = {f.name for f in fields(cls)}
    for key in data:
        if key not in known:
            raise ConfigError(f"{prefix}.{key}", "unknown setting")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        default = getattr(cls, key, None)
        if key in ("hard_xids", "app_xids"):
            if not isinstance(value, list | tuple | set | frozenset):
                raise ConfigError(f"{prefix}.{key}", "must be a list of XID numbers")
            kwargs[key] = frozenset(value)
        elif key == "confirm_features":
            if not isinstance(value, list | tuple):
                raise ConfigError(f"{prefix}.{key}", "must be a list of feature names")
            kwargs[key] = tuple(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            kwargs[key] = float(value)
        else:
            kwargs[key] = value
    return cls(**kwargs)


@dataclass(frozen=True)
class DetectorSettings:
    """Per-job peer comparison (DETECTION.md steps 1-8). Times in seconds, fractions 0..1."""

    #: Window length the aggregation stage uses (s); warm-up and hard-rule memory are in windows.
    window_s: int = 30
    #: Gate: the job's median SM activity below this means checkpoint/eval/compile/restart.
    min_job_sm: float = 0.2
    #: Gate: fewer than this share of the job's expected GPUs reported the window.
    min_reported_frac: float = 0.9
    #: Gate: windows starting within this many windows of job start or requeue.
    warmup_windows: int = 2
    #: Peer statistics need at least this many GPUs in the (role) group.
    min_peers: int = 8
    #: Robust-z consistency constant: z = z_scale * (x - median) / MAD.
    z_scale: float = 0.6745
    #: MAD floors: clk relative to the group median; sm and thr absolute; step relative.
    #: DETECTION.md's 1% clk floor puts the detection limit at 3.5 / 0.6745 = 5.19% (a 5% drop is
    #: never flagged), while the issue's target is recall >= 0.99 for drops >= 5%. 0.9% moves the
    #: limit to 4.67%; the evaluation shows no new findings on 3-4% drops and no false drains.
    mad_floor_clk_rel: float = 0.009
    mad_floor_sm: float = 0.02
    mad_floor_thr: float = 0.02
    mad_floor_step_rel: float = 0.01
    #: Floor for the power ratio (evidence only, never a candidate).
    mad_floor_power: float = 0.02
    #: |z| at or above this in the slow direction (and a material effect) makes a candidate.
    z_threshold: float = 3.5
    #: Material effect: clk this share below the median, thr this much above, |d sm| this much,
    #: step this share above the median (GREYHOUND's 1.1x).
    effect_clk_rel: float = 0.03
    effect_thr: float = 0.05
    effect_sm: float = 0.15
    effect_step_rel: float = 0.10
    #: Job-wide abstain: more than this share of the group (and >= job_wide_min_gpus) are candidates.
    job_wide_frac: float = 0.25
    job_wide_min_gpus: int = 2
    #: Features whose flags count towards confirmation; sm alone can only make a SUSPECT.
    confirm_features: tuple[str, ...] = ("clk", "thr", "step")
    #: "k_of_n" (default) or the documented alternative "cusum".
    persistence_mode: str = "k_of_n"
    persist_k: int = 4
    persist_n: int = 6
    cusum_k: float = 0.5
    cusum_h: float = 5.0
    #: Each window adds at most this much z to the CUSUM, so one extreme window cannot confirm.
    cusum_z_cap: float = 3.5
    #: Consecutive clean evaluated windows that end an episode (CLEARED).
    clear_after_windows: int = 10
    #: While confirmed, re-emit CONFIRMED every this many evaluated windows so the drain policy
    #: sees the episode continue (0 = only on the transition).
    confirmed_heartbeat_windows: int = 10
    #: Small groups: rolling median of the GPU's own clk over this many recent clean windows,
    #: used once at least baseline_min_windows are known.
    baseline_windows: int = 10
    baseline_min_windows: int = 3
    #: Small groups: a clk drop is excused when the GPU sat at the SW power cap this share of the
    #: window (a site-wide power cap is not a fault of the GPU).
    baseline_power_cap_excuse: float = 0.5
    hard_xids: frozenset[int] = field(default=HARD_XIDS)
    app_xids: frozenset[int] = field(default=APP_XIDS)
    #: Length of the hex ids (sha256, truncated).
    id_hex_chars: int = 32

    def __post_init__(self) -> None:
        p = "detector"
        _check_int(p, self, ("window_s", "min_peers", "persist_k", "persist_n"), 1)
        _check_int(p, self, ("clear_after_windows", "baseline_windows", "baseline_min_windows"), 1)
        _check_int(p, self, ("warmup_windows", "confirmed_heartbeat_windows"), 0)
        _check_int(p, self, ("job_wide_min_gpus",), 1)
        _check_int(p, self, ("id_hex_chars",), 16)
        _check_fraction(p, self, ("min_job_sm", "min_reported_frac", "job_wide_frac"))
        _check_fraction(p, self, ("mad_floor_clk_rel", "mad_floor_step_rel", "effect_clk_rel"))
        _check_fraction(p, self, ("baseline_power_cap_excuse",))
        _check_positive(p, self, ("z_scale", "z_threshold", "cusum_h", "cusum_z_cap"))
        _check_positive(p, self, ("mad_floor_clk_rel", "mad_floor_sm", "mad_floor_thr"))
        _check_positive(p, self, ("mad_floor_step_rel", "mad_floor_power"))
        _check_positive(p, self, ("effect_clk_rel", "effect_thr", "effect_sm", "effect_step_rel"))
        _check_fraction(p, self, ("effect_thr", "effect_sm"))
        if isinstance(self.cusum_k, bool) or not isinstance(self.cusum_k, int | float):
            raise ConfigError(f"{p}.cusum_k", "must be a number")
        if self.cusum_k < 0:
            raise ConfigError(f"{p}.cusum_k", f"must be >= 0, got {self.cusum_k!r}")
        if self.persist_k > self.persist_n:
            raise ConfigError(f"{p}.persist_k", "must not exceed persist_n")
        if self.baseline_min_windows > self.baseline_windows:
            raise ConfigError(f"{p}.baseline_min_windows", "must not exceed baseline_windows")
        if self.persistence_mode not in PERSISTENCE_MODES:
            raise ConfigError(
                f"{p}.persistence_mode", f"must be one of {', '.join(PERSISTENCE_MODES)}"
            )
        if not self.confirm_features or any(f not in FEATURES for f in self.confirm_features):
            raise ConfigError(
                f"{p}.confirm_features", f"must be a non-empty subset of {', '.join(FEATURES)}"
            )
        for name in ("hard_xids", "app_xids"):
            xids = getattr(self, name)
            if not isinstance(xids, frozenset) or any(
                isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in xids
            ):
                raise ConfigError(f"{p}.{name}", "must be a set of non-negative XID numbers")
        if self.hard_xids & self.app_xids:
            raise ConfigError(f"{p}.app_xids", "an XID cannot be both hard and application")

    @property
    def window_ms(self) -> int:
        return self.window_s * 1000

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form (sets and tuples as sorted lists)."""
        out = _to_dict(self)
        out["confirm_features"] = list(self.confirm_features)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DetectorSettings:
        """Build from a mapping of overrides; raises ConfigError for an unknown or bad field."""
        return _from_dict(cls, "detector", data)


@dataclass(frozen=True)
class PolicySettings:
    """Drain policy (DETECTION.md "Drain recommendation"). Times in seconds."""

    #: A straggler confirmed continuously this long, with clk or thr evidence, is drained.
    drain_after_confirmed_s: int = 600
    #: Repeat offender: confirmed (with clk/thr evidence) in this many different jobs ...
    repeat_offender_jobs: int = 2
    #: ... within this horizon (7 days).
    repeat_offender_window_s: int = 7 * 24 * 3600
    #: Effect sizes that count as clock / throttle evidence in a finding's features.
    evidence_clk_rel: float = 0.03
    evidence_thr: float = 0.05
    #: Features with |z| at least this are named in reasons (power never is).
    evidence_z: float = 3.5
    #: Lifetime of recommendations (expires_ms = ts_ms + this).
    hard_expiry_s: int = 7 * 24 * 3600
    drain_expiry_s: int = 24 * 3600
    alert_expiry_s: int = 3600
    #: Longest reason text (scontrol Reason=, without the controller's prefix).
    reason_max_chars: int = 100
    #: ALERT on a SUSPECT episode, on a CONFIRMED one, and on a WARNING health result.
    alert_on_suspect: bool = True
    alert_on_confirmed: bool = True
    alert_on_health_warning: bool = True
    #: Length of the hex ids (sha256, truncated).
    id_hex_chars: int = 32

    def __post_init__(self) -> None:
        p = "policy"
        _check_int(p, self, ("drain_after_confirmed_s", "repeat_offender_window_s"), 0)
        _check_int(p, self, ("hard_expiry_s", "drain_expiry_s", "alert_expiry_s"), 1)
        _check_int(p, self, ("repeat_offender_jobs",), 2)
        _check_int(p, self, ("reason_max_chars",), 20)
        _check_int(p, self, ("id_hex_chars",), 16)
        _check_fraction(p, self, ("evidence_clk_rel", "evidence_thr"))
        _check_positive(p, self, ("evidence_clk_rel", "evidence_thr", "evidence_z"))
        _check_bool(p, self, ("alert_on_suspect", "alert_on_confirmed", "alert_on_health_warning"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicySettings:
        """Build from a mapping of overrides; raises ConfigError for an unknown or bad field."""
        return _from_dict(cls, "policy", data)
