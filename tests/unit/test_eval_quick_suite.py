"""CI gate: the quick evaluation suite meets the detection targets with the default settings.

Runs the labelled simulated scenarios (every fault and confounder, several seeds, jobs of 2-512
GPUs) through the same pipeline as the live stream; about 75 s of CPU time (measured
2026-12-01; one core). CPU-bound, so on a loaded machine its wall time grows with the load: under
scripts/test-under-load.sh it passed the project-wide 300 s hang guard (pyproject) and was
killed, so it has a guard of its own, against hangs only."""

from __future__ import annotations

import pytest

from peerwatch.streams.tools.eval_suites import suite
from peerwatch.streams.tools.evaluation import evaluate, parse_overrides


@pytest.mark.timeout(1800)
def test_quick_suite_meets_every_target() -> None:
    results, total, checks = evaluate(suite("quick"), parse_overrides([]))
    assert len(results) >= 20
    failed = [f"{t.name}: {t.value} (goal {t.goal})" for t in checks if not t.passed]
    assert not failed, failed
    assert total.to_dict()["false_drains"] == 0
