"""PeerComparison tells an absent value (None) from a NaN given in a window: absent features
are skipped, a NaN is refused (it has no rank), also beside Nones of the same feature."""

from __future__ import annotations

from typing import Any

import pytest

from peerwatch.streams.core.peers import PeerComparison
from peerwatch.streams.core.settings import DetectorSettings


def _group(n: int, **override: Any) -> list[dict[str, Any]]:
    group = [
        {"node": f"n{i}", "gpu_index": 0, "clk_ratio": 1.0 - 0.001 * i, "sm_frac": 0.9,
         "throttle_frac": 0.0, "power_ratio": 0.8, "step_ms": None}
        for i in range(n)
    ]  # fmt: skip
    for i, (name, value) in enumerate(override.items()):
        group[i][name] = value
    return group


def test_a_feature_no_gpu_reports_is_skipped() -> None:
    cmp = PeerComparison(_group(8), DetectorSettings())
    assert "step" not in {feat.name for feat, *_ in cmp.active}
    assert cmp.evaluated.all()


def test_a_nan_beside_nones_is_refused() -> None:
    group = _group(8)
    group[0]["step_ms"] = float("nan")  # one NaN among seven Nones
    with pytest.raises(ValueError, match="NaN"):
        PeerComparison(group, DetectorSettings())


def test_a_nan_among_values_is_refused() -> None:
    with pytest.raises(ValueError, match="NaN"):
        PeerComparison(_group(8, clk_ratio=float("nan")), DetectorSettings())
