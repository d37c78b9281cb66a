"""Archive input of the native replay: read as a stream (bounded reorder), by whole hours, or
decoded (the Python path), an archive gives the same outputs; an archive out of order beyond
the bound is refused, not replayed wrong; consumed blocks are let go; damaged files end where
the Python reader ends them."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from peerwatch.exporters.archive_files import AvroFileSink
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.streams.offline import windows_native
from peerwatch.streams.offline.replay import (
    SAMPLE_RUN,
    TimeRange,
    archive_records,
    live_equivalent_settings,
    replay,
)
from peerwatch.streams.offline.replay_native import index_samples, native_archive_records
from peerwatch.streams.offline.windows_native import ArchiveUnordered, NativePipeline

if os.environ.get("PEERWATCH_REQUIRE_NATIVE") == "1":
    assert windows_native.available(), "the C replay module was not built"
pytestmark = pytest.mark.skipif(not windows_native.available(), reason="C module not built")

T0 = 1_767_225_600_000
HOUR = 3_600_000
SCENARIO = {
    "fleet": {"nodes": 6, "gpus_per_node": 8, "interval_s": 1.0, "duration_s": 3900,
              "seed": 8},
    "jobs": [
        {"job_id": "51", "gpus": 32, "first_node": 0, "duration_s": 3000, "warmup_s": 0},
        {"job_id": "52", "gpus": 16, "first_node": 4, "duration_s": 7200, "warmup_s": 100},
    ],
    "faults": [{"name": "sm_clock_drop", "node": "gpu00002", "gpu_index": 6, "start_s": 300,
                "params": {"pct": 9}},
               {"name": "xid", "node": "gpu00005", "gpu_index": 1, "start_s": 3700,
                "params": {"xid": 79}}],
}  # fmt: skip
SPAN = TimeRange(T0, T0 + 2 * HOUR)


def write(root: Path, shuffle_s: float = 0.0, seed: int = 0) -> Path:
    """The scenario as archive files (crossing an hour), samples displaced by up to
    ``shuffle_s`` of event time from their place in time order."""
    fleet = Fleet(parse_scenario(SCENARIO))
    topics = {s: t.name for s, t in STREAM_TOPICS.items()}
    sink = AvroFileSink(root, {topics[s]: t.value_schema or "" for s, t in STREAM_TOPICS.items()})
    rng = random.Random(seed)
    rows: list[tuple[float, str, dict[str, Any]]] = []
    for tick_ms, records in fleet.timed_ticks():
        for rec in records:
            ts = int(rec.value.get("ts_ms", tick_ms))
            jitter = rng.uniform(0, shuffle_s * 1000) if rec.stream == "samples" else 0
            rows.append((ts + jitter, rec.stream, rec.value))
    rows.sort(key=lambda r: r[0])
    for _, stream, value in rows:
        sink.write(topics[stream], value, int(value["ts_ms"]))
    sink.close()
    return root


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("archive"))


def native(root: Path, reorder_ms: int | None, keep: Any = None) -> Any:
    settings = live_equivalent_settings()
    node_ids: dict[str, int] = {}
    records = native_archive_records(root, SPAN, node_ids, keep_nodes=keep, reorder_ms=reorder_ms)
    return replay(records, settings, keep_windows=True, pipeline=NativePipeline(settings, node_ids))


def same(a: Any, b: Any) -> None:
    assert a.findings == b.findings
    assert a.recommendations == b.recommendations
    assert a.windows == b.windows
    assert (a.node_records, a.late, a.invalid) == (b.node_records, b.late, b.invalid)


def test_stream_whole_hours_and_python_paths_agree(archive: Path) -> None:
    want = replay(archive_records(archive, SPAN), live_equivalent_settings(), keep_windows=True)
    assert any(f["node"] == "gpu00002" and f["gpu_index"] == 6 for f in want.findings)
    assert any(f["status"] == "HARD_ERROR" for f in want.findings)
    same(native(archive, 30_000), want)
    same(native(archive, 1_000), want)
    same(native(archive, None), want)


def test_disorder_within_the_bound_is_put_right(tmp_path: Path) -> None:
    root = write(tmp_path, shuffle_s=3.0, seed=1)
    want = replay(archive_records(root, SPAN), live_equivalent_settings(), keep_windows=True)
    same(native(root, 30_000), want)


def test_disorder_beyond_the_bound_is_refused_then_whole_hours_replay_it(tmp_path: Path) -> None:
    root = write(tmp_path, shuffle_s=20.0, seed=2)
    with pytest.raises(ArchiveUnordered, match="released"):
        native(root, 2_000)
    want = replay(archive_records(root, SPAN), live_equivalent_settings(), keep_windows=True)
    same(native(root, None), want)


def test_stream_runs_release_blocks_as_they_are_consumed(archive: Path) -> None:
    node_ids: dict[str, int] = {}
    records = native_archive_records(archive, SPAN, node_ids, reorder_ms=30_000)
    indexes, runs, biggest = set(), 0, 0
    for stream, _, value in records:
        if stream == SAMPLE_RUN:
            runs += 1
            indexes.add(id(value.index))
            biggest = max(biggest, value.index.pending + len(value.index))
    # Two hours, released block by block (a 1 MiB block holds about 110 s of these 6 nodes):
    # never more than a block and the reorder span of samples held, not an hour.
    assert len(indexes) == 2 and runs > 30
    assert 6 * 30 < biggest < 6 * (110 + 30 + 30)


def test_a_cut_file_ends_where_the_python_reader_ends_it(archive: Path, tmp_path: Path) -> None:
    root = tmp_path / "cut"
    for src in archive.rglob("*.avro"):
        dst = root / src.relative_to(archive)
        dst.parent.mkdir(parents=True, exist_ok=True)
        data = src.read_bytes()
        dst.write_bytes(data[: len(data) * 2 // 3] if "samples" in str(src) else data)
    want = replay(archive_records(root, SPAN), live_equivalent_settings(), keep_windows=True)
    assert 0 < want.node_records < 6 * 3900
    same(native(root, 30_000), want)
    index = index_samples(sorted(root.rglob("*gpu.samples/*.avro")), SPAN, {})
    assert len(index) == want.node_records


def test_scoped_stream_equals_scoped_python(archive: Path) -> None:
    keep = frozenset({"gpu00004", "gpu00005"})
    settings = live_equivalent_settings()
    want = replay(archive_records(archive, SPAN, keep_nodes=keep), settings, keep_windows=True)
    got = native(archive, 30_000, keep)
    same(got, want)
    assert {w["node"] for w in got.windows} == set(keep)


def test_cli_falls_back_to_whole_hours_for_an_unordered_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import json

    from peerwatch.cli import main

    root = write(tmp_path / "a", shuffle_s=20.0, seed=3)
    span = ["--from", str(SPAN.from_ms), "--to", str(SPAN.to_ms)]
    out = tmp_path / "f.jsonl"
    args = ["replay", "--archive", str(root), *span, "--no-progress", "--one-process"]
    assert main([*args, "--reorder-s", "2", "--findings", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["path"] == "native"
    assert "whole hours sorted" in caplog.text
    want = replay(archive_records(root, SPAN), live_equivalent_settings())
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [g["finding_id"] for g in got if g["kind"] == "finding"] == [
        f["finding_id"] for f in want.findings
    ]
    assert summary["node_records"] == want.node_records
    assert main([*args, "--reorder-s", "-1"]) == 2
