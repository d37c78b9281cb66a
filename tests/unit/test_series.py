"""The bounded series store behind the OTLP observable instruments."""

from __future__ import annotations

import pytest
from fakes import FakeClock

from peerwatch.exporters.otlp import MetricPoint
from peerwatch.exporters.series import SeriesStore


def point(name: str, value: float, **attrs: object) -> MetricPoint:
    return MetricPoint(name, value, {"slurm.job.id": "1", **attrs},  # type: ignore[dict-item]
                       "counter" if name == "c" else "gauge")  # fmt: skip


def test_identity_attributes_replace_values_extra_attributes_separate_them() -> None:
    store = SeriesStore(clock=FakeClock(0))
    key = ("1", "n", 0)
    store.apply_window(key, 0, [point("g", 1.0), point("c", 2.0, **{"error.type": "a"})])
    # the user became known later: same series, value replaced, not duplicated
    store.apply_window(key, 1, [point("g", 5.0, **{"slurm.user": "bob"}),
                                point("c", 3.0, **{"error.type": "b"})])  # fmt: skip
    assert store.observe("g") == [(5.0, {"slurm.job.id": "1", "slurm.user": "bob"})]
    assert sorted(v for v, _ in store.observe("c")) == [2.0, 3.0]


def test_ended_job_memory_is_bounded() -> None:
    store = SeriesStore(max_ended_jobs=2, clock=FakeClock(0))
    for job in ("a", "b", "c"):
        store.job_ended(job)
    assert store.apply_window(("a", "n", 0), 0, [point("g", 1.0)])  # forgotten: accepted again
    assert not store.apply_window(("c", "n", 0), 0, [point("g", 1.0)])


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SeriesStore(max_series=0)
