"""The real one-node Slurm cluster behaves as the producers and parsers expect.

Uses the ``slurm_cluster`` fixture (tests/integration/slurm_fixture.py) and reads every JSON
answer through peerwatch's own parsers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from peerwatch.exporters.drain.slurm_ops import ScontrolSlurm
from peerwatch.producers.slurm.client import CommandSlurmClient
from peerwatch.producers.slurm.parse import SlurmJob, parse_sacct, parse_sinfo, parse_squeue
from peerwatch.reasons import slurm_reason
from tests.integration.slurm_fixture import SlurmCluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cancel_after(slurm_cluster: SlurmCluster) -> Iterator[list[str]]:
    """Job ids appended to this list are cancelled when the test ends."""
    job_ids: list[str] = []
    yield job_ids
    if job_ids:
        slurm_cluster.cmd("scancel", *job_ids)


def _squeue_jobs(cluster: SlurmCluster) -> dict[str, SlurmJob]:
    return {j.job_id: j for j in parse_squeue(cluster.json("squeue", "-t", "all"))}


def test_node_is_up_with_eight_gpus(slurm_cluster: SlurmCluster) -> None:
    [node] = [n for n in parse_sinfo(slurm_cluster.json("sinfo")) if n.name == slurm_cluster.node]
    assert node.gres == f"gpu:{slurm_cluster.gpus}"
    assert "gpu" in node.partitions
    assert "DRAIN" not in node.state_flags


def test_jobs_sharing_the_node_get_disjoint_gpus(
    slurm_cluster: SlurmCluster, cancel_after: list[str]
) -> None:
    wanted = {slurm_cluster.sbatch("--gres=gpu:3", "--wrap", "sleep 60"): 3}
    wanted[slurm_cluster.sbatch("--gres=gpu:2", "--wrap", "sleep 60")] = 2
    wanted[slurm_cluster.sbatch("--gres=gpu:3", "--wrap", "sleep 60")] = 3
    cancel_after.extend(wanted)
    # All 8 GPUs are taken: one more GPU job must wait for resources.
    waiting = slurm_cluster.sbatch("--gres=gpu:1", "--wrap", "true")
    cancel_after.append(waiting)
    for job_id in wanted:
        slurm_cluster.wait_for_job_state(job_id, "RUNNING")

    jobs = _squeue_jobs(slurm_cluster)
    seen: set[int] = set()
    for job_id, count in wanted.items():
        job = jobs[job_id]
        assert job.state == "RUNNING"
        assert job.nodes == (slurm_cluster.node,)
        indices = job.gpu_indices[slurm_cluster.node]
        assert len(indices) == count == job.gpu_count
        assert set(indices) <= set(range(slurm_cluster.gpus))
        assert not seen & set(indices), f"job {job_id} shares GPUs {seen & set(indices)}"
        seen |= set(indices)
    assert seen == set(range(slurm_cluster.gpus))
    assert jobs[waiting].state == "PENDING"
    assert jobs[waiting].gpu_indices == {}


def test_cancelled_job(slurm_cluster: SlurmCluster, cancel_after: list[str]) -> None:
    job_id = slurm_cluster.sbatch("--gres=gpu:1", "--wrap", "sleep 60")
    cancel_after.append(job_id)
    slurm_cluster.wait_for_job_state(job_id, "RUNNING")
    slurm_cluster.cmd("scancel", job_id)
    slurm_cluster.wait_for_job_state(job_id, "CANCELLED")

    job = _squeue_jobs(slurm_cluster)[job_id]
    assert job.state == "CANCELLED"
    assert job.exit_code is None
    assert job.exit_signal in (9, 15)
    assert job.start_ts_ms is not None and job.end_ts_ms is not None
    assert job.end_ts_ms >= job.start_ts_ms


def test_failing_job_shows_failed_with_its_exit_code(slurm_cluster: SlurmCluster) -> None:
    job_id = slurm_cluster.sbatch("--gres=gpu:2", "--wrap", "exit 3")
    slurm_cluster.wait_for_job_state(job_id, "FAILED")

    job = _squeue_jobs(slurm_cluster)[job_id]
    assert (job.state, job.exit_code, job.exit_signal) == ("FAILED", 3, None)
    assert slurm_cluster.cmd("scontrol", "show", "job", job_id).count("ExitCode=3:0") == 1

    # slurmdbd learns about the job asynchronously.
    deadline = time.monotonic() + 20
    accounted: list[SlurmJob] = []
    while time.monotonic() < deadline and not accounted:
        accounted = [j for j in parse_sacct(slurm_cluster.json("sacct", "-j", job_id))]
        accounted = [j for j in accounted if j.state == "FAILED"]
        if not accounted:
            time.sleep(0.3)
    assert [(j.job_id, j.state, j.gpu_count) for j in accounted] == [(job_id, "FAILED", 2)]


def test_drain_and_resume(slurm_cluster: SlurmCluster) -> None:
    reason = "peerwatch integration test: straggler"
    node = slurm_cluster.node
    slurm_cluster.cmd("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
    try:
        slurm_cluster.wait_for_node_state(("drained", "draining"))
        [drained] = [n for n in parse_sinfo(slurm_cluster.json("sinfo")) if n.name == node]
        assert "DRAIN" in drained.state_flags
        assert drained.reason == reason
        assert drained.reason_set_by_user == "root"
        assert drained.reason_changed_ts_ms is not None
        assert reason in slurm_cluster.cmd("sinfo", "-R", "-h", "-o", "%n|%E")
    finally:
        slurm_cluster.cmd("scontrol", "update", f"nodename={node}", "state=resume")
    slurm_cluster.wait_for_node_state(("idle", "mixed", "allocated"))
    [resumed] = [n for n in parse_sinfo(slurm_cluster.json("sinfo")) if n.name == node]
    assert "DRAIN" not in resumed.state_flags
    assert resumed.reason is None
    assert slurm_cluster.cmd("sinfo", "-R", "-h") == ""


def test_drain_and_resume_through_peerwatch_runner_with_non_utf8_reasons(
    slurm_cluster: SlurmCluster,
) -> None:
    """ScontrolSlurm and CommandSlurmClient share one runner: a hostile reason is sanitised on the
    way in, and a reason an operator set with bytes that are not UTF-8 is read without raising."""
    node = slurm_cluster.node
    slurm = ScontrolSlurm(slurm_cluster.bin_dir, timeout_s=30)
    reason = slurm_reason(b'pwtest \xff "runner"; $(id) check')
    assert reason == "peerwatch: pwtest runner (id) check"
    slurm.drain(node, reason)
    try:
        slurm_cluster.wait_for_node_state(("drained", "draining"))
        [facts] = [n for n in slurm.nodes() if n.name == node]
        assert facts.reason == reason and facts.ours
        # An operator's reason with a raw 0xff byte (surrogateescape puts it into the argv).
        slurm_cluster.cmd("scontrol", "update", f"nodename={node}", "reason=pwtest-op \udcff x")
        [facts] = [n for n in slurm.nodes() if n.name == node]
        # Slurm prints the byte as it is (text=True would raise UnicodeDecodeError here).
        assert facts.reason == "pwtest-op \ufffd x" and not facts.ours
        nodes = CommandSlurmClient(slurm_cluster.bin_dir).nodes_json()["nodes"]
        assert [n["reason"] for n in nodes if n["name"] == node] == [facts.reason]
    finally:
        slurm.resume(node)
    slurm_cluster.wait_for_node_state(("idle", "mixed", "allocated"))
    [facts] = [n for n in slurm.nodes() if n.name == node]
    assert not facts.drained and facts.reason is None
