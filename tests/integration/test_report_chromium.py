"""The incident report in a real browser: ``peerwatch simulate --archive`` of a straggler scenario,
``peerwatch replay --archive --report`` (the whole archive: no --from/--to), then Debian's
headless Chromium renders the page (no network: the page must be self-contained). The DOM must
show the job, the straggler GPU and its finding; the screenshot must show the highlight colour.
``peerwatch job --archive`` on the same archive (which holds only inputs: the job is replayed)
names the straggler in its verdict, and its ``--html`` page renders with it."""

from __future__ import annotations

import json
import os
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
    assert 'data-node="gpu00007" data-gpu="2"' in dom
    assert "gpu00007 GPU 2" in dom
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
    assert f"Verdict: {summary['verdict']}" in text and "gpu00007       2" in text
    dom = chromium(tmp_path, "--dump-dom", page.as_uri()).stdout.decode()
    assert summary["verdict"] in dom
    assert 'class="flagged-gpu" data-node="gpu00007" data-gpu="2"' in dom
    assert 'data-signal="throttle_frac"' in dom and "nothing throttled" in dom
