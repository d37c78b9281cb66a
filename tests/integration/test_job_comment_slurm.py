"""``peerwatch job JOBID --admin-comment`` on the real Slurm: the verdict lands in the job's
AdminComment (``scontrol show job``), through an argument vector."""

from __future__ import annotations

import os
from pathlib import Path

from tests.integration.archive_helpers import run
from tests.integration.slurm_fixture import SlurmCluster


def test_the_verdict_is_stored_in_the_jobs_admin_comment(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    job_id = slurm_cluster.sbatch("--wrap", "sleep 120")
    try:
        (tmp_path / "archive").mkdir()  # an archive without this job: the verdict says so
        out = run(["job", job_id, "--archive", str(tmp_path / "archive"), "--admin-comment",
                   "--slurm-bin", str(slurm_cluster.bin_dir)], dict(os.environ))  # fmt: skip
        verdict = f"job {job_id}: no GPU windows or findings found for this job"
        assert f"Verdict: {verdict}" in out
        shown = slurm_cluster.cmd("scontrol", "show", "job", job_id)
        assert f"AdminComment=peerwatch: {verdict}" in shown
    finally:
        slurm_cluster.cmd("scancel", job_id)
