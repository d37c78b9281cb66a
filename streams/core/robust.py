"""Robust statistics for peer comparison: median, MAD, robust z with a MAD floor.

:func:`robust_stats` (a peer group: hundreds of GPUs) works on numpy arrays; :func:`median`
and :func:`mad` (a few values: a job's SM activity, one GPU's baseline) in plain Python. Both
give the same value to the last bit (the middle element, or the mean of the two middle ones
computed as ``(a + b) / 2``). Every function is pure and the result does not depend on the order
of the input.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

#: 0.6745 is the 0.75 quantile of the standard normal: it makes MAD/0.6745 estimate sigma.
Z_SCALE = 0.6745


def median(values: Iterable[float]) -> float:
    """Median of ``values`` (mean of the two middle values for an even count).

    Raises ValueError when ``values`` is empty or holds a NaN (a NaN has no rank).
    """
    data = list(values)
    if not data:
        raise ValueError("median of an empty group")
    # the sum is NaN when a value is (and for +inf with -inf): the loop only then
    if math.isnan(sum(data)) and any(math.isnan(v) for v in data):
        raise ValueError("median of a group holding NaN")
    return float(statistics.median(data))


def array_median(data: np.ndarray) -> float:
    """``np.median`` of a non-empty 1-D float64 array without NaN, bit for bit: the same
    partition (numpy's own ``kth``), then the middle value or the mean of the two middle ones.
    About a fifth of ``np.median``'s cost on the few hundred values of a peer group, where its
    call overhead, not the partition, is what costs."""
    k = len(data) // 2
    part = np.partition(data, (k - 1, k, -1))
    # np.mean of the middle value(s): a sum started at +0.0 (so -0.0 comes out 0.0), divided
    if len(data) % 2:
        return float(0.0 + part[k])
    return float((0.0 + part[k - 1] + part[k]) / 2)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile ``q`` (0..1) of an already sorted, non-empty sequence.
    Raises IndexError when it is empty."""
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def mad(values: Iterable[float], center: float | None = None) -> float:
    """Median absolute deviation of ``values`` around ``center`` (default: their median).

    Raises ValueError for an empty group or a NaN.
    """
    data = list(values)
    mid = median(data) if center is None else center
    return median(abs(v - mid) for v in data)


def robust_z(value: float, center: float, spread: float, z_scale: float = Z_SCALE) -> float:
    """Robust z = z_scale * (value - center) / spread, in units of (robust) standard deviations.

    ``spread`` is the MAD after its floor. A zero spread gives 0 for a value at the center and
    +/-inf otherwise (only reachable when the caller sets no floor).
    """
    diff = value - center
    if spread > 0:
        return z_scale * diff / spread
    if diff == 0:
        return 0.0
    return math.copysign(math.inf, diff)


@dataclass(frozen=True)
class RobustStats:
    """Median and floored MAD of one feature over one peer group."""

    median: float
    mad: float  # after the floor
    raw_mad: float
    n: int
    z_scale: float = Z_SCALE

    def z(self, value: float) -> float:
        """Robust z of ``value`` against this group."""
        return robust_z(value, self.median, self.mad, self.z_scale)


def robust_stats(
    values: Sequence[float] | np.ndarray,
    *,
    floor_abs: float = 0.0,
    floor_rel: float = 0.0,
    z_scale: float = Z_SCALE,
) -> RobustStats:
    """Median and MAD of ``values`` with the MAD floored at max(floor_abs, floor_rel * |median|).

    The floor keeps a very tight group (healthy clocks agree within ~1%) from turning noise into
    huge z values. Raises ValueError for an empty group or a NaN.
    """
    data = np.asarray(values, dtype=np.float64)
    if not len(data):
        raise ValueError("median of an empty group")
    if np.isnan(data).any():
        raise ValueError("median of a group holding NaN")
    mid = array_median(data)
    raw = array_median(np.abs(data - mid))
    floor = max(floor_abs, floor_rel * abs(mid))
    return RobustStats(median=mid, mad=max(raw, floor), raw_mad=raw, n=len(values), z_scale=z_scale)
