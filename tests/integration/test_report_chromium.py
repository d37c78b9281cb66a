"""The incident report in a real browser: ``peerwatch simulate --archive`` of a straggler scenario,
``peerwatch replay --archive --report``, then Debian's headless Chromium renders the page (no
network: the page must be self-contained). The DOM must show the job, the straggler GPU and its
finding; the screenshot must show the highlight colour."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

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
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    tmp = tmp_path_factory.mktemp("report")
    (tmp / "scenario.json").write_text(json.dumps(SCENARIO))
    env = dict(os.environ)
    run(["simulate", "--scenario", str(tmp / "scenario.json"), "--archive", str(tmp / "a")], env)
    page = tmp / "r.html"
    run(["replay", "--archive", str(tmp / "a"), "--from", START, "--to", "2026-01-01T01:00:00Z",
         "--report", str(page), "--no-progress"], env)  # fmt: skip
    return page


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
