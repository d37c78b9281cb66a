"""Issue 39 item 6 on the real Slurm: a job name set with ``sbatch -J`` that would clear the
screen, set the window title, plant an OSC 8 hyperlink and reverse text (RLO) goes through
``squeue --json``, the watcher's parser and JobEvent, and reaches ``peerwatch job``'s view, the
demo view and the report page escaped."""

from __future__ import annotations

import re

from peerwatch.demo_view import DemoView
from peerwatch.display import is_displayable
from peerwatch.exporters.report import render_job_report
from peerwatch.job_view import render_text
from peerwatch.producers.slurm.parse import parse_squeue
from peerwatch.producers.slurm.watcher import WatchState, diff
from peerwatch.report.job_summary import summarize_job
from tests.integration.slurm_fixture import SlurmCluster

HOSTILE = (
    "[bold red]rich[/]"  # rich markup
    "\x1b[2J\x1b[H"  # clear the screen
    "\x1b]0;owned\x07"  # set the window title
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # OSC 8 hyperlink
    "\u202etxt.exe"  # right-to-left override
)
SGR = re.compile("\x1b\\[[0-9;]*m")


def test_a_hostile_sbatch_job_name_reaches_every_view_escaped(slurm_cluster: SlurmCluster) -> None:
    job_id = slurm_cluster.sbatch("-J", HOSTILE, "--wrap", "sleep 60")
    try:
        jobs = [j for j in parse_squeue(slurm_cluster.json("squeue")) if j.job_id == job_id]
        assert jobs and jobs[0].name == HOSTILE  # Slurm kept every byte of it
        _, events = diff(WatchState(), jobs, None, now_ms=1_767_225_600_000)
        [event] = [e.record for e in events if e.schema == "JobEvent"]
        assert event["job_name"] == HOSTILE
        summary = summarize_job(job_id, [], [], [], [event])
        assert summary.name == HOSTILE
        for colour in (False, True):
            for width in (80, 160):
                text = SGR.sub("", render_text(summary, colour=colour, width=width))
                assert is_displayable(text.replace("\n", "")), repr(text)
        wide = render_text(summary, width=400)
        assert "\\x1b[2J\\x1b[H\\x1b]0;owned\\x07" in wide and "[bold red]rich[/]" in wide
        view = DemoView()
        view.on_job_event({**event, "kind": "STARTED"})
        assert is_displayable(view.render(160).replace("\n", ""))
        page = render_job_report(summary, [], [], [], [("job-events", event)])
        body = page.split("<body>", 1)[1].split("<script>", 1)[0]  # before uPlot's code
        assert is_displayable(body) and "\\u202etxt.exe" in body
    finally:
        slurm_cluster.cmd("scancel", job_id)
