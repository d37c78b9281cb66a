"""The named cause of a straggler finding: from the window's evidence, and on the findings."""

from __future__ import annotations

from typing import Any

import pytest
from windowgen import SETTINGS_30S, run, window, with_overrides

from peerwatch.streams.core.causes import majority_cause, straggler_cause
from peerwatch.streams.core.model import JobContext

SLOW_CLK = {"clk_ratio": 0.80}


@pytest.mark.parametrize(
    ("fields", "flags", "cause"),
    [
        ({"thermal_frac": 0.6, "throttle_frac": 0.6}, {"clk", "thr"}, "THERMAL"),
        ({"power_brake_frac": 0.4, "throttle_frac": 0.4}, {"clk", "thr"}, "POWER"),
        ({"thermal_frac": 0.2, "power_brake_frac": 0.5}, {"thr"}, "POWER"),
        ({"power_cap_frac": 0.9}, {"clk"}, "POWER"),
        ({"pcie_link_width_min": 8, "pcie_link_width_max": 16}, {"clk"}, "LINK"),
        ({"nvlink_errors_delta": 12}, {"step"}, "LINK"),
        ({}, {"clk"}, "CLOCKS"),
        ({"thermal_frac": 0.01, "power_cap_frac": 0.2}, {"clk"}, "CLOCKS"),
        ({}, {"sm"}, "HOST"),
        # a data-loader stall during a cooling event: every peer is in thermal slowdown too
        ({"thermal_frac": 1.0, "throttle_frac": 1.0}, {"sm"}, "HOST"),
        ({"thermal_frac": 1.0, "throttle_frac": 1.0}, {"sm", "thr"}, "THERMAL"),
        ({"throttle_frac": 0.5}, {"thr"}, "UNKNOWN"),  # HW slowdown alone names nothing
        ({}, {"step"}, "UNKNOWN"),
    ],
)
def test_cause_from_the_evidence(fields: dict[str, Any], flags: set[str], cause: str) -> None:
    w: Any = window("j", 0, 0, **fields)
    assert straggler_cause(w, flags, SETTINGS_30S) == cause


def test_sm_above_the_peers_is_not_a_host_stall() -> None:
    w: Any = window("j", 0, 0)
    assert straggler_cause(w, {"sm"}, SETTINGS_30S, sm_low=False) == "UNKNOWN"


def test_majority_cause() -> None:
    assert majority_cause([]) == "UNKNOWN"
    assert majority_cause(["HOST", "CLOCKS", "HOST"]) == "HOST"
    assert majority_cause(["HOST", "THERMAL"]) == "THERMAL"  # a tie: the first in enum order


@pytest.mark.parametrize(
    ("fields", "cause"),
    [
        ({"clk_ratio": 0.80, "throttle_frac": 0.7, "thermal_frac": 0.7}, "THERMAL"),
        ({"clk_ratio": 0.80, "throttle_frac": 0.7, "power_brake_frac": 0.7}, "POWER"),
        ({"clk_ratio": 0.80}, "CLOCKS"),
        ({"sm_frac": 0.40}, "HOST"),
    ],
)
def test_every_straggler_finding_and_its_clearing_carry_the_cause(
    fields: dict[str, Any], cause: str
) -> None:
    job = JobContext(job_id="j", expected_gpus=16, start_ms=0)

    def make(k: int) -> list[dict[str, Any]]:
        base = [window("j", i, k) for i in range(16)]
        return with_overrides(base, {3: fields}) if 2 <= k < 8 else base

    results, _ = run(job, make, range(20))
    found = [f for r in results for f in r.findings]
    assert found and {f["status"] for f in found} >= {"SUSPECT", "CLEARED"}
    assert {f["cause"] for f in found} == {cause}
    assert all(f["detected_ms"] == f["window_end_ms"] for f in found)


def test_job_wide_finding_names_the_shared_cause() -> None:
    job = JobContext(job_id="j", expected_gpus=16, start_ms=0)

    def make(k: int) -> list[dict[str, Any]]:
        base = [window("j", i, k) for i in range(16)]
        slow = {i: {"sm_frac": 0.40} for i in range(5)}  # 5 of 16: more than 25%
        return with_overrides(base, slow) if k >= 2 else base

    results, _ = run(job, make, range(4))
    wide = [f for r in results for f in r.findings if f["status"] == "JOB_WIDE"]
    assert [f["cause"] for f in wide] == ["HOST"]


def test_hard_findings_name_hardware_or_link() -> None:
    job = JobContext(job_id="j", expected_gpus=16, start_ms=0)

    def make(k: int) -> list[dict[str, Any]]:
        base = [window("j", i, k) for i in range(16)]
        return with_overrides(base, {1: {"xids": [79]}, 2: {"pcie_link_width_min": 4}})

    results, _ = run(job, make, range(1))
    hard = {f["gpu_index"]: f["cause"] for f in results[0].findings}
    assert hard == {1: "HARDWARE", 2: "LINK"}
