"""What ``peerwatch job`` and ``peerwatch replay`` say when there is nothing to show (issue 40
item 10): an archive written with another topic prefix names the prefixes it holds, and a job
with no record at all is unknown (exit 1), not "0 GPUs on 0 nodes"."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerwatch.cli import main
from peerwatch.errors import ConfigError
from peerwatch.streams.offline.job_records import archive_prefixes, check_archive_prefix
from peerwatch.topics import JOB_EVENTS, JOB_WINDOWS, SAMPLES


def archive(root: Path, prefix: str) -> Path:
    for spec in (SAMPLES, JOB_EVENTS, JOB_WINDOWS):
        (root / (prefix + spec.name)).mkdir(parents=True, exist_ok=True)
    return root


def test_the_prefixes_an_archive_holds(tmp_path: Path) -> None:
    archive(tmp_path, "prod.")
    archive(tmp_path, "")
    (tmp_path / "unrelated").mkdir()
    (tmp_path / "x.peerwatch.gpu.samples.avro").write_text("a file, not a topic folder")
    assert archive_prefixes(tmp_path) == ["", "prod."]
    check_archive_prefix(tmp_path, "prod.")  # held: nothing raised
    with pytest.raises(ConfigError, match=r"prefix 'test\.'.*the prefixes '', 'prod\.'"):
        check_archive_prefix(tmp_path, "test.")


def test_an_archive_of_nothing_is_left_to_the_command(tmp_path: Path) -> None:
    check_archive_prefix(tmp_path, "")  # nothing to compare: replay says "no sample files"


@pytest.mark.parametrize("command", [["job", "1234"], ["replay"]])
def test_a_prefix_mismatch_names_the_archives_prefixes(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
) -> None:
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", "")
    archive(tmp_path, "prod.")
    assert main([*command, "--archive", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no topics with the prefix ''" in err and "'prod.'" in err


def test_a_job_the_archive_does_not_know_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", "prod.")
    archive(tmp_path, "prod.")
    assert main(["job", "999999", "--archive", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "job 999999 is unknown" in out.err and "0 GPUs" not in out.out + out.err
    assert main(["job", "999999", "--archive", str(tmp_path), "--quiet"]) == 1
    assert capsys.readouterr().err == ""
