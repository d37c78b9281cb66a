"""``peerwatch.files.write_atomic``: the one way state, cursor, head and spool files are replaced."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from peerwatch.files import remove_stale_tmp, write_atomic


def test_replaces_the_content_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomic(path, b"old")
    write_atomic(path, b"new" * 100_000)
    assert path.read_bytes() == b"new" * 100_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_mode_less_the_umask(tmp_path: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        write_atomic(tmp_path / "private", b"x", mode=0o600)
        write_atomic(tmp_path / "shared", b"x")
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o644


def test_durable_syncs_the_data_then_the_folder(tmp_path: Path, fsynced: list[str]) -> None:
    write_atomic(tmp_path / "head", b"1 0\n")
    assert [Path(p).parent for p in fsynced] == [tmp_path, tmp_path.parent]
    assert Path(fsynced[0]).name.startswith(".head.") and fsynced[1] == str(tmp_path)
    fsynced.clear()
    write_atomic(tmp_path / "counters", b"{}", durable=False)
    assert fsynced == []


def test_a_failed_replace_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a directory where the file should go: the rename fails
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert (target / "inside").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_a_missing_folder_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "absent" / "file", b"x")


def test_stale_temporaries_of_one_path_only_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "state"
    (tmp_path / ".state.123.abcd.tmp").write_bytes(b"half")
    (tmp_path / ".state.456.ef01.tmp").write_bytes(b"half")
    (tmp_path / ".other.123.abcd.tmp").write_bytes(b"someone else's")
    assert remove_stale_tmp(path) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.123.abcd.tmp"]
