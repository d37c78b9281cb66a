"""The incident report in a real browser: ``peerwatch simulate --archive`` of a straggler scenario,
``peerwatch replay --archive --report`` (the whole archive: no --from/--to), then Debian's
headless Chromium renders the page (no network: the page must be self-contained). The DOM must
show the job, the straggler GPU and its finding; the screenshot must show the highlight colour.
``peerwatch job --archive`` on the same archive (which holds only inputs: the job is replayed)
names the straggler in its verdict, and its ``--html`` page renders with it."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from peerwatch.exporters.report import HIGHLIGHT
from tests.integration.archive_helpers import run
from tests.integration.png_pixels import count_colour

CHROMIUM = "/usr/bin/chromium"
START = "2026-01-01T00:00:00Z"
SCENARIO = {
    "fleet": {"nodes": 12, "gpus_per_node": 8, "interval_s": 2.0, "duration_s": 600, "seed": 5},
    "jobs": [{"job_id": "4001", "gpus": 96, "first_node": 0, "duration_s": 7200, "warmup_s": 0,
              "name": "llm", "user": "alice"}],
    "faults": [{"name": "sm_clock_drop", "node": "gpu00007", "gpu_index": 2, "start_s": 120,
                "end_s": 600, "params": {"pct": 8}}],
}  # fmt: skip


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp / 'profile'}", "--window-size=1400,2000"]  # fmt: skip
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "scenario.json").write_text(json.dumps(SCENARIO))
    run(["simulate", "--scenario", str(tmp / "scenario.json"), "--archive", str(tmp / "a")],
        dict(os.environ))  # fmt: skip
    return tmp / "a"


@pytest.fixture(scope="module")
def report(archive: Path) -> Path:
    page = archive.parent / "r.html"
    # No --from/--to: the whole archive (one hour of files, starting at START).
    run(["replay", "--archive", str(archive), "--report", str(page), "--no-progress"],
        dict(os.environ))  # fmt: skip
    return page


@pytest.fixture(scope="module")
def job(archive: Path) -> tuple[dict[str, Any], Path, str]:
    page = archive.parent / "job.html"
    out = run(["job", "4001", "--archive", str(archive), "--json", "--html", str(page)],
              dict(os.environ))  # fmt: skip
    text = run(["job", "4001", "--archive", str(archive)], dict(os.environ))
    return json.loads(out), page, text


def test_dom_shows_job_gpu_and_finding(report: Path, tmp_path: Path) -> None:
    dom = chromium(tmp_path, "--dump-dom", report.as_uri()).stdout.decode()
    assert 'data-job="4001"' in dom and "Job 4001" in dom
    # uPlot ran (no network: it is inlined) and drew the four charts with the straggler named
    # in each legend; the nodes as a Slurm hostlist, and plain advice.
    assert dom.count('<div class="uplot') == 4 and dom.count('<table class="u-legend') == 4
    assert dom.count('<div class="u-label">gpu00007 GPU 2</div>') == 4
    assert "96 GPUs on gpu[00000-00011]" in dom and "resubmit with --exclude=gpu00007" in dom
    assert "CONFIRMED" in dom and "confirmed slow vs peers" in dom
    assert "straggler confirmed gpu2 job 4001" in dom  # the recommendation's reason


def test_screenshot_shows_the_highlighted_straggler(report: Path, tmp_path: Path) -> None:
    png = tmp_path / "shot.png"
    chromium(tmp_path, f"--screenshot={png}", report.as_uri())
    red = tuple(int(HIGHLIGHT[i : i + 2], 16) for i in (1, 3, 5))
    hits, colours = count_colour(png.read_bytes(), red)  # type: ignore[arg-type]
    assert colours > 50, "the screenshot is (nearly) blank"
    assert hits > 1000, f"only {hits} pixels of the highlight colour"


def test_job_names_the_straggler_with_evidence_and_its_page_renders(
    job: tuple[dict[str, Any], Path, str], tmp_path: Path
) -> None:
    summary, page, text = job
    assert summary["user"] == "alice" and summary["gpus"] == 96
    first = summary["flagged"][0]
    assert (first["node"], first["gpu_index"], first["status"]) == ("gpu00007", 2, "CONFIRMED")
    assert first["feature"] == "clk" and 0.06 < first["slow_frac"] < 0.10
    assert summary["verdict"].startswith("GPU 2 on gpu00007 ran ")
    assert "% slow (SM clock) for " in summary["verdict"]
    assert first["cause"] in summary["verdict"] or "cause not named" in summary["verdict"]
    assert "\x1b[" not in text  # not a terminal: no colours
    assert re.search(r"^gpu00007 +2 +0\.9\d\d -\d\.\d%", text, re.M)  # the table's row
    assert " ".join(f"Verdict: {summary['verdict']}".split()) in " ".join(text.split())
    dom = chromium(tmp_path, "--dump-dom", page.as_uri()).stdout.decode()
    assert summary["verdict"] in dom
    assert 'class="flagged-gpu" data-node="gpu00007" data-gpu="2"' in dom
    assert 'data-signal="throttle_frac"' in dom and "nothing throttled" in dom


def test_hostile_names_stay_text_in_the_browser(tmp_path: Path) -> None:
    """A node and job name that try to close the chart's script, add an element, reorder text
    (RLO) and set a terminal title: the browser shows them as escaped text, and the charts
    still draw (the script was not broken)."""
    from peerwatch.exporters.report import render_job_report
    from peerwatch.report.job_summary import summarize_job

    evil = '</script><img id="pwned" src=x>\u202eevil\x1b]0;t\x07'
    t0 = 1_767_225_600_000
    windows = [
        {"job_id": "7", "node": node, "gpu_index": g, "window_start_ms": t0 + i * 30_000,
         "window_end_ms": t0 + (i + 1) * 30_000, "clk_ratio": 0.9 if (node, g) == (evil, 1) else 1.0,
         "throttle_frac": 0.0, "sm_frac": 0.9, "power_ratio": 0.8, "score": 0.0}
        for i in range(10) for node in (evil, "n0") for g in range(4)
    ]  # fmt: skip
    finding = {
        "finding_id": "f", "job_id": "7", "node": evil, "gpu_index": 1, "status": "CONFIRMED",
        "window_start_ms": t0, "window_end_ms": t0 + 30_000, "cause": evil, "reason": evil,
        "features": [{"feature": "clk", "value": 0.9, "peer_median": 1.0, "mad": 0.01, "z": -9.0}],
        "hard_rules": [], "windows_flagged": 4, "windows_considered": 4,
    }  # fmt: skip
    job = {"job_id": "7", "kind": "STARTED", "ts_ms": t0, "user": evil, "job_name": evil,
           "allocations": [{"node": evil, "gpu_indices": [0, 1, 2, 3]}]}  # fmt: skip
    summary = summarize_job("7", windows, [finding], [], [job])
    page = tmp_path / "evil.html"
    page.write_text(render_job_report(summary, windows, [finding], [], [("job-events", job)]))
    dom = chromium(tmp_path, "--dump-dom", page.as_uri()).stdout.decode()
    assert '<img id="pwned"' not in dom and "\u202e" not in dom and "\x1b" not in dom
    assert "\\u202eevil\\x1b]0;t\\x07" in dom  # shown as visible escapes
    assert dom.count('<div class="uplot') == 4  # the charts' script still ran
