"""The archive writer: commit protocol, crash recovery (exactly once), rotation, retention, and the
consume loop with a fake source."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import fastavro
import pytest

from peerwatch.errors import ConfigError
from peerwatch.exporters.archive import (
    STATE_FILE,
    ArchiveError,
    ArchiveSettings,
    ArchiveWriter,
    closed_name,
    decode_state,
    encode_state,
    expired,
)
from peerwatch.exporters.archive_loop import ArchiveLoop, archived_topics
from peerwatch.io.archive.layout import HOUR_MS, hour_start_ms
from peerwatch.io.archive.reader import read_archive
from peerwatch.schemas.codec import AvroCodec

T0 = 1_767_225_600_000  # 2026-01-01T00:00Z
TOPIC = "peerwatch.slurm.node-events"
TOPICS = {TOPIC: "NodeStateEvent"}


def event(i: int, ts_ms: int | None = None) -> dict[str, Any]:
    return {
        "event_id": f"ev-{i}", "node": f"gpu{i % 7:05d}", "ts_ms": T0 + i * 1000 if ts_ms is None
        else ts_ms, "state": "IDLE", "flags": [], "reason": None, "reason_user": None,
        "reason_set_ms": None, "partitions": ["gpu"], "source": "WATCHER",
    }  # fmt: skip


def ids(root: Path) -> list[str]:
    return [r["event_id"] for r in read_archive(root, TOPIC, "NodeStateEvent")]


def writer(root: Path, **kw: Any) -> ArchiveWriter:
    w = ArchiveWriter(root, TOPICS, ArchiveSettings(**kw))
    w.recover()
    return w


def test_commit_makes_records_readable_and_stores_offsets(tmp_path: Path) -> None:
    w = writer(tmp_path)
    for i in range(10):
        w.write(TOPIC, i % 2, i // 2, event(i), T0 + i * 1000)
    offsets = w.commit()
    assert offsets == {(TOPIC, 0): 5, (TOPIC, 1): 5}
    assert ids(tmp_path) == [f"ev-{i}" for i in range(10)]
    assert (tmp_path / TOPIC / "2026-01-01T00.avro.part").exists()
    state_offsets, lengths = decode_state((tmp_path / STATE_FILE).read_bytes())
    assert state_offsets == offsets
    part = tmp_path / TOPIC / "2026-01-01T00.avro.part"
    assert lengths == {f"{TOPIC}/2026-01-01T00.avro.part": part.stat().st_size}
    w.close()


def test_file_embeds_schema_and_is_compressed(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.write(TOPIC, 0, 0, event(0), T0)
    w.close()
    with (tmp_path / TOPIC / "2026-01-01T00.avro.part").open("rb") as fh:
        reader = fastavro.reader(fh)
        assert reader.metadata["avro.codec"] == "zstandard"
        assert reader.writer_schema["name"].endswith("NodeStateEvent")  # type: ignore[index]


def test_crash_after_commit_recovers_exactly_the_committed_records(tmp_path: Path) -> None:
    w = writer(tmp_path, flush_records=1_000_000)
    for i in range(50):
        w.write(TOPIC, 0, i, event(i), T0 + i * 1000)
    assert w.commit() == {(TOPIC, 0): 50}
    # Uncommitted: a whole extra block on disk, a new hour's file, and a cut block at the tail.
    for i in range(50, 80):
        w.write(TOPIC, 0, i, event(i), T0 + i * 1000)
    w.write(TOPIC, 0, 80, event(80, T0 + HOUR_MS + 5), T0 + HOUR_MS + 5)
    for entry in w._open.values():  # simulate the kill: bytes reached the disk, no commit
        entry.writer.flush()
        entry.fh.close()
    part = tmp_path / TOPIC / "2026-01-01T00.avro.part"
    with part.open("ab") as fh:
        fh.write(b"\x20\x80\x01half a block")
    # A reader before the restart sees complete blocks and ignores the cut tail.
    assert ids(tmp_path)[:80] == [f"ev-{i}" for i in range(80)]

    again = ArchiveWriter(tmp_path, TOPICS)
    assert again.recover() == {(TOPIC, 0): 50}
    assert ids(tmp_path) == [f"ev-{i}" for i in range(50)]
    assert not (tmp_path / TOPIC / "2026-01-01T01.avro.part").exists()
    # Continuing from offset 50 gives every record exactly once.
    for i in range(50, 81):
        ts = T0 + HOUR_MS + 5 if i == 80 else T0 + i * 1000
        again.write(TOPIC, 0, i, event(i, ts), ts)
    again.close()
    assert ids(tmp_path) == [f"ev-{i}" for i in range(81)]


def test_recovery_refuses_a_file_shorter_than_committed(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.write(TOPIC, 0, 0, event(0), T0)
    w.close()
    part = tmp_path / TOPIC / "2026-01-01T00.avro.part"
    with part.open("r+b") as fh:
        fh.truncate(part.stat().st_size - 3)
    with pytest.raises(ArchiveError, match="committed"):
        ArchiveWriter(tmp_path, TOPICS).recover()


def test_malformed_state_is_an_archive_error(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(ArchiveError):
        ArchiveWriter(tmp_path, TOPICS).recover()


def test_state_round_trip() -> None:
    offsets = {("a", 0): 3, ("a", 11): 7, ("b.c", 2): 1}
    lengths = {"a/2026-01-01T00.avro.part": 1234}
    assert decode_state(encode_state(offsets, lengths)) == (offsets, lengths)
    assert json.loads(encode_state(offsets, lengths))["offsets"]["a"] == {"0": 3, "11": 7}


def test_rotation_closes_an_hour_once_event_time_passed_it(tmp_path: Path) -> None:
    w = writer(tmp_path, rotate_after_s=60)
    w.write(TOPIC, 0, 0, event(0), T0)
    w.write(TOPIC, 0, 1, event(1, T0 + HOUR_MS + 30_000), T0 + HOUR_MS + 30_000)
    w.commit()
    assert (tmp_path / TOPIC / "2026-01-01T00.avro.part").exists()  # 30 s past: not yet
    w.write(TOPIC, 0, 2, event(2, T0 + HOUR_MS + 61_000), T0 + HOUR_MS + 61_000)
    w.commit()
    folder = tmp_path / TOPIC
    assert sorted(p.name for p in folder.iterdir()) == [
        "2026-01-01T00.avro",
        "2026-01-01T01.avro.part",
    ]
    # A late record for the closed hour goes to a new file of that hour, never into the closed one.
    w.write(TOPIC, 0, 3, event(3, T0 + 10), T0 + 10)
    w.commit()
    assert sorted(p.name for p in folder.iterdir()) == [
        "2026-01-01T00.1.avro", "2026-01-01T00.avro", "2026-01-01T01.avro.part",
    ]  # fmt: skip
    assert sorted(ids(tmp_path)) == ["ev-0", "ev-1", "ev-2", "ev-3"]
    _, lengths = decode_state((tmp_path / STATE_FILE).read_bytes())
    assert list(lengths) == [f"{TOPIC}/2026-01-01T01.avro.part"]
    w.close()


def test_closed_name_picks_the_first_free_slot(tmp_path: Path) -> None:
    assert closed_name(tmp_path, "2026-01-01T00").name == "2026-01-01T00.avro"
    (tmp_path / "2026-01-01T00.avro").touch()
    (tmp_path / "2026-01-01T00.1.avro").touch()
    assert closed_name(tmp_path, "2026-01-01T00").name == "2026-01-01T00.2.avro"


@pytest.mark.parametrize(
    ("name", "age_h", "is_expired"),
    [
        ("2026-01-01T00.avro", 49, True),
        ("2026-01-01T00.3.avro", 49, True),
        ("2026-01-01T00.avro", 47, False),
        ("2026-01-01T00.avro.part", 100, False),  # still being written: never deleted
        ("labels.jsonl", 100, False),
    ],
)
def test_expired(name: str, age_h: int, is_expired: bool) -> None:
    now = hour_start_ms("2026-01-01T00") + age_h * HOUR_MS
    assert expired(name, now, 2 * 24 * HOUR_MS) is is_expired


def test_retain_deletes_old_closed_files_only(tmp_path: Path) -> None:
    w = writer(tmp_path, retention_days=1, rotate_after_s=0)
    w.write(TOPIC, 0, 0, event(0), T0)
    w.write(TOPIC, 0, 1, event(1, T0 + 3 * HOUR_MS), T0 + 3 * HOUR_MS)
    w.commit()
    removed = w.retain(T0 + 26 * HOUR_MS)
    assert [p.name for p in removed] == ["2026-01-01T00.avro"]
    assert ids(tmp_path) == ["ev-1"]
    w.close()


def test_settings_validation() -> None:
    with pytest.raises(ConfigError, match="codec"):
        ArchiveSettings(codec="lzma").validate()
    with pytest.raises(ConfigError, match="flush_records"):
        ArchiveSettings(flush_records=0).validate()


def test_archived_topics_cover_inputs_and_outputs() -> None:
    topics = archived_topics("x.")
    assert topics["x.peerwatch.gpu.samples"] == "NodeGpuSample"
    assert topics["x.peerwatch.stragglers"] == "StragglerFinding"
    assert "x.peerwatch.deadletter" not in topics


# -- the loop with a fake Kafka --------------------------------------------------------------------
class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, value: bytes, ts_ms: int) -> None:
        self._t, self._p, self._o, self._v, self._ts = topic, partition, offset, value, ts_ms

    def error(self) -> Any:
        return None

    def value(self) -> bytes:
        return self._v

    def key(self) -> bytes:
        return b"k"

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)


class FakeSource:
    def __init__(self, messages: list[FakeMessage]) -> None:
        self.messages = messages
        self.commits: list[dict[tuple[str, int], int]] = []
        self.durable_at_commit: list[list[str]] = []
        self.root: Path | None = None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[FakeMessage]:
        batch, self.messages = self.messages[:num_messages], self.messages[num_messages:]
        return batch

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.commits.append(dict(offsets))
        assert self.root is not None
        self.durable_at_commit.append(ids(self.root))

    def close(self) -> None:
        pass


class FakeDeadLetter:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, list[tuple[str, bytes]]]] = []

    def send(
        self, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        self.sent.append((value, headers))


def test_loop_commits_offsets_only_for_durable_records(tmp_path: Path) -> None:
    codec = AvroCodec("NodeStateEvent")
    values = [codec.encode(event(i)) for i in range(6)]
    values.insert(3, b"garbage")  # offset 3 is undecodable
    source = FakeSource([FakeMessage(TOPIC, 0, o, v, T0) for o, v in enumerate(values)])
    source.root = tmp_path
    dead = FakeDeadLetter()
    loop = ArchiveLoop(source, writer(tmp_path, flush_records=3, flush_interval_s=3600), TOPICS,
                       deadletter=dead, batch_size=4, clock=lambda: 0.0)  # fmt: skip
    loop.run_once()
    loop.run_once()
    source.commit_offsets(loop._writer.close())
    assert loop.stats.records == 6 and loop.stats.undecodable == 1
    assert len(dead.sent) == 1 and dead.sent[0][0] == b"garbage"
    assert source.commits[-1] == {(TOPIC, 0): 7}  # past the dead-lettered record too
    # Every committed offset was durable when committed: the good records before it were on disk.
    for offsets, durable in zip(source.commits, source.durable_at_commit, strict=True):
        good_before = sum(1 for o in range(offsets[(TOPIC, 0)]) if o != 3)
        assert len(durable) == good_before
    assert ids(tmp_path) == [f"ev-{i}" for i in range(6)]


def test_state_write_is_atomic_no_tmp_left(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.write(TOPIC, 0, 0, event(0), T0)
    w.close()
    assert sorted(os.listdir(tmp_path)) == [STATE_FILE, TOPIC]


@pytest.mark.parametrize("bad_ts", [2**62, 2**63 - 1, -(2**62), -1, 253_402_300_800_000])
def test_an_event_time_no_hour_names_is_dead_lettered_and_the_loop_goes_on(
    tmp_path: Path, bad_ts: int
) -> None:
    # Issue 12 item 5: ts_ms = 2**62 made hour_of() raise outside the try, before the offset
    # advanced: the archiver ended, and every restart failed on the same message.
    codec = AvroCodec("NodeStateEvent")
    values = [codec.encode(event(i)) for i in range(4)]
    values.insert(2, codec.encode(event(99, ts_ms=bad_ts)))
    source = FakeSource([FakeMessage(TOPIC, 0, o, v, T0) for o, v in enumerate(values)])
    source.root = tmp_path
    dead = FakeDeadLetter()
    loop = ArchiveLoop(source, writer(tmp_path), TOPICS, deadletter=dead, clock=lambda: 0.0)
    assert loop.run_once() == 5
    source.commit_offsets(loop._writer.close())
    assert loop.stats.records == 4 and loop.stats.bad_time == 1 and loop.stats.undecodable == 0
    assert [v for v, _ in dead.sent] == [values[2]]
    reason = dict(dead.sent[0][1])["peerwatch.reason"].decode()
    assert reason.startswith("bad event time") and str(bad_ts) in reason
    assert source.commits[-1] == {(TOPIC, 0): 5}  # past it: a restart does not read it again
    assert ids(tmp_path) == [f"ev-{i}" for i in range(4)]


def test_hour_of_refuses_times_no_file_is_named_by() -> None:
    from peerwatch.io.archive.layout import MAX_TS_MS, hour_of

    assert hour_of(0) == "1970-01-01T00"
    assert hour_of(MAX_TS_MS - 1) == "9999-12-31T23"
    for ts in (-1, MAX_TS_MS, 2**62, -(2**63)):
        with pytest.raises(ValueError, match=r"outside 1970\.\.9999"):
            hour_of(ts)
