"""What ``peerwatch job`` prints: a pure rendering of a :class:`~peerwatch.report.job_summary.
JobSummary` as rich renderables (tables that fit the terminal's width), with colours only when
the console has them. Every field that comes from outside (job name, user, account, partition,
node names, causes, evidence) goes through :func:`peerwatch.console.user_text`: escaped, capped
and never read as markup."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from peerwatch.console import render, table, user_text
from peerwatch.display import TEXT_MAX_CHARS
from peerwatch.producers.slurm.hostlist import hostlist_text
from peerwatch.report.advice import advice
from peerwatch.report.job_inputs import TABLE_SIGNALS
from peerwatch.report.job_summary import GpuRow, JobSummary
from peerwatch.report.network import line_text
from peerwatch.streams.core.slowdown import slowdown_text

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
    """A job-mean difference from the peers: ``-8.1%`` (``+30 pt`` for the throttled share)."""
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


def gpu_table(summary: JobSummary, rows: Sequence[GpuRow]) -> Table:
    """The per-GPU table: per signal the GPU's mean over the job and its difference from the
    peers (one cell, ``0.912 -8.1%``, so the table fits 80 columns); then the peers' p10,
    median and p90 of the per-GPU means. Flagged rows in red."""
    shorts = [s for _, s, _ in TABLE_SIGNALS if s in summary.peers]
    t = table("node", "GPU", *(f"{COLUMNS[s][0]}\nvs peers" for s in shorts), "status",
              right=tuple(range(1, 2 + len(shorts))))  # fmt: skip
    for r in rows:
        values = [
            f"{cell(s, r.values.get(s))} {rel_text(s, r.vs_peers.get(s))}"
            if r.values.get(s) is not None
            else "-"
            for s in shorts
        ]
        status = Text(f"{r.status} ") + user_text(r.cause, 24) if r.status else Text("")
        t.add_row(user_text(r.node, 40), str(r.gpu_index), *values, status,
                  style="red" if r.status else None)  # fmt: skip
    for i, label in enumerate(("peers p10", "peers median", "peers p90")):
        t.add_row(label, "", *(cell(s, summary.peers[s][i]) for s in shorts), "", style="dim")
    return t


def _flagged_block(summary: JobSummary) -> list[Any]:
    out: list[Any] = [Text(f"Flagged GPUs ({len(summary.flagged)})", style="bold")]
    for g in summary.flagged:
        when = (
            f"flagged {fmt_time(g.first_flagged_ms)}, cleared {fmt_time(g.cleared_ms)}"
            if g.cleared_ms
            else f"flagged since {fmt_time(g.first_flagged_ms)} (latest finding "
            f"{fmt_time(g.last_flagged_ms)}, not cleared)"
        )
        head = Text(f"{g.status:<10} ", style="red")
        head += user_text(g.node, 40, style="red") + Text(f" GPU {g.gpu_index}", style="red")
        head += Text("  cause ") + user_text(g.cause, 24, style="yellow") + Text(f"  {when}")
        out.append(Padding(head, (0, 0, 0, 2), expand=False))
        lines = [Text(f"slowdown: {slowdown_text(g.feature, g.slow_frac)}")] if g.feature else []
        lines += [user_text(e, TEXT_MAX_CHARS) for e in g.evidence]
        if g.node_outcome:
            lines.append(Text(f"{g.node_outcome} at {fmt_time(g.node_outcome_ms)}"))
        lines.append(Text("what to do: ") + user_text(advice(g), TEXT_MAX_CHARS * 2))
        out += [
            Padding(line, (0, 0, 0, 6), expand=False) for line in lines
        ]  # wrapped lines stay indented
    out.append(Text(""))
    return out


def _network_block(summary: JobSummary) -> list[Any]:
    """The ports (and leaf switches) of the job's nodes the stream named, worst first."""
    out: list[Any] = [Text("Network: ports of the job's nodes the stream named", style="bold")]
    for line in summary.network:
        style = "red" if line.action == "DRAIN" or "HARD_ERROR" in line.statuses else "yellow"
        out.append(Padding(user_text(line_text(line), TEXT_MAX_CHARS * 2, style=style),
                           (0, 0, 0, 2), expand=False))  # fmt: skip
    out.append(Text(""))
    return out


def renderables(summary: JobSummary, *, all_gpus: bool = False) -> list[Any]:
    """The whole ``peerwatch job`` output as rich renderables, top to bottom."""
    s = summary
    who = [(k, v) for k, v in (("user", s.user), ("account", s.account),
                               ("partition", s.partition), ("state", s.state)) if v]  # fmt: skip
    title = Text(f"Job {display(s.job_id)}", style="bold")
    if s.name:
        title += Text(" (", style="bold") + user_text(s.name, style="bold") + Text(")", "bold")
    for k, v in who:
        title += Text(f" · {k} ") + user_text(v, 40)
    out: list[Any] = [
        title,
        Text(
            f"{s.gpus} GPUs on {len(s.nodes)} nodes"
            + (f" ({display(hostlist_text(s.nodes), 200)})" if s.nodes else "")
            + f" · windows {fmt_time(s.first_window_ms, True)}"
            f" to {fmt_time(s.last_window_ms)} UTC · {s.windows} GPU windows "
            f"({s.gated_windows} gated)"
        ),
        Text(""),
        Text("Verdict: ", style="red" if s.flagged else "green")
        + user_text(s.verdict, TEXT_MAX_CHARS, style="red" if s.flagged else "green"),
        Text(""),
    ]
    if s.flagged:
        out += _flagged_block(s)
    if s.network:
        out += _network_block(s)
    if s.rows:
        rows = shown_rows(s, all_gpus)
        scope = "all" if all_gpus or len(rows) == len(s.rows) else (
            "flagged and the 5 slowest by SM clock; --all for every GPU"
        )  # fmt: skip
        out.append(Text(f"GPUs against their {len(s.rows)} peers ({scope}); "
                        "means over the job", style="bold"))  # fmt: skip
        out += [gpu_table(s, rows), Text("")]
    if s.job_findings:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(s.job_findings.items()))
        out.append(user_text(f"Job-level findings (shared cause, no GPU blamed): {kinds}",
                             TEXT_MAX_CHARS))  # fmt: skip
    if s.skipped:
        out.append(user_text("Skipped records: " + ", ".join(f"{n} {k}" for k, n in
                                                             s.skipped.items()), TEXT_MAX_CHARS))  # fmt: skip
    return out


def display(value: Any, max_chars: int = 40) -> str:
    """A field (a job id, a hostlist) as :func:`peerwatch.display.display_text` shows it."""
    from peerwatch.display import display_text

    return display_text(value, max_chars)


def render_text(
    summary: JobSummary, *, colour: bool = False, all_gpus: bool = False, width: int = 100
) -> str:
    """The whole ``peerwatch job`` output as text of ``width`` columns (ANSI colours only with
    ``colour``); the command prints :func:`renderables` to the terminal instead."""
    return render([Group(*renderables(summary, all_gpus=all_gpus))], width=width, colour=colour)
