"""``peerwatch slurm watch`` against the real Slurm cluster and the real Kafka broker.

GPU jobs sharing the node, a cancelled job, a failing job, drain and resume of the node, and a
restarted watcher that publishes nothing new. The watcher runs as the CLI (``--once``) between
the steps; every record is read back from Kafka and decoded.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import JOB_EVENTS, NODE_EVENTS, catalogue
from tests.integration.slurm_fixture import SlurmCluster
from tests.integration.slurm_kafka import TopicReader, peerwatch_env, run_peerwatch

pytestmark = pytest.mark.integration


@pytest.fixture
def jobs_to_cancel(slurm_cluster: SlurmCluster) -> Iterator[list[str]]:
    job_ids: list[str] = []
    yield job_ids
    if job_ids:
        slurm_cluster.cmd("scancel", *job_ids)


def events_of(records: list[dict[str, Any]], job_id: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["job_id"] == job_id and r["kind"] == kind]


def test_watcher_publishes_jobs_and_node_states(
    slurm_cluster: SlurmCluster,
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    tmp_path: Path,
    jobs_to_cancel: list[str],
) -> None:
    specs = [
        s for s in catalogue(topic_prefix) if s.name.endswith((JOB_EVENTS.name, NODE_EVENTS.name))
    ]
    ensure_topics(kafka_settings, specs)
    jobs_reader = TopicReader(kafka_settings, topic_prefix + JOB_EVENTS.name, "JobEvent")
    nodes_reader = TopicReader(kafka_settings, topic_prefix + NODE_EVENTS.name, "NodeStateEvent")
    env = peerwatch_env(kafka_settings, topic_prefix, tmp_path)
    state_file = tmp_path / "watch-state.json"
    watch = ["slurm", "watch", "--once", "--slurm-bin", str(slurm_cluster.bin_dir),
             "--state-file", str(state_file)]  # fmt: skip

    def poll() -> None:
        proc = run_peerwatch(watch, env)
        assert proc.returncode == 0, proc.stderr

    node = slurm_cluster.node
    out = f"--output={tmp_path}/slurm-%j.out"
    wanted = {slurm_cluster.sbatch(out, "--gres=gpu:3", "--wrap", "sleep 120"): 3}
    wanted[slurm_cluster.sbatch(out, "--gres=gpu:2", "--wrap", "sleep 120")] = 2
    wanted[slurm_cluster.sbatch(out, "--gres=gpu:3", "--wrap", "sleep 120")] = 3
    jobs_to_cancel.extend(wanted)
    for job_id in wanted:
        slurm_cluster.wait_for_job_state(job_id, "RUNNING")
    poll()

    # 1. Three jobs share the node's 8 GPUs: STARTED with disjoint indices covering all 8.
    records = jobs_reader.read_until(lambda rs: all(events_of(rs, j, "STARTED") for j in wanted))
    seen: set[int] = set()
    for job_id, count in wanted.items():
        [submitted] = events_of(records, job_id, "SUBMITTED")
        [started] = events_of(records, job_id, "STARTED")
        assert submitted["source"] == started["source"] == "WATCHER"
        assert (started["user"], started["partition"]) == ("root", "gpu")
        [alloc] = started["allocations"]
        assert alloc["node"] == node and len(alloc["gpu_indices"]) == count
        assert not seen & set(alloc["gpu_indices"])
        seen |= set(alloc["gpu_indices"])
    assert seen == set(range(slurm_cluster.gpus))

    # 2. A cancelled job and a failing job.
    cancelled = next(iter(wanted))
    slurm_cluster.cmd("scancel", cancelled)
    slurm_cluster.wait_for_job_state(cancelled, "CANCELLED")
    failing = slurm_cluster.sbatch(out, "--gres=gpu:1", "--wrap", "exit 3")
    slurm_cluster.wait_for_job_state(failing, "FAILED")
    poll()
    records = jobs_reader.read_until(
        lambda rs: bool(events_of(rs, cancelled, "ENDED") and events_of(rs, failing, "ENDED"))
    )
    [ended] = events_of(records, cancelled, "ENDED")
    # scancel sends SIGTERM to the batch shell and its child together: Slurm records the
    # signal (no return code) when the shell dies of it, 143 (128 + 15) when the shell reaps
    # its killed child first and exits normally. Both are what Slurm really reported.
    assert ended["state"] == "CANCELLED" and ended["exit_code"] in (None, 128 + signal.SIGTERM)
    [started] = events_of(records, cancelled, "STARTED")
    assert ended["allocations"] == started["allocations"]
    assert ended["end_ms"] >= ended["start_ms"]
    [failed] = events_of(records, failing, "ENDED")
    assert (failed["state"], failed["exit_code"]) == ("FAILED", 3)

    # 3. Drain and resume the node: two node events with the reason, then without.
    reason = f"peerwatch test {topic_prefix}"
    slurm_cluster.cmd("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}")
    try:
        slurm_cluster.wait_for_node_state(("drained", "draining"))
        poll()
    finally:
        slurm_cluster.cmd("scontrol", "update", f"nodename={node}", "state=resume")
    slurm_cluster.wait_for_node_state(("idle", "mixed", "allocated"))
    poll()
    node_records = nodes_reader.read_until(
        lambda rs: any(r["reason"] == reason for r in rs) and "DRAIN" not in rs[-1]["flags"]
    )
    mine = [r for r in node_records if r["node"] == node]
    drains = [r for r in mine if r["reason"] == reason]
    assert len(drains) == 1 and "DRAIN" in drains[0]["flags"]
    assert drains[0]["reason_user"] == "root" and drains[0]["reason_set_ms"] is not None
    after = mine[mine.index(drains[0]) + 1 :]
    assert [(r["reason"], "DRAIN" in r["flags"]) for r in after] == [(None, False)]

    # 4. A restarted watcher publishes nothing new; ids were never repeated.
    jobs_before = len(jobs_reader.settle())
    nodes_before = len(nodes_reader.settle())
    poll()
    assert len(jobs_reader.settle()) == jobs_before
    assert len(nodes_reader.settle()) == nodes_before
    ids = [r["event_id"] for r in jobs_reader.records + nodes_reader.records]
    assert len(ids) == len(set(ids))

    # The dry run prints what it would publish, as JSON lines, without touching the state.
    state_before = state_file.read_text()
    still_running = [j for j in wanted if j != cancelled]
    slurm_cluster.cmd("scancel", *still_running)
    for job_id in still_running:
        slurm_cluster.wait_for_job_state(job_id, "CANCELLED")
    proc = run_peerwatch([*watch, "--dry-run"], env)
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    job_lines = [x for x in lines if x["topic"] == topic_prefix + JOB_EVENTS.name]
    assert {(x["key"], x["value"]["kind"]) for x in job_lines} >= {
        (j, "ENDED") for j in still_running
    }
    node_lines = [x for x in lines if x["topic"] == topic_prefix + NODE_EVENTS.name]
    assert len(job_lines) + len(node_lines) == len(lines), lines
    assert state_file.read_text() == state_before
    jobs_reader.close()
    nodes_reader.close()
