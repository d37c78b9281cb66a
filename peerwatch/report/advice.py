"""Plain advice for a job's owner, one sentence per flagged GPU, in the manner of Princeton's
jobstats: what happened, what was done about it, what the owner can do.

"GPU 3 on gpu00005 ran 8.0% slow (SM clock) for 18 min: its node was drained; resubmit with
--exclude=gpu00005, or nothing to do if the job was requeued."

A pure function of a :class:`~peerwatch.report.job_summary.FlaggedGpu`; the numbers are
the ones the verdict gives (the slowdown of :mod:`peerwatch.streams.core.slowdown`).
"""

from __future__ import annotations

from typing import Any

from peerwatch.streams.core.slowdown import duration_text, slowdown_text

#: Causes outside the job's own code (DETECTION.md's cause names).
_SITE_CAUSES = {"THERMAL", "POWER", "CLOCKS", "HARDWARE", "LINK"}


def advice(gpu: Any) -> str:
    """One sentence for the owner about a flagged GPU (a ``FlaggedGpu``): what it did, what
    happened to its node, and what to do. Raises nothing for missing fields."""
    node, index = gpu.node, gpu.gpu_index
    if gpu.status == "HARD_ERROR":
        rules = ", ".join(gpu.hard_rules) or "a hard rule"
        what = f"GPU {index} on {node} hit a hard error ({rules})"
    else:
        how = slowdown_text(gpu.feature, gpu.slow_frac)
        verb = "was" if gpu.feature == "thr" and gpu.slow_frac is not None else "ran"
        what = f"GPU {index} on {node} {verb} {how} for {duration_text(gpu.slow_s)}"
    if gpu.cleared_ms is not None and gpu.status != "HARD_ERROR":
        return f"{what}: it recovered; nothing to do unless it happens again."
    exclude = f"--exclude={node}"
    outcome = gpu.node_outcome or ""
    if outcome == "node drained":
        todo = f"its node was drained; resubmit with {exclude}, or nothing to do if the job was requeued"
    elif outcome == "node drain recommended":
        todo = (f"its node is recommended for draining; if the job is still running slow, "
                f"resubmit with {exclude}")  # fmt: skip
    elif gpu.cause in _SITE_CAUSES or gpu.status == "HARD_ERROR":
        todo = (f"a fault of the node ({gpu.cause.lower()}), not of your code; resubmit with "
                f"{exclude} and tell the cluster admins")  # fmt: skip
    else:
        todo = (f"the cause is not named; if your job runs slow again on {node}, resubmit "
                f"with {exclude} and tell the cluster admins")  # fmt: skip
    return f"{what}: {todo}."
