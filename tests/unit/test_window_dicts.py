"""GpuWindow dicts made when needed: one window's dict (WindowDicts.one) equals the same window's
dict made with all the others (WindowDicts.every), field for field and in the same order; a job's
LazyWindows opens only the windows read, and keeps those when it makes them all."""

from __future__ import annotations

from peerwatch.streams.core.window_dicts import LazyWindows, WindowDicts
from tests.unit.test_window_columns import aggregator


def test_one_window_is_the_same_dict_as_every_window_makes() -> None:
    closed = aggregator(30 * 4).pop_all()
    assert closed
    for part in closed:
        dicts = WindowDicts(part)
        every = dicts.every()
        assert len(every) == dicts.n > 0
        for slot, w in enumerate(every):
            assert list(dicts.one(slot).items()) == list(w.items())  # values and field order
    varied = {k for part in closed for w in WindowDicts(part).every() for k, v in w.items()
              if v not in (None, [], 0, False)}  # fmt: skip
    assert {"xids", "lost", "pcie_link_width_min", "ecc_uncorrected_delta", "remap_pending",
            "gpu_uuid", "clk_ratio", "throttle_frac", "power_ratio", "sm_frac"} <= varied  # fmt: skip


def test_a_jobs_windows_open_only_what_is_read() -> None:
    part = aggregator(30).pop_all()[0]
    jobs = part.by_job()
    job, windows, _ = jobs[0]
    assert isinstance(windows, LazyWindows)
    first = windows[3]
    assert windows[-1] is windows[len(windows) - 1] and windows[3] is first
    every = windows.materialized()
    assert every[3] is first  # the dict read before is the one every window now holds
    assert all(w["job_id"] == job for w in windows) and list(windows) == every
    assert windows[1:3] == every[1:3]
    ordered = sorted(every, key=lambda w: (w["node"], w["gpu_index"]))
    assert every == ordered
