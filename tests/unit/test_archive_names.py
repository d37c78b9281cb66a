"""Hostile archive directories (issue 39 items 9 and 12): an entry of a topic folder named like an
archive file that cannot be one is skipped with a warning naming it and counted, by every replay
mode, ``peerwatch job --archive`` and the archiver's recovery and retention; a damaged header is
counted once per file by every replay mode, ``--workers`` too."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from peerwatch.exporters.archive import ArchiveSettings, ArchiveWriter
from peerwatch.io.archive.layout import HOUR_MS, ReadStats, topic_entries
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import write_archive
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.streams.offline.replay import TimeRange, archive_records, column_archive_records

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
SAMPLES = "peerwatch.gpu.samples"
JOB_EVENTS = "peerwatch.slurm.job-events"
SCENARIO = {
    "fleet": {"nodes": 2, "gpus_per_node": 8, "interval_s": 5.0, "duration_s": 600, "seed": 5},
    "jobs": [{"job_id": "42", "gpus": 16, "first_node": 0, "duration_s": 7200, "warmup_s": 0}],
    "faults": [{"name": "sm_clock_drop", "node": "gpu00001", "gpu_index": 3, "start_s": 60,
                "params": {"pct": 8}}],
}  # fmt: skip
#: Named like archive files, none can be one: no such month/day/hour, year 0, before 1970.
BAD_NAMES = ["2026-13-45T99.avro", "0000-01-01T00.avro", "1969-12-31T23.avro",
             "2026-02-30T00.1.avro"]  # fmt: skip
MODES = [([], "columns"), (["--workers", "2"], "decoded")]


def plant(root: Path) -> list[Path]:
    """The misnamed entries: BAD_NAMES as files in the samples folder, a folder named like the
    next hour's samples file, one named like a job-events ``.part``."""
    planted = []
    for name in BAD_NAMES:
        path = root / SAMPLES / name
        path.write_bytes(b"Obj\x01")
        planted.append(path)
    for path in (
        root / SAMPLES / "2026-01-01T01.avro",
        root / JOB_EVENTS / "2026-01-01T00.avro.part",
    ):
        path.mkdir()
        (path / "inside").write_text("x")
        planted.append(path)
    return planted


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[Path]]:
    clean = tmp_path_factory.mktemp("clean")
    write_archive(Fleet(parse_scenario(SCENARIO)), clean)
    named = tmp_path_factory.mktemp("named")
    write_archive(Fleet(parse_scenario(SCENARIO)), named)
    return clean, named, plant(named)


def test_topic_entries_skip_misnamed_entries_with_a_warning_naming_each(
    archives: tuple[Path, Path, list[Path]], caplog: pytest.LogCaptureFixture
) -> None:
    _, root, planted = archives
    stats = ReadStats()
    with caplog.at_level(logging.WARNING):
        samples = topic_entries(root / SAMPLES, stats)
        events = topic_entries(root / JOB_EVENTS, stats)
    assert [e.path.name for e in samples] == ["2026-01-01T00.avro"]
    assert [e.path.name for e in events] == ["2026-01-01T00.avro"]
    assert stats.misnamed == len(planted) == 6
    for path in planted:
        assert any(str(path) in r.getMessage() for r in caplog.records), path
    assert topic_entries(root / "no-such-topic") == []


@pytest.mark.parametrize(("mode", "path"), MODES)
def test_every_replay_mode_skips_and_counts_misnamed_entries(
    archives: tuple[Path, Path, list[Path]],
    mode: list[str],
    path: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from peerwatch.cli import main

    clean, named, _ = archives
    span = ["--from", str(T0), "--to", str(T0 + 2 * HOUR_MS), "--no-progress", *mode]
    findings = []
    for root in (named, clean):
        assert (
            main(["replay", "--archive", str(root), *span, "--findings", str(root / "f.jsonl")])
            == 0
        )
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["path"].startswith(path)
        assert summary["misnamed"] == (6 if root == named else 0)
        findings.append((root / "f.jsonl").read_text())
    assert findings[0] == findings[1] and findings[0]


def test_the_job_view_reads_an_archive_with_misnamed_entries(
    archives: tuple[Path, Path, list[Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    from peerwatch.cli import main

    assert main(["job", "42", "--archive", str(archives[1])]) == 0
    assert "gpu00001" in capsys.readouterr().out


def test_the_archiver_recovers_and_retains_beside_misnamed_entries(tmp_path: Path) -> None:
    # Each restart of `peerwatch archive` with retention on stopped on them (strptime, unlink).
    topics = {SAMPLES: "NodeGpuSample", JOB_EVENTS: "JobEvent"}
    fleet = Fleet(parse_scenario(SCENARIO))
    write_archive(fleet, tmp_path)
    planted = plant(tmp_path)
    writer = ArchiveWriter(tmp_path, topics, ArchiveSettings(retention_days=1))
    writer.recover()
    removed = writer.retain(T0 + 30 * HOUR_MS)
    assert {p.name for p in removed} == {"2026-01-01T00.avro"}
    assert {tmp_path / t / "2026-01-01T00.avro" for t in topics} <= set(removed)
    assert all(p.exists() for p in planted)
    writer.close()


@pytest.mark.parametrize("cut_tail", [False, True])
def test_a_damaged_header_counts_one_bad_file_in_every_replay_mode(
    tmp_path: Path, cut_tail: bool
) -> None:
    # A header that parses but names a codec no reader has: --workers cut the file into parts
    # and counted it once per part (32 here), the other modes once; with a cut tail, --workers
    # counted that too, the other modes only the bad file.
    from test_archive_hostile import write_samples

    fleet = Fleet(parse_scenario(SCENARIO))
    samples = [r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "samples"]
    path = tmp_path / SAMPLES / "2026-01-01T00.avro"
    write_samples(path, samples[:160], per_block=5)
    data = path.read_bytes()
    assert data.count(b"null") >= 1
    data = data.replace(b"null", b"nulx", 1)  # avro.codec
    path.write_bytes(data[:-7] if cut_tail else data)
    span = TimeRange(T0, T0 + HOUR_MS)
    counted = {}
    for name, read in [
        ("decoded", lambda s: archive_records(tmp_path, span, stats=s)),
        ("workers", lambda s: archive_records(tmp_path, span, workers=2, part_bytes=500, stats=s)),
        ("columns", lambda s: column_archive_records(tmp_path, span, {}, stats=s)),
    ]:
        stats = ReadStats()
        assert list(read(stats)) == []
        counted[name] = stats.as_dict()
    assert counted["decoded"] == counted["workers"] == counted["columns"]
    assert counted["decoded"]["bad_files"] == 1


def test_a_file_of_another_schema_version_counts_alike_with_workers(tmp_path: Path) -> None:
    # Read by fastavro (schema resolution), which ends at the first fault: --workers cut it into
    # parts that each went on past it (a cut tail counted per part, records kept after it).
    from test_archive_hostile import write_samples

    fleet = Fleet(parse_scenario(SCENARIO))
    samples = [r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "samples"]
    path = tmp_path / SAMPLES / "2026-01-01T00.avro"
    write_samples(path, samples[:160], per_block=5)
    data = path.read_bytes()
    assert data.count(b'"interval_ms"') == 1  # a field without default, renamed: unresolvable
    path.write_bytes(data.replace(b'"interval_ms"', b'"interval_mx"'))
    span = TimeRange(T0, T0 + HOUR_MS)
    counted = []
    for workers in (1, 2):
        stats = ReadStats()
        kept = list(archive_records(tmp_path, span, workers=workers, part_bytes=500, stats=stats))
        counted.append((len(kept), stats.as_dict()))
    assert counted[0] == counted[1]
    assert counted[0][1]["cut_tails"] == 1
