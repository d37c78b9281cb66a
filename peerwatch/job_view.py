"""What ``peerwatch job`` prints: a pure rendering of a :class:`~peerwatch.streams.core.job_summary.
JobSummary` as text, with ANSI colours only when asked (the command asks on a terminal)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from peerwatch.streams.core.job_inputs import TABLE_SIGNALS
from peerwatch.streams.core.job_summary import GpuRow, JobSummary

RED, GREEN, YELLOW, DIM, BOLD, RESET = (
    "\x1b[31m",
    "\x1b[32m",
    "\x1b[33m",
    "\x1b[2m",
    "\x1b[1m",
    "\x1b[0m",
)
#: Column headings and formats of the per-GPU table (short signal name -> heading, value format).
COLUMNS: dict[str, tuple[str, str]] = {
    "clk": ("SM clock", "{:.3f}"),
    "sm": ("SM activity", "{:.2f}"),
    "power": ("power W", "{:.0f}"),
    "thr": ("throttled", "{:.0%}"),
    "step": ("step ms", "{:.0f}"),
}


def fmt_time(ts_ms: int | None, with_date: bool = False) -> str:
    """UTC time of ``ts_ms`` (``-`` for None)."""
    if ts_ms is None:
        return "-"
    fmt = "%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S"
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).strftime(fmt)


def rel_text(short: str, value: float | None) -> str:
    if value is None:
        return "-"
    if short == "thr":
        return f"{value * 100:+.0f} pt"
    return f"{value * 100:+.1f}%"


def cell(short: str, value: float | None) -> str:
    return "-" if value is None else COLUMNS[short][1].format(value)


def shown_rows(summary: JobSummary, all_gpus: bool = False, slowest: int = 5) -> list[GpuRow]:
    """The table's rows: every GPU with ``all_gpus``, else the flagged GPUs and the ``slowest``
    others by SM clock against the peers."""
    if all_gpus:
        return list(summary.rows)
    flagged = [r for r in summary.rows if r.status]
    others = sorted(
        (r for r in summary.rows if not r.status),
        key=lambda r: (r.vs_peers.get("clk") is None, r.vs_peers.get("clk") or 0.0),
    )
    return flagged + others[:slowest]


def gpu_table(summary: JobSummary, rows: Sequence[GpuRow], colour: bool = False) -> list[str]:
    """The per-GPU table: each signal's mean and its difference from the peers; then the peers'
    p10, median and p90 of the per-GPU means."""
    shorts = [s for _, s, _ in TABLE_SIGNALS if s in summary.peers]
    head = f"  {'node':<12} {'GPU':>3}"
    for s in shorts:
        head += f" {COLUMNS[s][0]:>11} {'vs peers':>8}"
    head += "  status"
    lines = [head]
    for r in rows:
        line = f"  {r.node:<12.12} {r.gpu_index:>3}"
        for s in shorts:
            line += f" {cell(s, r.values.get(s)):>11} {rel_text(s, r.vs_peers.get(s)):>8}"
        if r.status:
            line += f"  {r.status} ({r.cause})"
        lines.append(f"{RED}{line}{RESET}" if colour and r.status else line)
    for i, label in enumerate(("peers p10", "peers median", "peers p90")):
        line = f"  {label:<16}"
        for s in shorts:
            line += f" {cell(s, summary.peers[s][i]):>11} {'':>8}"
        lines.append(f"{DIM}{line.rstrip()}{RESET}" if colour else line.rstrip())
    return lines


def render_text(summary: JobSummary, *, colour: bool = False, all_gpus: bool = False) -> str:
    """The whole ``peerwatch job`` output."""
    s = summary
    c = (lambda code, text: f"{code}{text}{RESET}") if colour else (lambda code, text: text)
    who = " · ".join(
        f"{k} {v}" for k, v in (("user", s.user), ("account", s.account),
                                ("partition", s.partition), ("state", s.state)) if v
    )  # fmt: skip
    title = f"Job {s.job_id}" + (f" ({s.name})" if s.name else "")
    lines = [c(BOLD, title) + (f" · {who}" if who else "")]
    lines.append(
        f"{s.gpus} GPUs on {len(s.nodes)} nodes · windows {fmt_time(s.first_window_ms, True)}"
        f" to {fmt_time(s.last_window_ms)} UTC · {s.windows} GPU windows ({s.gated_windows} gated)"
    )
    lines += ["", c(RED if s.flagged else GREEN, f"Verdict: {s.verdict}"), ""]
    if s.flagged:
        lines.append(c(BOLD, f"Flagged GPUs ({len(s.flagged)})"))
        for g in s.flagged:
            when = (
                f"flagged {fmt_time(g.first_flagged_ms)}, cleared {fmt_time(g.cleared_ms)}"
                if g.cleared_ms
                else f"flagged since {fmt_time(g.first_flagged_ms)} (latest finding "
                f"{fmt_time(g.last_flagged_ms)}, not cleared)"
            )
            lines.append(
                c(RED, f"  {g.status:<10} {g.node} GPU {g.gpu_index}")
                + f"  cause {c(YELLOW, g.cause)}  {when}"
            )
            lines += [f"      {e}" for e in g.evidence]
            if g.node_outcome:
                lines.append(f"      {g.node_outcome} at {fmt_time(g.node_outcome_ms)}")
        lines.append("")
    if s.rows:
        rows = shown_rows(s, all_gpus)
        scope = "all" if all_gpus or len(rows) == len(s.rows) else (
            "flagged and the 5 slowest by SM clock; --all for every GPU"
        )  # fmt: skip
        lines.append(c(BOLD, f"GPUs against their {len(s.rows)} peers ({scope})"))
        lines += gpu_table(s, rows, colour)
        lines.append("")
    if s.job_findings:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(s.job_findings.items()))
        lines.append(f"Job-level findings (shared cause, no GPU blamed): {kinds}")
    if s.skipped:
        lines.append("Skipped records: " + ", ".join(f"{n} {k}" for k, n in s.skipped.items()))
    return "\n".join(lines).rstrip() + "\n"
