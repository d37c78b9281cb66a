"""Replay's streaming read of archive samples (``column_archive_records``, ``SampleRuns``): how
far the samples of an archive may be out of order, and what happens beyond that."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import write_archive
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.streams.core.pipeline import Pipeline
from peerwatch.streams.offline.replay import (
    ReplayResult,
    TimeRange,
    column_archive_records,
    live_equivalent_settings,
    replay,
)
from peerwatch.streams.offline.sample_runs import SAMPLE_RUN, ArchiveUnordered, wider_window_ms
from tests.unit.test_archive_hostile import write_samples

T0 = 1_767_225_600_000  # 2026-01-01T00: the archive is one hour file per stream
HOUR = 3_600_000
SPAN = TimeRange(T0, T0 + HOUR)
SCENARIO = {
    "fleet": {"nodes": 10, "gpus_per_node": 8, "interval_s": 2.0, "duration_s": 300, "seed": 5},
    "jobs": [{"job_id": "77", "gpus": 64, "first_node": 0, "duration_s": 7200, "warmup_s": 0}],
    "faults": [{"name": "sm_clock_drop", "node": "gpu00005", "gpu_index": 3, "start_s": 40,
                "end_s": 300, "params": {"pct": 8}}],
}  # fmt: skip
SAMPLES_FILE = Path("peerwatch.gpu.samples") / "2026-01-01T00.avro"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("archive")
    write_archive(Fleet(parse_scenario(SCENARIO)), root)
    assert (root / SAMPLES_FILE).is_file()
    return root


@pytest.fixture(scope="module")
def samples() -> list[dict[str, Any]]:
    """The archive's samples in the order it wrote them (time, then node)."""
    fleet = Fleet(parse_scenario(SCENARIO))
    return [r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "samples"]


@pytest.fixture(scope="module")
def in_order(archive: Path) -> ReplayResult:
    return replayed(archive, None)


def replayed(root: Path, reorder_ms: int | None) -> ReplayResult:
    settings = live_equivalent_settings()
    pipeline = Pipeline(settings)
    strings = pipeline.aggregator.strings
    records = column_archive_records(root, SPAN, strings, reorder_ms=reorder_ms)
    return replay(records, settings, pipeline=pipeline)


def rewritten(archive: Path, tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    """A copy of ``archive`` whose sample file holds ``records`` in that order."""
    root = tmp_path / "archive"
    shutil.copytree(archive, root)
    write_samples(root / SAMPLES_FILE, records, per_block=25)
    return root


def same_outputs(a: ReplayResult, b: ReplayResult) -> bool:
    return (a.findings, a.recommendations, a.node_records) == (
        b.findings, b.recommendations, b.node_records,
    )  # fmt: skip


def test_the_archive_holds_the_injected_straggler(in_order: ReplayResult) -> None:
    confirmed = {(f["node"], f["gpu_index"]) for f in in_order.findings
                 if f["status"] == "CONFIRMED"}  # fmt: skip
    assert confirmed == {("gpu00005", 3)} and in_order.node_records == 10 * 150


@pytest.mark.parametrize("reorder_ms", [0, 2_000, 30_000])
def test_an_archive_in_order_replays_the_same_with_any_window(
    archive: Path, in_order: ReplayResult, reorder_ms: int
) -> None:
    assert same_outputs(replayed(archive, reorder_ms), in_order)


def test_samples_out_of_order_within_the_window_are_released_in_replay_order(
    archive: Path, in_order: ReplayResult, samples: list[dict[str, Any]], tmp_path: Path
) -> None:
    # Each run of 40 samples (8 s of the fleet) written backwards.
    shuffled = [r for i in range(0, len(samples), 40) for r in reversed(samples[i : i + 40])]
    assert shuffled != samples
    root = rewritten(archive, tmp_path, shuffled)
    strings: dict[str, int] = {}
    runs = [v for s, _, v in column_archive_records(root, SPAN, strings, reorder_ms=10_000)
            if s == SAMPLE_RUN]  # fmt: skip
    names = list(strings)
    order = [(int(t), names[n]) for run in runs
             for t, n in zip(run[""].values["ts_ms"], run[""].values["node"], strict=True)]  # fmt: skip
    # replay order, each sample once
    assert order == sorted((int(r["ts_ms"]), str(r["node"])) for r in samples)
    assert same_outputs(replayed(root, 10_000), in_order)


def test_samples_later_than_the_window_raise_archive_unordered(
    archive: Path, in_order: ReplayResult, samples: list[dict[str, Any]], tmp_path: Path
) -> None:
    # The first minute's samples written after everything else (a partition archived late).
    late = [r for r in samples if r["ts_ms"] < T0 + 60_000]
    root = rewritten(archive, tmp_path, [r for r in samples if r not in late] + late)
    strings: dict[str, int] = {}
    with pytest.raises(ArchiveUnordered, match="were released") as raised:
        list(column_archive_records(root, SPAN, strings, reorder_ms=30_000))
    # the lag: the newest sample read (about 300 s in) less the late one (at most 60 s in)
    assert 240_000 <= raised.value.needed_ms < 300_000
    assert same_outputs(replayed(root, None), in_order)  # whole hours sorted: as if in order


def test_the_replay_command_widens_its_window_to_what_the_archive_needs(
    archive: Path,
    in_order: ReplayResult,
    samples: list[dict[str, Any]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from peerwatch.cli import main

    late = [r for r in samples if r["ts_ms"] < T0 + 60_000]
    root = rewritten(archive, tmp_path, [r for r in samples if r not in late] + late)
    out = tmp_path / "findings.jsonl"
    args = ["replay", "--archive", str(root), "--from", str(T0), "--to", str(T0 + HOUR),
            "--no-progress", "--findings", str(out)]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # one more read, with twice the lag found: not a whole hour
    assert caplog.text.count("replaying again with --reorder-s") == 1
    assert 480 <= summary["reorder_s"] < 600
    expected = len(in_order.findings) + len(in_order.recommendations)
    assert len(out.read_text().splitlines()) == expected > 0


@pytest.mark.parametrize(
    ("current_ms", "needed_ms", "wider_ms"),
    [
        (30_000, 45_000, 90_000),  # twice the lag found
        (30_000, 31_000, 62_000),
        (30_000, 1_000, 60_000),  # at least twice the window it had
        (0, 0, 1_000),
        (1_000_000, 1_700_000, 3_400_000),
        (1_000_000, 1_800_000, None),  # an hour or more: whole hours
        (2_000_000, 10, None),
    ],
)
def test_wider_window(current_ms: int, needed_ms: int, wider_ms: int | None) -> None:
    assert wider_window_ms(current_ms, needed_ms) == wider_ms


def _block(times_ms: list[int], strings: dict[str, int]) -> Any:
    """A block of samples (one per time, node n<i % 3>, GPUs as many as i % 3 + 1) as tables."""
    from peerwatch.schemas.columns import tables_from_records
    from peerwatch.streams.core.windows import SAMPLE_SPEC

    records = [{"node": f"n{i % 3}", "ts_ms": t, "xids": [],
                "gpus": [{"index": g, "uuid": f"GPU-{i}-{g}", "state": "OK",
                          "sm_clock_mhz": 1000 + 10 * i + g} for g in range(i % 3 + 1)]}
               for i, t in enumerate(times_ms)]  # fmt: skip
    return tables_from_records(SAMPLE_SPEC, records, strings)


def _rows(tables: Any) -> list[tuple[int, int, list[int]]]:
    """(time, node code, SM clocks of its GPUs) of each sample, from the tables."""
    top, gpus = tables[""], tables["gpus."]
    clocks: dict[int, list[int]] = {}
    for parent, clk in zip(gpus.parent.tolist(), gpus.values["sm_clock_mhz"].tolist(), strict=True):
        clocks.setdefault(parent, []).append(clk)
    ts, nodes = top.values["ts_ms"].tolist(), top.values["node"].tolist()
    return [(t, n, clocks.get(i, [])) for i, (t, n) in enumerate(zip(ts, nodes, strict=True))]


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_block_cut_by_a_release_keeps_every_sample_once_with_its_gpus(shuffled: bool) -> None:
    from peerwatch.streams.offline.sample_runs import SampleRuns

    strings: dict[str, int] = {}
    times = [T0 + 100 * k for k in range(12)]
    if shuffled:  # a block out of time order: cut by a mask, not by slices
        times = [times[k] for k in (3, 0, 1, 7, 2, 11, 4, 5, 10, 6, 8, 9)]
    whole = _rows(_block(times, strings))
    runs = SampleRuns(strings)
    runs.add(_block(times, strings))
    first = runs.release(T0 + 450)  # straddles the block: times 0..400 go, 500.. stay
    rest = runs.release(FAR_FUTURE)
    got = [r for run in first + rest for r in _rows(run)]
    assert [r[0] for run in first for r in _rows(run)] == [T0 + 100 * k for k in range(5)]
    assert sorted(got) == sorted(whole) and len(got) == len(whole)
    assert [r[0] for r in got] == sorted(times)  # replay order: by time


FAR_FUTURE = 1 << 62


def test_blocks_in_replay_order_are_released_without_a_copy() -> None:
    from peerwatch.streams.offline.sample_runs import SampleRuns

    strings: dict[str, int] = {}
    first, second = _block([T0, T0 + 100, T0 + 200], strings), _block([T0 + 300, T0 + 400], strings)
    runs = SampleRuns(strings)
    runs.add(first)
    runs.add(second)
    released = runs.release(FAR_FUTURE)
    assert [_rows(r) for r in released] == [_rows(first), _rows(second)]
    for run, block in zip(released, (first, second), strict=True):
        for path, table in block.items():  # the decoded arrays themselves
            assert all(run[path].values[k] is v for k, v in table.values.items())


def test_blocks_out_of_replay_order_are_released_as_one_sorted_run() -> None:
    from peerwatch.streams.offline.sample_runs import SampleRuns

    strings: dict[str, int] = {}
    runs = SampleRuns(strings)
    runs.add(_block([T0 + 300, T0 + 400], strings))
    runs.add(_block([T0, T0 + 100], strings))  # an earlier block read second
    (released,) = runs.release(FAR_FUTURE)
    assert [r[0] for r in _rows(released)] == [T0, T0 + 100, T0 + 300, T0 + 400]


def test_records_of_other_streams_go_between_runs_at_their_time() -> None:
    from collections import deque

    from peerwatch.streams.offline.sample_runs import merge

    strings: dict[str, int] = {}
    runs = [_block([T0, T0 + 100], strings), _block([T0 + 200, T0 + 300], strings)]

    def event(t: int) -> tuple[str, str, dict[str, Any]]:
        return ("job-events", "j", {"ts_ms": t})

    # before a run, inside one, between two, after all, and one not yet due (at the bound)
    waiting = deque(event(t) for t in (T0 - 5, T0 + 100, T0 + 150, T0 + 300, T0 + 999, T0 + 1000))
    got = [
        ("e", v["ts_ms"]) if s != SAMPLE_RUN else ("s", [r[0] for r in _rows(v)])
        for s, _, v in merge(waiting, runs, T0 + 1000)
    ]
    assert got == [
        ("e", T0 - 5), ("s", [T0]), ("e", T0 + 100), ("s", [T0 + 100]), ("e", T0 + 150),
        ("s", [T0 + 200]), ("e", T0 + 300), ("s", [T0 + 300]), ("e", T0 + 999),
    ]  # fmt: skip
    assert list(waiting) == [event(T0 + 1000)]
