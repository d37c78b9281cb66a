"""Offline replay: live-equivalent settings, deterministic order, output filters, progress, and a
simulated archive replayed to its injected straggler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import write_archive
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, WINDOW, Output
from peerwatch.streams.offline.replay import (
    TimeRange,
    archive_job_events,
    archive_records,
    keep_output,
    live_equivalent_settings,
    output_lines,
    replay,
    scope_nodes,
    sort_records,
)

T0 = 1_767_225_600_000
HOUR = 3_600_000
SCENARIO = {
    "fleet": {"nodes": 10, "gpus_per_node": 8, "interval_s": 2.0, "duration_s": 420, "seed": 3},
    "jobs": [
        {"job_id": "77", "gpus": 64, "first_node": 0, "duration_s": 7200, "warmup_s": 0},
        {"job_id": "78", "gpus": 16, "first_node": 8, "duration_s": 7200, "warmup_s": 0},
    ],
    "faults": [{"name": "sm_clock_drop", "node": "gpu00005", "gpu_index": 3, "start_s": 60,
                "end_s": 420, "params": {"pct": 8}}],
}  # fmt: skip
SPAN = TimeRange(T0, T0 + HOUR)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("archive")
    write_archive(Fleet(parse_scenario(SCENARIO)), root)
    return root


def test_settings_equal_the_live_stream_defaults() -> None:
    from peerwatch.settings import Settings
    from peerwatch.streams.core.pipeline import PipelineSettings

    tree = Settings()
    live = tree.stream
    ours = live_equivalent_settings()
    assert ours.detector.window_s == tree.detector.window_s
    assert ours.lateness_s == live.lateness_s
    assert ours.job_grace_s == live.job_grace_s
    assert ours.fan_out_job_wide == live.fan_out_job_wide
    assert ours.detector == tree.detector and ours.policy == tree.policy
    assert ours.allocation_retention_s == live.allocation_retention_s
    # One default per value: the pipeline's own defaults are the tree's.
    assert PipelineSettings() == ours


def test_sort_order_is_event_time_then_stream_rank_then_key() -> None:
    recs = [
        ("samples", {"node": "b", "ts_ms": 10}),
        ("samples", {"node": "a", "ts_ms": 10}),
        ("job-events", {"job_id": "9", "ts_ms": 10}),
        ("node-events", {"node": "a", "ts_ms": 5}),
        ("health", {"node": "a"}),  # no event time: dropped
    ]
    out = sort_records(recs)
    assert [(s, k) for s, k, _ in out] == [
        ("node-events", "a"), ("job-events", "9"), ("samples", "a"), ("samples", "b"),
    ]  # fmt: skip


def test_range_admits_job_events_from_the_lookback() -> None:
    span = TimeRange(1000, 2000, lookback_ms=500)
    assert span.admits("job-events", 600) and not span.admits("samples", 600)
    assert span.admits("samples", 1000) and not span.admits("samples", 2000)
    assert not span.admits("samples", None)


@pytest.mark.parametrize(
    ("out", "job", "node", "kept"),
    [
        (Output(FINDING, "1", {"job_id": "1", "node": "n1"}, 0), "1", None, True),
        (Output(FINDING, "1", {"job_id": "1", "node": "n1"}, 0), "2", None, False),
        (Output(FINDING, "1", {"job_id": "1", "node": None}, 0), "1", "n1", False),
        (Output(RECOMMENDATION, "n1", {"node": "n1", "job_ids": ["1"]}, 0), "1", "n1", True),
        (Output(RECOMMENDATION, "n1", {"node": "n1", "job_ids": []}, 0), "1", None, False),
        (Output(WINDOW, "1", {"job_id": "1", "node": "n2"}, 0), None, "n2", True),
    ],
)
def test_keep_output(out: Output, job: str | None, node: str | None, kept: bool) -> None:
    assert keep_output(out, job, node) is kept


def test_archive_replay_finds_the_injected_straggler(archive: Path) -> None:
    result = replay(archive_records(archive, SPAN), live_equivalent_settings())
    confirmed = {(f["node"], f["gpu_index"]) for f in result.findings if f["status"] == "CONFIRMED"}
    assert confirmed == {("gpu00005", 3)}
    assert {r["node"] for r in result.recommendations} == {"gpu00005"}
    assert result.node_records == 10 * 210 and result.late == 0 and result.invalid == 0
    lines = [json.loads(line) for line in output_lines(result)]
    assert {x["kind"] for x in lines} == {FINDING, RECOMMENDATION}
    assert len(lines) == len(result.findings) + len(result.recommendations)


def test_replay_is_deterministic_and_equals_the_in_memory_records(archive: Path) -> None:
    settings = live_equivalent_settings()
    a = replay(archive_records(archive, SPAN), settings)
    b = replay(archive_records(archive, SPAN), settings)
    fleet = Fleet(parse_scenario(SCENARIO))
    mem = replay(sort_records((r.stream, r.value) for t in fleet.ticks() for r in t
                              if r.stream != "step-times"), settings)  # fmt: skip
    ids = [f["finding_id"] for f in a.findings]
    assert ids and ids == [f["finding_id"] for f in b.findings] == [
        f["finding_id"] for f in mem.findings
    ]
    assert a.recommendations == b.recommendations == mem.recommendations


def test_filters_apply_to_outputs_not_to_the_peer_group(archive: Path) -> None:
    settings = live_equivalent_settings()
    full = replay(archive_records(archive, SPAN), settings)
    only = replay(archive_records(archive, SPAN), settings, job="77", node="gpu00005")
    # Same findings, same z-scores: the detector still compared gpu00005 with all 64 GPUs.
    assert only.findings == [
        f for f in full.findings if f["job_id"] == "77" and f["node"] == "gpu00005"
    ]
    assert only.findings and all(f["peer_group_size"] == 64 for f in only.findings)
    assert replay(archive_records(archive, SPAN), settings, job="78").findings == []


def test_range_outside_the_data_gives_nothing(archive: Path) -> None:
    result = replay(archive_records(archive, TimeRange(T0 + 5 * HOUR, T0 + 6 * HOUR)),
                    live_equivalent_settings())  # fmt: skip
    assert (result.node_records, result.findings) == (0, [])  # job events: from the lookback


def test_windows_are_kept_only_when_asked(archive: Path) -> None:
    settings = live_equivalent_settings()
    assert replay(archive_records(archive, SPAN), settings).windows == []
    windows: list[dict[str, Any]] = replay(
        archive_records(archive, SPAN), settings, keep_windows=True
    ).windows
    assert {w["job_id"] for w in windows} == {"77", "78"}


def test_scope_is_the_job_or_node_plus_every_job_that_shared_a_node() -> None:
    def started(job: str, *nodes: str) -> dict[str, Any]:
        return {"job_id": job, "kind": "STARTED",
                "allocations": [{"node": n, "gpu_indices": [0]} for n in nodes]}  # fmt: skip

    events = [started("1", "a", "b"), started("2", "b", "c"), started("3", "d"), started("4", "c")]
    assert scope_nodes(events) is None
    # job 1's nodes, plus job 2 (shares b) with its node c; not job 4 (shares only c with 2)
    assert scope_nodes(events, job="1") == {"a", "b", "c"}
    assert scope_nodes(events, job="3") == {"d"}
    assert scope_nodes(events, node="c") == {"b", "c"}
    assert scope_nodes(events, job="1", node="d") == {"d"}
    assert scope_nodes(events, job="unknown") == frozenset()


@pytest.mark.parametrize(("job", "node"), [("77", None), ("78", None), (None, "gpu00005"),
                                           ("77", "gpu00005")])  # fmt: skip
def test_scoped_reading_gives_the_outputs_of_a_full_replay(
    archive: Path, job: str | None, node: str | None
) -> None:
    settings = live_equivalent_settings()
    full = replay(archive_records(archive, SPAN), settings, job=job, node=node, keep_windows=True)
    keep = scope_nodes(archive_job_events(archive, SPAN), job, node)
    assert keep is not None and len(keep) < 10
    scoped = replay(
        archive_records(archive, SPAN, keep_nodes=keep), settings, job=job, node=node,
        keep_windows=True,
    )  # fmt: skip
    assert scoped.node_records < full.node_records
    assert scoped.findings == full.findings
    assert scoped.recommendations == full.recommendations
    assert scoped.windows == full.windows
    assert full.findings or job == "78"


def test_scoped_reading_without_the_c_reader(
    archive: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peerwatch.schemas import native

    monkeypatch.setattr(native, "native", None)  # the decode-and-drop fallback
    settings = live_equivalent_settings()
    keep = frozenset({f"gpu0000{i}" for i in range(8)})
    scoped = replay(archive_records(archive, SPAN, keep_nodes=keep), settings, job="77")
    full = replay(archive_records(archive, SPAN), settings, job="77")
    assert scoped.findings == full.findings and scoped.findings


def _replay_args(*argv: str) -> Any:
    from peerwatch.cli import build_parser

    return build_parser("replay").parse_args(["replay", *argv])


def test_an_archive_replay_without_a_range_covers_the_whole_archive(tmp_path: Path) -> None:
    from peerwatch.commands.replay import time_range
    from peerwatch.errors import ConfigError

    samples = tmp_path / "peerwatch.gpu.samples"
    samples.mkdir()
    for name in ("2026-01-01T23.avro", "2026-01-02T01.1.avro", "2026-01-02T00.avro.part", "x"):
        (samples / name).write_bytes(b"")
    hour = 3_600_000
    start = 1_767_308_400_000  # 2026-01-01T23:00Z
    span = time_range(_replay_args("--archive", str(tmp_path)))
    assert (span.from_ms, span.to_ms) == (start, start + 3 * hour)
    span = time_range(_replay_args("--archive", str(tmp_path), "--from", str(start + hour)))
    assert (span.from_ms, span.to_ms) == (start + hour, start + 3 * hour)
    with pytest.raises(ConfigError, match="no sample files"):
        time_range(_replay_args("--archive", str(tmp_path / "peerwatch.gpu.samples")))
    with pytest.raises(ConfigError, match="required with --kafka"):
        time_range(_replay_args("--kafka", "--from", "0"))
    with pytest.raises(ConfigError, match="must be after"):
        time_range(_replay_args("--archive", str(tmp_path), "--to", str(start)))
