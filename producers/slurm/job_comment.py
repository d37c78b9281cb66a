"""``peerwatch job --admin-comment``: the job's one-line verdict stored in its Slurm
AdminComment (``scontrol update JobId=... AdminComment=...``), e.g. from an EpilogSlurmctld hook,
so that ``sacct -o AdminComment`` answers "why was my job slow?" after the fact.

An argument vector, never a shell; the job id must be a plain Slurm job id and the comment is
the verdict through the one reason sanitiser (:mod:`peerwatch.reasons`), prefixed
``peerwatch:``.
"""

from __future__ import annotations

import re

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


def set_admin_comment(commands: SlurmCommands, job_id: str, verdict: str) -> str:
    """Store the verdict in the job's AdminComment; returns the comment. Raises ValueError (job
    id) and SlurmCommandError (scontrol failed or timed out)."""
    argv = admin_comment_argv(job_id, verdict)
    commands.run("scontrol", *argv)
    return argv[-1].split("=", 1)[1]
