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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from peerwatch.schemas.records import FeatureEvidence, GpuWindow
from peerwatch.streams.core.detector_state import GpuDetectorState
from peerwatch.streams.core.model import field_rows, gpu_key
from peerwatch.streams.core.robust import median, robust_stats, robust_z
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.core.window_columns import FloatColumn, float_column


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
    #: z -> slow-direction z, element-wise (None: never a candidate)
    slow: Callable[[np.ndarray], np.ndarray] | None
    #: (values, median, settings) -> material effect, element-wise
    material: Callable[[np.ndarray, float, DetectorSettings], np.ndarray]


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
        np.abs,
        lambda x, m, s: np.abs(x - m) >= s.effect_sm,
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
        lambda x, m, s: np.zeros(len(x), np.bool_),
    ),
)


def _evidence(
    feature: str, value: float, stats_median: float, mad: float, z: float
) -> FeatureEvidence:
    return {"feature": feature, "value": value, "peer_median": stats_median, "mad": mad, "z": z}


def _running_max(best: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Element-wise ``max`` as Python's built-in takes it over features in order: the first of
    equal values stays (``-0.0`` before ``0.0`` stays ``-0.0``), NaN (an absent feature) never
    wins."""
    take = ~np.isnan(values) & (np.isnan(best) | (values > best))
    out: np.ndarray = np.where(take, values, best)
    return out


class PeerComparison:
    """Every GPU of one peer group compared at once (numpy, one vector operation per feature).

    The per-GPU results are arrays in group order: ``flagged`` (a candidate by any feature),
    ``evaluated``, ``score`` and ``confirm_score`` (None where no feature applied). A GPU's
    whole :class:`GpuVerdict`, with its evidence dicts, is built only when asked
    (:meth:`verdict`): the detector asks for the flagged GPUs and those inside an episode, a few
    of a group's hundreds. A feature is compared only when at least ``min_peers`` GPUs of the
    group report it (so step_ms from StepTime is used when present and ignored otherwise);
    missing values (None) are absent features; a NaN among the present values raises
    ValueError (it has no rank).
    A z that is NaN (infinite values on both sides) is no candidate and no score.
    """

    def __init__(
        self,
        group: Sequence[GpuWindow],
        settings: DetectorSettings,
        floats: Mapping[str, FloatColumn] | None = None,
    ) -> None:
        """``floats``: the group's compared fields as columns (read from ``group`` when not
        given)."""
        self.group = group
        self.settings = settings
        n = len(group)
        confirm = set(settings.confirm_features)
        #: (feature, median, mad, z_scale, confirming, values with NaN where absent, z)
        self.active: list[tuple[_Feature, float, float, float, bool, np.ndarray, np.ndarray]] = []
        for feat in FEATURES:
            col = (
                floats[feat.field]
                if floats is not None
                else float_column(field_rows(group, feat.field))
            )
            if col.nan_given is not None and col.nan_given.any():
                raise ValueError("median of a group holding NaN")
            x = col.values
            absent = np.isnan(x)
            present = x[~absent]
            if len(present) < settings.min_peers:
                continue
            st = robust_stats(
                present,
                floor_abs=feat.floor_abs(settings),
                floor_rel=feat.floor_rel(settings),
                z_scale=settings.z_scale,
            )
            diff = x - st.median
            if st.mad > 0:
                z = st.z_scale * diff / st.mad
            else:
                z = np.where(diff == 0, 0.0, np.copysign(np.inf, diff))
            self.active.append((feat, st.median, st.mad, st.z_scale, feat.name in confirm, x, z))
        self.flags: dict[str, np.ndarray] = {}
        score = np.full(n, np.nan)
        confirm_score = np.full(n, np.nan)
        z_threshold = settings.z_threshold
        with np.errstate(invalid="ignore"):
            for feat, center, _, _, confirming, x, z in self.active:
                if feat.slow is None:
                    continue
                slow = feat.slow(z)
                score = _running_max(score, slow)
                if confirming:
                    confirm_score = _running_max(confirm_score, slow)
                material = feat.material(x, center, settings)
                self.flags[feat.name] = (slow >= z_threshold) & material
        self.flagged = np.zeros(n, np.bool_)
        for mask in self.flags.values():
            self.flagged |= mask
        self.evaluated: np.ndarray = ~np.isnan(score)
        self.score: list[float | None] = [None if v != v else v for v in score.tolist()]
        self.confirm_score: list[float | None] = [
            None if v != v else v for v in confirm_score.tolist()
        ]

    def verdict(self, i: int, key: str | None = None) -> GpuVerdict:
        """The whole verdict of the group's ``i``-th GPU, evidence included."""
        w = self.group[i]
        evidence: list[FeatureEvidence] = []
        for feat, center, spread, z_scale, _, x, _ in self.active:
            value = float(x[i])
            if value != value:
                continue
            z = robust_z(value, center, spread, z_scale)
            evidence.append(_evidence(feat.name, value, center, spread, z))
        return GpuVerdict(
            key=key if key is not None else gpu_key(w["node"], w["gpu_index"]),
            evaluated=bool(self.evaluated[i]),
            flags=frozenset(name for name, mask in self.flags.items() if mask[i]),
            score=self.score[i],
            confirm_score=self.confirm_score[i],
            evidence=evidence,
        )


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
    # In a fleet shift (a power cap, a cooling event) the GPU is expected where its partition
    # moved: judged against its own past times the partition's move, never above its past.
    fleet = window.get("fleet_clk_ratio")
    if fleet is not None and 0 < float(fleet) < 1:
        base *= float(fleet)
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
