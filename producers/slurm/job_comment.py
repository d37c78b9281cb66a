"""``peerwatch job --admin-comment``: the job's one-line verdict stored in its Slurm
AdminComment (``scontrol update JobId=... AdminComment=...``, or through accounting once the job
ended), e.g. from an EpilogSlurmctld hook,
so that ``sacct -o AdminComment`` answers "why was my job slow?" after the fact.

An argument vector, never a shell; the job id must be a plain Slurm job id and the comment is
the verdict through the one reason sanitiser (:mod:`peerwatch.reasons`), prefixed
``peerwatch:``.
"""

from __future__ import annotations

import re

from peerwatch.errors import SlurmCommandError
from peerwatch.producers.slurm.command import SlurmCommands
from peerwatch.reasons import slurm_reason

#: A plain Slurm job id: ``123``, an array task ``123_4`` or a heterogeneous component ``123+1``.
JOB_ID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,9})?")
#: Long enough for a verdict with the GPU, node, size, duration, cause and node outcome.
ADMIN_COMMENT_MAX_CHARS = 250


def admin_comment(verdict: str) -> str:
    """The AdminComment text for ``verdict``: ``peerwatch: <verdict>`` sanitised (``;`` reads as
    ``,``), at most :data:`ADMIN_COMMENT_MAX_CHARS` characters."""
    return slurm_reason(verdict.replace(";", ","), ADMIN_COMMENT_MAX_CHARS)


def admin_comment_argv(job_id: str, verdict: str) -> list[str]:
    """The ``scontrol`` arguments that store the verdict. Raises ValueError for a job id that is
    not a plain Slurm job id."""
    if not JOB_ID.fullmatch(job_id):
        raise ValueError(f"refusing job id {job_id!r}: not a plain Slurm job id")
    return ["update", f"JobId={job_id}", f"AdminComment={admin_comment(verdict)}"]


#: What ``scontrol update`` answers for a job that ended (Slurm 22.05 to 25.x), which is every
#: job by the time EpilogSlurmctld runs: its record is then changed in the accounting database.
FINISHED = "already finished"


def set_admin_comment(commands: SlurmCommands, job_id: str, verdict: str) -> str:
    """Store the verdict in the job's AdminComment; returns the comment. A running job is
    updated through slurmctld (``scontrol update``); an ended one, as from EpilogSlurmctld,
    through accounting (``sacctmgr -i modify job where jobid=<id> set AdminComment=...``),
    where ``sacct`` reads it. Raises ValueError (job id) and SlurmCommandError (both failed, or
    timed out)."""
    argv = admin_comment_argv(job_id, verdict)
    comment = argv[-1]
    try:
        commands.run("scontrol", *argv)
    except SlurmCommandError as exc:
        if FINISHED not in str(exc):
            raise
        commands.run("sacctmgr", "-i", "modify", "job", "where", f"jobid={job_id}", "set", comment)
    return comment.split("=", 1)[1]
