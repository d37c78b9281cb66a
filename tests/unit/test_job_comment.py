"""The verdict as a Slurm AdminComment: argument vector, sanitised text, refused job ids."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from peerwatch.errors import SlurmCommandError
from peerwatch.producers.slurm.command import CommandResult, SlurmCommands
from peerwatch.producers.slurm.job_comment import (
    ADMIN_COMMENT_MAX_CHARS,
    admin_comment,
    admin_comment_argv,
    set_admin_comment,
)

VERDICT = "GPU 3 on gpu00005 ran 8.1% slow (SM clock) for 20 min; cause THERMAL; node drained"


def test_the_verdict_becomes_one_scontrol_argument() -> None:
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
        calls.append(list(argv))
        return CommandResult(0, "", "")

    comment = set_admin_comment(SlurmCommands("/opt/slurm/bin", 5.0, runner), "1001", VERDICT)
    assert comment == (
        "peerwatch: GPU 3 on gpu00005 ran 8.1% slow (SM clock) for 20 min, cause THERMAL, "
        "node drained"
    )
    assert calls == [["/opt/slurm/bin/scontrol", "update", "JobId=1001", f"AdminComment={comment}"]]


@pytest.mark.parametrize("job_id", ["1001", "1001_7", "1001+1"])
def test_plain_job_ids_pass(job_id: str) -> None:
    assert admin_comment_argv(job_id, "v")[1] == f"JobId={job_id}"


@pytest.mark.parametrize(
    "job_id", ["", "1001 AdminComment=x", "1001;rm", "../1", "1001_", "-1", "1e3", "\uff11\uff12"]
)
def test_anything_else_is_refused(job_id: str) -> None:
    with pytest.raises(ValueError, match="not a plain Slurm job id"):
        admin_comment_argv(job_id, VERDICT)


def test_hostile_text_is_sanitised_and_bounded() -> None:
    text = admin_comment("x`rm -rf /`$(id)\n;Reason=y " + "z" * 400)
    assert text.startswith("peerwatch: x rm -rf / (id) ,Reason=y z")
    assert len(text) == ADMIN_COMMENT_MAX_CHARS
    assert not any(c in text for c in "`$\n;")


def test_an_ended_job_is_commented_through_accounting() -> None:
    # EpilogSlurmctld runs when the job has ended: slurmctld refuses the update (seen on Slurm
    # 22.05: "Job has already finished for job 3"), sacctmgr stores it where sacct reads it.
    calls: list[list[str]] = []

    def runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
        calls.append(list(argv))
        if argv[0].endswith("scontrol"):
            return CommandResult(1, "", "Job has already finished for job 1001\n")
        return CommandResult(0, " Modified jobs...\n", "")

    comment = set_admin_comment(SlurmCommands("/opt/slurm/bin", 5.0, runner), "1001", VERDICT)
    assert calls[1] == ["/opt/slurm/bin/sacctmgr", "-i", "modify", "job", "where", "jobid=1001",
                        "set", f"AdminComment={comment}"]  # fmt: skip


def test_another_scontrol_failure_is_not_hidden() -> None:
    def runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
        return CommandResult(1, "", "Access/permission denied\n")

    with pytest.raises(SlurmCommandError, match="permission denied"):
        set_admin_comment(SlurmCommands(None, 5.0, runner), "1001", VERDICT)
