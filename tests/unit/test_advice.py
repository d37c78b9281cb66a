"""Plain advice per flagged GPU: what happened, what was done, what the owner can do."""

from __future__ import annotations

from dataclasses import replace

import pytest

from peerwatch.report.advice import advice
from peerwatch.report.job_summary import FlaggedGpu
from peerwatch.streams.core.slowdown import slowdown, slowdown_text

SLOW = FlaggedGpu(
    node="gpu00005", gpu_index=3, status="CONFIRMED", cause="CLOCKS", reason="", evidence=[],
    hard_rules=[], first_flagged_ms=0, last_flagged_ms=1, cleared_ms=None, feature="clk",
    slow_frac=0.08, slow_s=18 * 60, node_outcome=None, node_outcome_ms=None,
)  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"node_outcome": "node drained"},
         "GPU 3 on gpu00005 ran 8.0% slow (SM clock) for 18 min: its node was drained; resubmit "
         "with --exclude=gpu00005, or nothing to do if the job was requeued."),
        ({"node_outcome": "node drain recommended"}, "its node is recommended for draining"),
        ({}, "a fault of the node (clocks), not of your code; resubmit with --exclude=gpu00005"),
        ({"cause": "UNKNOWN"}, "the cause is not named; if your job runs slow again on gpu00005"),
        ({"cleared_ms": 5}, "it recovered; nothing to do unless it happens again."),
        ({"status": "HARD_ERROR", "hard_rules": ["xid_79"], "cause": "HARDWARE", "feature": None},
         "GPU 3 on gpu00005 hit a hard error (xid_79): a fault of the node (hardware)"),
        ({"feature": "thr", "slow_frac": 0.6, "cause": "THERMAL"},
         "was throttled 60 points more than its peers for 18 min"),
    ],
)  # fmt: skip
def test_advice_says_what_happened_and_what_to_do(changes: dict[str, object], said: str) -> None:
    assert said in advice(replace(SLOW, **changes))  # type: ignore[arg-type]


def test_slowdown_is_the_mean_over_findings_in_the_slow_direction() -> None:
    def f(feature: str, value: float, med: float) -> dict[str, object]:
        return {"features": [{"feature": feature, "value": value, "peer_median": med, "z": -5}]}

    assert slowdown([f("clk", 0.92, 1.0), f("clk", 0.94, 1.0)], "clk") == pytest.approx(0.07)
    assert slowdown([f("step", 110.0, 100.0)], "step") == pytest.approx(0.10)
    assert slowdown([f("sm", 1.1, 1.0)], "sm") == pytest.approx(0.10)
    assert slowdown([f("thr", 0.5, 0.1)], "thr") == pytest.approx(0.4)
    assert slowdown([f("clk", float("nan"), 1.0), {"features": "x"}, {}], "clk") is None
    assert slowdown([f("clk", 0.9, 0.0)], "clk") is None and slowdown([], None) is None
    assert slowdown_text("clk", 0.0825) == "8.2% slow (SM clock)"
    assert slowdown_text("sm", 0.11) == "11.0% off (SM activity)"
    assert slowdown_text(None, None) == "slow (its signals)"
