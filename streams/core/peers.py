"""Per-GPU verdicts for one window: robust z against the peer group, or the GPU's own baseline.

Directions (DETECTION.md): clk slow = lower, thr slow = higher, step slow = higher, sm is
compared both ways; power is evidence only and never makes a candidate.

Own baseline (groups smaller than ``min_peers``): the GPU's clk is compared with the median of
its own clk over its last ``baseline_windows`` clean, un-capped evaluated windows (once at least
``baseline_min_windows`` are known). With no spread to estimate, a drop of at least
``effect_clk_rel`` below that median makes a candidate; the reported z uses the clk MAD floor
(1% of the baseline) so that scores stay comparable with peer scores. A window spent at the SW
power cap for ``baseline_power_cap_excuse`` or more is excused (a site-wide cap is no fault of
the GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from peerwatch.schemas.records import FeatureEvidence, GpuWindow
from peerwatch.streams.core.detector_state import GpuDetectorState
from peerwatch.streams.core.model import gpu_key
from peerwatch.streams.core.robust import RobustStats, median, robust_stats, robust_z
from peerwatch.streams.core.settings import DetectorSettings


@dataclass(frozen=True)
class GpuVerdict:
    """One GPU in one window. ``flags``: features that made it a candidate (empty = clean).

    ``evaluated`` is False when no verdict could be made (no data, no baseline yet).
    ``score``: largest slow-direction z; ``confirm_score``: the same over the confirming
    features only (the CUSUM input). ``evidence``: FeatureEvidence dicts.
    """

    key: str
    evaluated: bool
    flags: frozenset[str] = frozenset()
    score: float | None = None
    confirm_score: float | None = None
    evidence: list[FeatureEvidence] = field(default_factory=list)
    baseline: bool = False
    excused: bool = False


#: The GpuWindow fields compared across peers.
FeatureField = Literal["clk_ratio", "throttle_frac", "sm_frac", "step_ms", "power_ratio"]


@dataclass(frozen=True)
class _Feature:
    name: str
    field: FeatureField
    floor_abs: Callable[[DetectorSettings], float]
    floor_rel: Callable[[DetectorSettings], float]
    #: z -> slow-direction z (None: never a candidate)
    slow: Callable[[float], float] | None
    #: (value, median, settings) -> material effect
    material: Callable[[float, float, DetectorSettings], bool]


def _zero(_: DetectorSettings) -> float:
    return 0.0


FEATURES: tuple[_Feature, ...] = (
    _Feature(
        "clk",
        "clk_ratio",
        _zero,
        lambda s: s.mad_floor_clk_rel,
        lambda z: -z,
        lambda x, m, s: m - x >= s.effect_clk_rel * m,
    ),
    _Feature(
        "thr",
        "throttle_frac",
        lambda s: s.mad_floor_thr,
        _zero,
        lambda z: z,
        lambda x, m, s: x - m >= s.effect_thr,
    ),
    _Feature(
        "sm",
        "sm_frac",
        lambda s: s.mad_floor_sm,
        _zero,
        abs,
        lambda x, m, s: abs(x - m) >= s.effect_sm,
    ),
    _Feature(
        "step",
        "step_ms",
        _zero,
        lambda s: s.mad_floor_step_rel,
        lambda z: z,
        lambda x, m, s: x - m >= s.effect_step_rel * m,
    ),
    _Feature(
        "power",
        "power_ratio",
        lambda s: s.mad_floor_power,
        _zero,
        None,
        lambda x, m, s: False,
    ),
)


def _evidence(
    feature: str, value: float, stats_median: float, mad: float, z: float
) -> FeatureEvidence:
    return {"feature": feature, "value": value, "peer_median": stats_median, "mad": mad, "z": z}


def peer_verdicts(group: Sequence[GpuWindow], settings: DetectorSettings) -> list[GpuVerdict]:
    """Verdicts for a group of at least ``min_peers`` reporting GPU windows (same order).

    A feature is compared only when at least ``min_peers`` GPUs of the group report it (so
    step_ms from StepTime is used when present and ignored otherwise).
    """
    stats: dict[str, RobustStats] = {}
    for feat in FEATURES:
        values = [float(v) for w in group if (v := w.get(feat.field)) is not None]
        if len(values) >= settings.min_peers:
            stats[feat.name] = robust_stats(
                values,
                floor_abs=feat.floor_abs(settings),
                floor_rel=feat.floor_rel(settings),
                z_scale=settings.z_scale,
            )
    confirm = set(settings.confirm_features)
    z_threshold = settings.z_threshold
    # The features this group compares, with their statistics unpacked (a few hundred GPUs
    # go through this loop per window: no lookups in it but the window's own fields; w.get,
    # not a bound ``get``, so that mypy types each field).
    active = [
        (feat, st.median, st.mad, st.z_scale, feat.name in confirm)
        for feat in FEATURES
        if (st := stats.get(feat.name)) is not None
    ]
    verdicts = []
    for w in group:
        evidence: list[FeatureEvidence] = []
        flags: set[str] = set()
        slow_all: list[float] = []
        slow_confirm: list[float] = []
        for feat, center, spread, z_scale, confirming in active:
            raw = w.get(feat.field)
            if raw is None:
                continue
            value = float(raw)
            z = robust_z(value, center, spread, z_scale)
            evidence.append(
                {"feature": feat.name, "value": value, "peer_median": center, "mad": spread, "z": z}
            )
            if feat.slow is None:
                continue
            slow = feat.slow(z)
            slow_all.append(slow)
            if confirming:
                slow_confirm.append(slow)
            if slow >= z_threshold and feat.material(value, center, settings):
                flags.add(feat.name)
        verdicts.append(
            GpuVerdict(
                key=gpu_key(w["node"], w["gpu_index"]),
                evaluated=bool(slow_all),
                flags=frozenset(flags),
                score=max(slow_all) if slow_all else None,
                confirm_score=max(slow_confirm) if slow_confirm else None,
                evidence=evidence,
            )
        )
    return verdicts


def baseline_verdict(
    window: GpuWindow, gpu_state: GpuDetectorState, settings: DetectorSettings
) -> GpuVerdict:
    """Verdict of one GPU of a small group against its own recent clk baseline."""
    key = gpu_key(window["node"], window["gpu_index"])
    raw = window.get("clk_ratio")
    if raw is None or len(gpu_state.baseline_clk) < settings.baseline_min_windows:
        return GpuVerdict(key=key, evaluated=False, baseline=True)
    value = float(raw)
    base = median(gpu_state.baseline_clk)
    if base <= 0:
        return GpuVerdict(key=key, evaluated=False, baseline=True)
    floor = settings.mad_floor_clk_rel * base
    z = robust_z(value, base, floor, settings.z_scale)
    cap = window.get("power_cap_frac")
    excused = cap is not None and float(cap) >= settings.baseline_power_cap_excuse
    material = base - value >= settings.effect_clk_rel * base
    flags = frozenset({"clk"}) if material and not excused else frozenset()
    return GpuVerdict(
        key=key,
        evaluated=True,
        flags=flags,
        score=-z,
        confirm_score=-z if "clk" in settings.confirm_features else None,
        evidence=[_evidence("clk", value, base, floor, z)],
        baseline=True,
        excused=excused,
    )
