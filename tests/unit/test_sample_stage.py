"""Stage 2 as one object (SampleStage): sources, cadences, snapshot and restore."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from peerwatch.producers.sim import Fleet, parse_scenario
from peerwatch.schemas.columns import Table, tables_from_records
from peerwatch.settings import Settings
from peerwatch.streams.core.sample_stage import PRUNE_EVERY_MS, SampleStage
from peerwatch.streams.core.windows import SAMPLE_SPEC

DOC = {
    "fleet": {"nodes": 2, "interval_s": 1.0, "duration_s": 150, "seed": 3},
    "jobs": [{"job_id": "7", "gpus": 16, "first_node": 0, "warmup_s": 0}],
}


def records() -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The scenario's job events and samples, in order."""
    fleet = Fleet(parse_scenario(DOC))
    events: list[Mapping[str, Any]] = []
    samples: list[Mapping[str, Any]] = []
    for batch in fleet.ticks():
        for r in batch:
            if r.stream == "job-events":
                events.append(r.value)
            elif r.stream == "samples":
                samples.append(r.value)
    return events, samples


def columns(stage: SampleStage, src: int, samples: list[Mapping[str, Any]]) -> dict[str, Table]:
    return tables_from_records(SAMPLE_SPEC, samples, stage.aggregator(src).strings)


def test_windows_close_at_the_watermark_with_one_census_per_start() -> None:
    events, samples = records()
    stage = SampleStage(Settings())
    for e in events:
        stage.apply_job_event(e)
    starts: list[int] = []
    for i in range(0, len(samples), 10):
        before = stage.next_close_ms()
        part = samples[i : i + 10]
        result = stage.step(columns(stage, 0, part))
        if result.closed:  # only a part reaching the stage's next close closes windows
            assert max(int(s["ts_ms"]) for s in part) >= before
        assert [c for c, _, _ in result.censuses] == sorted({c.start_ms for c in result.closed})
        starts += [c.start_ms for c in result.closed]
    assert starts == sorted(starts) and len(starts) == len(set(starts)) > 20


def test_state_is_pruned_by_the_slowest_source() -> None:
    events, samples = records()
    stage = SampleStage(Settings())
    for e in events:
        stage.apply_job_event(e)
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for s in samples:
        by_node.setdefault(str(s["node"]), []).append(s)
    (_, fast), (_, slow) = sorted(by_node.items())
    assert stage.step(columns(stage, 0, fast[:5]), 0).pruned_ms is not None  # the first time
    assert stage.step(columns(stage, 1, slow[:5]), 1).pruned_ms is None
    # source 0 runs two minutes ahead: source 1 still needs what a prune would drop
    ahead = stage.step(columns(stage, 0, fast[5:]), 0)
    assert ahead.watermark_ms is not None and ahead.pruned_ms is None
    caught_up = stage.step(columns(stage, 1, slow[5:]), 1)
    assert caught_up.pruned_ms is not None
    assert caught_up.pruned_ms >= stage.settings.stream.lateness_s + PRUNE_EVERY_MS


def test_silence_checks_only_the_nodes_of_the_sources_held() -> None:
    events, samples = records()
    nodes = sorted({str(s["node"]) for s in samples})
    stage = SampleStage(Settings(), partition_of=lambda n: nodes.index(n))
    for e in events:
        stage.apply_job_event(e)
    stage.open_source(0)  # only the first node's partition is held
    first = [s for s in samples if s["node"] == nodes[0]]
    stage.step(columns(stage, 0, first[:10]), 0)
    found = [f for now in stage.silence_due(now_ms=int(first[9]["ts_ms"]) + 120_000)
             for f in stage.check_silence(now)]  # fmt: skip
    assert {f["node"] for f in found} == {nodes[0]}  # the other node is another worker's


def test_snapshot_restores_what_a_source_cannot_give_again() -> None:
    events, samples = records()
    stage = SampleStage(Settings())
    for e in events:
        stage.apply_job_event(e)
    stage.step(columns(stage, 0, samples[:100]), 0)
    saved = json.loads(json.dumps(stage.snapshot()))
    again = SampleStage(Settings())
    again.restore(saved)
    assert again.snapshot() == saved
    assert again.allocations.to_dict() == stage.allocations.to_dict()
    assert again.aggregator(0).closed_until_ms == stage.aggregator(0).closed_until_ms
    assert again.next_silence_ms == stage.next_silence_ms
    # read again from the oldest open window (the live worker's commit point), the restored
    # stage closes the same windows of the same GPUs (open windows are not in a snapshot)
    until = stage.aggregator(0).closed_until_ms
    assert until is not None
    again_from = next(i for i, s in enumerate(samples) if int(s["ts_ms"]) >= until)
    assert again_from < 100  # some samples are read twice: those of the open windows
    want = stage.step(columns(stage, 0, samples[100:]), 0)
    got = again.step(columns(again, 0, samples[again_from:]), 0)
    assert [c.start_ms for c in got.closed] == [c.start_ms for c in want.closed] != []
    assert [len(c.node) for c in got.closed] == [len(c.node) for c in want.closed]


@pytest.mark.parametrize("drop", ["allocations", "closed_until_ms", "silence_clock"])
def test_a_malformed_snapshot_is_refused_and_changes_nothing(drop: str) -> None:
    events, samples = records()
    stage = SampleStage(Settings())
    for e in events:
        stage.apply_job_event(e)
    stage.step(columns(stage, 0, samples[:50]), 0)
    saved = stage.snapshot()
    bad = {k: v for k, v in saved.items() if k != drop}
    with pytest.raises(KeyError):
        stage.restore(bad)
    assert stage.snapshot() == saved
