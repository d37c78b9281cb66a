"""Output paths are checked before the work (issue 40 item 9): ``replay --report``/``--findings``,
``job --html`` and ``archive --dir`` that cannot be written fail at once, naming the option,
instead of a traceback after the work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerwatch.cli import main
from peerwatch.errors import ConfigError
from peerwatch.output_paths import check_output_dir, check_output_file, write_output


def unwritable_files(tmp_path: Path) -> list[tuple[str, str]]:
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "plain").write_text("")
    return [
        (str(tmp_path / "missing" / "report.html"), "No such file or directory"),
        (str(tmp_path / "a-dir"), "is a directory"),
        (str(tmp_path / "plain" / "report.html"), "Not a directory"),
        (str(tmp_path / "nul\0.html"), "null"),
        ("/proc/version", "cannot write /proc/version"),  # refused even to root
    ]


def test_an_unwritable_file_is_a_config_error_naming_the_option(tmp_path: Path) -> None:
    for path, why in unwritable_files(tmp_path):
        with pytest.raises(ConfigError, match="--report") as caught:
            check_output_file(path, "--report")
        assert why in str(caught.value), (path, str(caught.value))


def test_a_writable_file_is_left_as_it_was(tmp_path: Path) -> None:
    new = tmp_path / "new.html"
    assert check_output_file(str(new), "--html") == new and not new.exists()
    old = tmp_path / "old.jsonl"
    old.write_text("kept\n")
    check_output_file(str(old), "--findings")
    assert old.read_text() == "kept\n"
    write_output(new, "<html>", "--html")
    assert new.read_text() == "<html>"


def test_an_output_folder_is_created_or_refused(tmp_path: Path) -> None:
    made = check_output_dir(str(tmp_path / "archive" / "deep"), "--dir")
    assert made.is_dir() and list(made.iterdir()) == []
    (tmp_path / "plain").write_text("")
    for path in (str(tmp_path / "plain"), "/proc/version/archive", str(tmp_path / "nul\0")):
        with pytest.raises(ConfigError, match="--dir: cannot write in"):
            check_output_dir(path, "--dir")


def _no_work(*_a: Any, **_k: Any) -> Any:
    raise AssertionError("the work started before the output path was checked")


@pytest.mark.parametrize("option", ["--report", "--findings"])
def test_replay_checks_its_outputs_before_replaying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    option: str,
) -> None:  # fmt: skip
    from peerwatch.commands import replay

    monkeypatch.setattr(replay, "replay_from_args", _no_work)
    out = str(tmp_path / "missing" / "out")
    assert main(["replay", "--archive", str(tmp_path), option, out]) == 2
    assert f"{option}: cannot write {out}" in capsys.readouterr().err


def test_job_checks_its_page_before_reading_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from peerwatch.commands import job

    monkeypatch.setattr(job, "load", _no_work)
    assert main(["job", "1234", "--archive", str(tmp_path), "--html", str(tmp_path)]) == 2
    assert "--html: " in capsys.readouterr().err


def test_archive_checks_its_folder_before_kafka(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import peerwatch.topic_admin

    monkeypatch.setattr(peerwatch.topic_admin, "ensure_topics", _no_work)
    (tmp_path / "plain").write_text("")
    assert main(["archive", "--dir", str(tmp_path / "plain" / "archive")]) == 2
    assert "--dir: cannot write in" in capsys.readouterr().err
