"""A replay split over two processes gives every output of the one-process replay, windows
included, when nodes first report late (their strings reach the stages process later)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import write_archive
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.streams.core.pipeline import Pipeline
from peerwatch.streams.offline.replay import (
    TimeRange,
    column_archive_records,
    live_equivalent_settings,
    replay,
)
from peerwatch.streams.offline.split import SplitReplay


def test_split_replay_equals_one_process_with_nodes_reporting_late(tmp_path: Path) -> None:
    doc = {  # about 6 MB of samples: several archive blocks, decoded one after another
        "fleet": {"nodes": 20, "gpus_per_node": 8, "interval_s": 1.0, "duration_s": 300,
                  "seed": 4},
        "jobs": [{"job_id": "70", "gpus": 160, "first_node": 0, "warmup_s": 0}],
        "faults": [
            {"name": "agent_silent", "node": 3, "start_s": 0, "end_s": 150},  # first seen late
            {"name": "agent_silent", "node": 4, "start_s": 0, "end_s": 250},
            {"name": "sm_clock_drop", "node": 1, "gpu_index": 3, "start_s": 20,
             "params": {"factor": 0.7}},
        ],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    write_archive(fleet, tmp_path)
    settings = live_equivalent_settings()
    span = TimeRange(fleet.spec.start_ms, fleet.spec.start_ms + 3_600_000)

    def records(strings: dict[str, int]) -> Any:
        return column_archive_records(tmp_path, span, strings, "", None, 30_000)

    alone = Pipeline(settings, True)
    one = replay(records(alone.aggregator.strings), settings, pipeline=alone, keep_windows=True)
    with SplitReplay(settings, keep_windows=True) as split:
        two = split.run(records(split.front.aggregator.strings))
    assert two.windows == one.windows and len(one.windows) > 100
    assert {w["node"] for w in one.windows} >= {"gpu00003", "gpu00004"}
    assert two.findings == one.findings and two.recommendations == one.recommendations
    # the silence watch runs in the stages process: the quiet nodes' SILENT and CLEARED
    silent = [f for f in two.findings if f["status"] == "SILENT"]
    assert [f["reason"] for f in silent] == [
        "no samples from 2 nodes (gpu00003 gpu00004) job 70 for 30 s"
    ]
    assert any(f["status"] == "CLEARED" and f["reason"] == "samples again" for f in two.findings)


def test_the_stages_process_counts_the_fleet_watch() -> None:
    """The stages process's counters include its fleet watch's (JobReleaser.fleet() takes no
    channel since the fleet is judged on one: a call with one raised TypeError)."""
    from peerwatch.streams.offline.split import BackPipeline

    assert BackPipeline(live_equivalent_settings()).counters()["fleet_findings"] == 0
