"""The pure part of ``peerwatch bench hooks``: the Slurm prolog/epilog hooks' wall time against
a budget (the edges, running the hooks and reading Kafka back, are in
:mod:`peerwatch.streams.tools.bench_hooks_run`).

A hook runs for every job on every node, and slurmd waits for it before the job starts (prolog)
or the node is released (epilog), so its wall time is a budget: ``DEFAULT_BUDGET_MS`` by default.
The verdict is judged on the 95th percentile (nearest rank) of each hook's runs, so one run
slowed by a busy machine does not decide it; the maximum is reported beside it. Every event the
hooks stored must also reach Kafka (delivered by the detached sender), else the verdict is FAIL
whatever the timings: a fast hook that loses its event is no pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from peerwatch.streams.tools.bench import latency_summary

#: The hooks' wall-time budget (ms), as slurmd sees it: process start to exit.
DEFAULT_BUDGET_MS = 400.0
#: The percentile the budget is judged on.
VERDICT_QUANTILE = "p95"


def hook_summary(wall_ms: Sequence[float], budget_ms: float) -> dict[str, Any]:
    """count, p50, p95, max (ms) of one hook's runs, the budget and its verdict (PASS when the
    p95 is within the budget, FAIL above it, N/A with no run)."""
    summary = latency_summary(wall_ms)
    judged = summary[VERDICT_QUANTILE]
    summary["budget_ms"] = float(budget_ms)
    summary["verdict"] = "N/A" if judged is None else "PASS" if judged <= budget_ms else "FAIL"
    return summary


def hooks_report(
    wall_ms: Mapping[str, Sequence[float]],
    budget_ms: float,
    *,
    events_stored: int,
    events_delivered: int,
    failed_runs: int = 0,
) -> dict[str, Any]:
    """The report: one summary per hook (``wall_ms``: hook name -> wall times in ms), the
    delivery check (every stored event reached Kafka, no hook exited non-zero), and the overall
    verdict: PASS only when every hook passed and the delivery check holds."""
    hooks = {name: hook_summary(times, budget_ms) for name, times in wall_ms.items()}
    delivered_ok = events_delivered == events_stored and failed_runs == 0
    verdicts = {f"{name}_wall_ms": h["verdict"] for name, h in hooks.items()}
    verdicts["delivered"] = "PASS" if delivered_ok else "FAIL"
    overall = "PASS" if hooks and all(v == "PASS" for v in verdicts.values()) else "FAIL"
    return {
        "budget_ms": float(budget_ms),
        "judged_on": VERDICT_QUANTILE,
        "hooks": hooks,
        "events_stored": events_stored,
        "events_delivered": events_delivered,
        "failed_runs": failed_runs,
        "verdicts": verdicts,
        "verdict": overall,
    }


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f}"


def format_hooks_table(report: Mapping[str, Any]) -> str:
    """The human-readable report: one line per hook, the delivery line, the verdict."""
    lines = [
        f"{'hook':<8} {'runs':>5} {'p50 ms':>9} {'p95 ms':>9} {'max ms':>9} "
        f"{'budget':>9}  verdict ({report['judged_on']})"
    ]
    for name, h in report["hooks"].items():
        lines.append(
            f"{name:<8} {h['count']:>5} {_ms(h['p50']):>9} {_ms(h['p95']):>9} "
            f"{_ms(h['max']):>9} {_ms(h['budget_ms']):>9}  {h['verdict']}"
        )
    lines.append(
        f"delivered {report['events_delivered']} of {report['events_stored']} events to Kafka, "
        f"{report['failed_runs']} hook runs failed: {report['verdicts']['delivered']}"
    )
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)
