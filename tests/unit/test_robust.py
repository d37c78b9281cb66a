"""Median, MAD and robust z with floors."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerwatch.streams.core.robust import array_median, mad, median, robust_stats, robust_z

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@pytest.mark.parametrize(
    ("values", "expected_median", "expected_mad"),
    [
        ([1.0], 1.0, 0.0),
        ([1.0, 3.0], 2.0, 1.0),
        ([1.0, 2.0, 3.0, 4.0, 100.0], 3.0, 1.0),
        ([0.9] * 7 + [0.5], 0.9, 0.0),
    ],
)
def test_median_and_mad(values: list[float], expected_median: float, expected_mad: float) -> None:
    assert median(values) == pytest.approx(expected_median)
    assert mad(values) == pytest.approx(expected_mad)


@pytest.mark.parametrize("bad", [[], [1.0, math.nan]])
def test_empty_or_nan_group_raises(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        median(bad)


def test_robust_z_follows_the_formula() -> None:
    assert robust_z(0.85, 0.90, 0.009) == pytest.approx(0.6745 * -0.05 / 0.009)
    assert robust_z(1.0, 1.0, 0.0) == 0.0
    assert robust_z(2.0, 1.0, 0.0) == math.inf
    assert robust_z(0.0, 1.0, 0.0) == -math.inf


@pytest.mark.parametrize(
    ("floor_abs", "floor_rel", "expected_mad"),
    [(0.0, 0.0, 0.001), (0.02, 0.0, 0.02), (0.0, 0.01, 0.009), (0.0, 0.0001, 0.001)],
)
def test_mad_floor(floor_abs: float, floor_rel: float, expected_mad: float) -> None:
    values = [0.899, 0.900, 0.901, 0.900, 0.899, 0.901, 0.900, 0.85]
    stats = robust_stats(values, floor_abs=floor_abs, floor_rel=floor_rel)
    assert stats.median == pytest.approx(0.900)
    assert stats.raw_mad == pytest.approx(0.001)
    assert stats.mad == pytest.approx(expected_mad)
    assert stats.n == 8
    assert stats.z(0.85) == pytest.approx(0.6745 * (0.85 - 0.9) / expected_mad)


@given(st.lists(finite, min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_order_does_not_matter_and_matches_statistics(
    values: list[float], rnd: random.Random
) -> None:
    shuffled = values[:]
    rnd.shuffle(shuffled)
    assert median(shuffled) == median(values) == statistics.median(values)
    assert mad(shuffled) == mad(values) >= 0


@given(st.lists(finite, min_size=1, max_size=60), st.floats(0.0, 10.0), st.floats(0.0, 0.5))
def test_floored_mad_is_at_least_the_floor(
    values: list[float], floor_abs: float, floor_rel: float
) -> None:
    stats = robust_stats(values, floor_abs=floor_abs, floor_rel=floor_rel)
    assert stats.mad >= max(floor_abs, floor_rel * abs(stats.median))
    assert stats.mad >= stats.raw_mad


@given(st.lists(st.floats(0.5, 1.0), min_size=8, max_size=64), st.floats(0.5, 1.0))
def test_z_sign_follows_the_side_of_the_median(values: list[float], x: float) -> None:
    stats = robust_stats(values, floor_rel=0.01)
    z = stats.z(x)
    assert math.isfinite(z)
    assert (z > 0) == (x > stats.median) and (z < 0) == (x < stats.median)


def _same_float(a: float, b: float) -> bool:
    return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf - inf, overflow: as np.median
def test_array_median_is_np_median_bit_for_bit() -> None:
    """Signed zeros, infinities and overflow included: the detector's z-scores and findings
    must not move by a bit against np.median."""
    rng = np.random.default_rng(3)
    pool = [-0.0, 0.0, 1.0, 0.5, -2.0, math.inf, -math.inf, 1e-300, 3.3, 1e308]
    cases = [np.array(c) for c in ([-0.0], [-0.0, -0.0], [-0.0, 0.0], [0.0, -0.0],
                                   [-0.0] * 3, [math.inf, -math.inf], [1e308, 1e308])]  # fmt: skip
    for n in range(1, 200):
        cases += [rng.choice(pool, n), rng.random(n) - 0.5]
    for x in cases:
        assert _same_float(array_median(x.copy()), float(np.median(x))), x.tolist()
