"""The one Slurm command runner (producers/slurm/command.py), as the watcher's client and the drain
controller's ScontrolSlurm use it: argument vectors, timeouts, non-UTF-8 output never raising."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from peerwatch.errors import ServiceError, SlurmCommandError
from peerwatch.exporters.drain.slurm_ops import ScontrolSlurm
from peerwatch.producers.slurm.client import CommandSlurmClient
from peerwatch.producers.slurm.command import (
    CommandResult,
    SlurmCommands,
    decode_output,
    run_command,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


class Recorder:
    """A runner answering every command with ``answers[argv[0]'s name]`` (in order)."""

    def __init__(self, **answers: list[CommandResult | Exception]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append((list(argv), timeout_s))
        answer = self.answers[Path(argv[0]).name].pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_one_error_class_in_the_documented_hierarchy() -> None:
    assert issubclass(SlurmCommandError, ServiceError)
    assert isinstance(CommandSlurmClient(), SlurmCommands)


def test_decode_output_replaces_bytes_that_are_not_utf8() -> None:
    assert decode_output(b"job \xff\xfe caf\xc3\xa9") == "job \ufffd\ufffd caf\u00e9"


class FakeRun:
    """Stands in for ``subprocess.run`` (unit tests start no process): records its arguments and
    answers with bytes, as a process without ``text=True`` does."""

    def __init__(self, stdout: bytes, stderr: bytes = b"", returncode: int = 0) -> None:
        self.answer = (returncode, stdout, stderr)
        self.calls: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        self.calls.append((argv, kw))
        code, out, err = self.answer
        return subprocess.CompletedProcess(argv, code, out, err)


def test_run_command_reads_bytes_without_a_shell_and_never_raises_on_bad_utf8(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeRun(b"name=\xff", b"\xfe")
    monkeypatch.setattr(subprocess, "run", fake)
    assert run_command(("squeue", "--name=a; b"), 4.5) == CommandResult(0, "name=\ufffd", "\ufffd")
    [(argv, kw)] = fake.calls
    assert argv == ["squeue", "--name=a; b"]
    assert kw == {"capture_output": True, "timeout": 4.5, "stdin": subprocess.DEVNULL,
                  "check": False}  # no shell, no text mode  # fmt: skip


def test_client_parses_json_with_non_utf8_job_names(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRun(b'{"jobs": [{"name": "r\xffsum\xe9"}]}')
    monkeypatch.setattr(subprocess, "run", fake)
    doc = CommandSlurmClient(Path("/opt/slurm/bin"), timeout_s=10).squeue_json()
    assert doc["jobs"][0]["name"] == "r\ufffdsum\ufffd"
    assert fake.calls[0][0] == ["/opt/slurm/bin/squeue", "--json", "--states=all"]


def test_non_utf8_stderr_of_a_failed_command_is_in_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(subprocess, "run", FakeRun(b"", b"scontrol: error: node \xff\n", 1))
    with pytest.raises(SlurmCommandError, match="exited 1: scontrol: error: node \ufffd"):
        ScontrolSlurm().resume("n1")


def test_scontrol_slurm_uses_the_runner_from_bin_dir() -> None:
    drained = (DATA / "22.05/sinfo-drained.json").read_text()
    runner = Recorder(sinfo=[CommandResult(0, drained, "")], scontrol=[CommandResult(0, "", "")])
    slurm = ScontrolSlurm("/opt/slurm/bin", timeout_s=7, runner=runner)
    [node] = slurm.nodes()
    assert (node.name, node.reason, node.partitions) == (
        "vm", "peerwatch: sm clock 12% below peers", ("gpu",))  # fmt: skip
    slurm.drain("vm", "peerwatch: x")
    assert runner.calls == [
        (["/opt/slurm/bin/sinfo", "--json"], 7),
        (["/opt/slurm/bin/scontrol", "update", "NodeName=vm", "State=DRAIN",
          "Reason=peerwatch: x"], 7),
    ]  # fmt: skip


def test_scontrol_slurm_asks_scontrol_when_sinfo_prints_aggregates() -> None:
    nodes = (DATA / "25.11/scontrol-show-nodes.json").read_text()
    runner = Recorder(
        sinfo=[CommandResult(0, '{"sinfo": []}', "")], scontrol=[CommandResult(0, nodes, "")]
    )
    assert len(ScontrolSlurm(runner=runner).nodes()) == 4
    assert runner.calls[-1][0] == ["scontrol", "show", "nodes", "--json"]


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (subprocess.TimeoutExpired(["sinfo"], 3), "within 3 s"),
        (FileNotFoundError(2, "No such file or directory"), "cannot run `sinfo --json`"),
        (CommandResult(1, "", "sinfo: error: Unable to contact slurm controller"), "exited 1"),
        (CommandResult(0, "not json \xff", ""), "cannot read Slurm's node list"),
        (CommandResult(0, "[]", ""), "cannot read Slurm's node list"),
    ],
)
def test_scontrol_slurm_failures_are_slurm_command_errors(
    answer: CommandResult | Exception, match: str
) -> None:
    slurm = ScontrolSlurm(timeout_s=3, runner=Recorder(sinfo=[answer]))
    with pytest.raises(SlurmCommandError, match=match):
        slurm.nodes()


def test_scontrol_slurm_refuses_unsafe_arguments_without_running_anything() -> None:
    runner = Recorder()
    slurm = ScontrolSlurm(runner=runner)
    with pytest.raises(SlurmCommandError, match="unsafe node name"):
        slurm.drain("n[1-2]", "peerwatch: x")
    with pytest.raises(SlurmCommandError, match="unsafe reason"):
        slurm.drain("n1", "peerwatch: x; scontrol delete")
    with pytest.raises(SlurmCommandError, match="unsafe node name"):
        slurm.resume("n1,n2")
    assert runner.calls == []
