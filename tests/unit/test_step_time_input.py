"""StepTime durations are hostile input (issue 39 item 5): a NaN, an infinity, a negative or an
absurd ``step_duration_ms`` is refused where live and replay both take step times
(``JobStage.add_step``): dead-lettered live, counted invalid in replay, in every replay mode and
``peerwatch job --archive``; it never reaches the peer comparison, so no crash and no healthy GPU
flagged."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.sim.fleet import Fleet, SimRecord
from peerwatch.producers.sim.publish import write_archive
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec
from peerwatch.streams.core.job_stage import STEP_MS_MAX, JobStage, step_duration_ms
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.live.handlers import RECORD_ERRORS
from peerwatch.streams.offline.replay import (
    TimeRange,
    archive_records,
    live_equivalent_settings,
    replay,
    sort_records,
)

T0 = 1_767_225_600_000
SCENARIO = {
    "fleet": {"nodes": 2, "gpus_per_node": 8, "interval_s": 5.0, "duration_s": 600, "seed": 5,
              "step_times": True},
    "jobs": [{"job_id": "42", "gpus": 16, "first_node": 0, "duration_s": 7200, "warmup_s": 0}],
    "faults": [{"name": "sm_clock_drop", "node": "gpu00001", "gpu_index": 3, "start_s": 60,
                "params": {"pct": 8}}],
}  # fmt: skip
SLOW = {("gpu00001", 3)}
HOSTILE = [math.nan, math.inf, -math.inf, 1e308, -1.0, STEP_MS_MAX * 2]


class BadStep:
    """The scenario's fleet with one StepTime (on the healthy gpu00000, GPU 0, mid-run) given
    ``duration``: what a training job with a broken timer publishes."""

    def __init__(self, duration: float) -> None:
        self.fleet = Fleet(parse_scenario(SCENARIO))
        self.duration = duration

    def timed_ticks(self) -> Iterator[tuple[int, list[SimRecord]]]:
        done = False
        for tick_ms, records in self.fleet.timed_ticks():
            for rec in records:
                v = rec.value
                if (not done and rec.stream == "step-times" and v["node"] == "gpu00000"
                        and v["gpu_index"] == 0 and v["ts_ms"] >= T0 + 300_000):  # fmt: skip
                    v["step_duration_ms"] = self.duration
                    done = True
            yield tick_ms, records
        assert done

    def labels(self) -> list[dict[str, Any]]:
        return self.fleet.labels()


def flagged(findings: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(f["node"], f["gpu_index"]) for f in findings if f["status"] != "OK"}


@pytest.mark.parametrize("duration", [*HOSTILE, True, "5", None])
def test_a_hostile_step_duration_is_refused_with_an_invalid_record_error(duration: Any) -> None:
    stage = JobStage(DetectorSettings(window_s=30))
    step = {"job_id": "9", "node": "n", "gpu_index": 0, "ts_ms": 5, "step_duration_ms": duration}
    with pytest.raises(InvalidRecordError, match="step_duration_ms"):
        stage.add_step(step)
    assert stage.steps == {}
    assert InvalidRecordError in RECORD_ERRORS  # live: the agent dead-letters it


@pytest.mark.parametrize("duration", [0.0, 1.5, 1000, STEP_MS_MAX])
def test_a_step_duration_in_range_is_taken(duration: float) -> None:
    assert step_duration_ms({"step_duration_ms": duration}) == float(duration)


@pytest.mark.parametrize("duration", HOSTILE)
def test_the_live_handler_dead_letters_a_hostile_step_time(duration: float) -> None:
    from test_stream_handlers import jobs_handler

    handler, _, _ = jobs_handler()
    value = {"job_id": "7", "node": "gpu00001", "rank": 0, "gpu_index": 0, "step": 1,
             "ts_ms": T0, "step_duration_ms": duration}  # fmt: skip
    with pytest.raises(InvalidRecordError, match="step_duration_ms"):
        handler.handle("st", 0, b"7", AvroCodec("StepTime").encode(value))
    assert handler.stage3.stage.steps == {}


@pytest.fixture(scope="module")
def clean() -> list[dict[str, Any]]:
    fleet = Fleet(parse_scenario(SCENARIO))
    records = sort_records((r.stream, r.value) for t in fleet.ticks() for r in t)
    result = replay(records, live_equivalent_settings())
    assert result.findings and result.invalid == 0
    return result.findings


@pytest.mark.parametrize("duration", HOSTILE)
def test_replay_counts_a_hostile_step_time_invalid_and_flags_no_healthy_gpu(
    duration: float, clean: list[dict[str, Any]]
) -> None:
    # NaN raised ValueError in PeerComparison (the hour could not be replayed); +inf and
    # 1e308 flagged the healthy GPU 0 of gpu00000.
    bad = BadStep(duration)
    records = sort_records((r.stream, r.value) for _, t in bad.timed_ticks() for r in t)
    result = replay(records, live_equivalent_settings())
    assert result.invalid == 1
    assert flagged(result.findings) == flagged(clean) == SLOW
    assert len(result.findings) == len(clean)


@pytest.fixture(scope="module")
def nan_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("archive")
    write_archive(BadStep(math.nan), root)  # type: ignore[arg-type]  # a Fleet's two methods
    return root


def test_the_archive_with_a_nan_step_time_replays_on_the_decoded_path(nan_archive: Path) -> None:
    span = TimeRange(T0, T0 + 3_600_000)
    result = replay(archive_records(nan_archive, span), live_equivalent_settings())
    assert result.invalid == 1 and flagged(result.findings) == SLOW


@pytest.mark.parametrize(
    ("mode", "path"),
    [([], "columns"), (["--workers", "2"], "decoded")],
)
def test_every_replay_mode_and_the_job_view_read_an_archive_with_a_nan_step_time(
    nan_archive: Path, mode: list[str], path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from peerwatch.cli import main

    args = ["replay", "--archive", str(nan_archive), "--no-progress", *mode]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["invalid"] == 1 and summary["findings"] > 0
    assert summary["path"].startswith(path)  # default: two processes where two cores
    if not mode:
        assert main(["job", "42", "--archive", str(nan_archive)]) == 0
        assert "42" in capsys.readouterr().out
