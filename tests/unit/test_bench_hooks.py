"""The pure part of ``peerwatch bench hooks``: summaries, the budget verdict, the table."""

from __future__ import annotations

from peerwatch.streams.tools.bench_hooks import (
    DEFAULT_BUDGET_MS,
    format_hooks_table,
    hook_summary,
    hooks_report,
)


def test_summary_judges_the_p95_against_the_budget() -> None:
    # 20 runs: 19 fast, one slow outlier. The nearest-rank p95 of 20 is the 19th value.
    times = [100.0 + i for i in range(19)] + [5000.0]
    s = hook_summary(times, 400.0)
    assert (s["count"], s["p50"], s["p95"], s["max"]) == (20, 110.0, 118.0, 5000.0)
    assert s["verdict"] == "PASS" and s["budget_ms"] == 400.0
    assert hook_summary(times, 117.0)["verdict"] == "FAIL"
    assert hook_summary(times, 118.0)["verdict"] == "PASS"  # the budget itself is within


def test_summary_without_runs_is_not_a_pass() -> None:
    s = hook_summary([], DEFAULT_BUDGET_MS)
    assert s["verdict"] == "N/A" and s["p95"] is None and s["count"] == 0


def test_report_passes_only_when_every_hook_passes_and_everything_was_delivered() -> None:
    fast, slow = [50.0, 60.0, 70.0], [50.0, 900.0, 950.0]
    ok = hooks_report({"prolog": fast, "epilog": fast}, 400.0, events_stored=6, events_delivered=6)
    assert ok["verdict"] == "PASS"
    assert ok["verdicts"] == {"prolog_wall_ms": "PASS", "epilog_wall_ms": "PASS",
                              "delivered": "PASS"}  # fmt: skip
    assert list(ok["hooks"]) == ["prolog", "epilog"]  # the order they run in
    slow_epilog = hooks_report({"prolog": fast, "epilog": slow}, 400.0,
                               events_stored=6, events_delivered=6)  # fmt: skip
    assert slow_epilog["verdict"] == "FAIL" and slow_epilog["verdicts"]["epilog_wall_ms"] == "FAIL"
    lost = hooks_report({"prolog": fast, "epilog": fast}, 400.0, events_stored=6,
                        events_delivered=5)  # fmt: skip
    assert lost["verdict"] == "FAIL" and lost["verdicts"]["delivered"] == "FAIL"
    failed = hooks_report({"prolog": fast, "epilog": fast}, 400.0, events_stored=6,
                          events_delivered=6, failed_runs=1)  # fmt: skip
    assert failed["verdict"] == "FAIL"
    assert hooks_report({}, 400.0, events_stored=0, events_delivered=0)["verdict"] == "FAIL"


def test_table_names_each_hook_its_numbers_and_the_verdicts() -> None:
    report = hooks_report({"prolog": [100.0, 200.0, 300.0], "epilog": [500.0, 600.0, 700.0]},
                          400.0, events_stored=6, events_delivered=4)  # fmt: skip
    lines = format_hooks_table(report).splitlines()
    assert "p95" in lines[0]
    prolog = next(line for line in lines if line.startswith("prolog"))
    epilog = next(line for line in lines if line.startswith("epilog"))
    assert prolog.split() == ["prolog", "3", "200.0", "300.0", "300.0", "400.0", "PASS"]
    assert epilog.split()[-1] == "FAIL"
    assert "delivered 4 of 6 events" in format_hooks_table(report)
    assert lines[-1] == "verdict: FAIL"
