"""``peerwatch slurm prolog|epilog`` run by the real slurmd, publishing to the real Kafka.

The cluster is reconfigured with Prolog=/Epilog= wrapper scripts (``scripts/slurm-up.sh`` with
``PEERWATCH_SLURM_PROLOG``/``_EPILOG``) and restored without them afterwards. The wrappers set
the Kafka address and topic prefix, run the hook, and record its wall time as slurmd sees it.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.slurm.parse import SlurmJob, parse_squeue
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import JOB_EVENTS, catalogue
from tests.integration.slurm_fixture import SLURM_UP, SlurmCluster
from tests.integration.slurm_kafka import PYTHON, TopicReader, peerwatch_env, run_peerwatch

pytestmark = pytest.mark.integration

#: Not a speed budget (typical is ~100 ms; timings are printed, and speed belongs in a
#: benchmark): a hook that waited on an unreachable broker would take librdkafka's timeouts
#: (tens of seconds). This only tells "returned at once" from "blocked on Kafka".
HOOK_BLOCKED_MS = 10_000


def write_wrapper(path: Path, hook: str, bootstrap: str, prefix: str, work: Path) -> None:
    path.write_text(
        f"""#!/bin/sh
# slurmd runs this as root with no PATH; it must exit 0 for the job to run.
export PEERWATCH_KAFKA_BOOTSTRAP={bootstrap}
export PEERWATCH_TOPIC_PREFIX={prefix}
export PEERWATCH_SPOOL_DIR={work}/spool
start=$(date +%s%N)
{PYTHON} -m peerwatch.commands.slurm {hook} --outbox {work}/outbox --send-timeout-s 3
rc=$?
echo "$SLURM_JOB_ID $rc $(( ($(date +%s%N) - start) / 1000000 ))" >> {work}/{hook}.times
exit 0
"""
    )
    path.chmod(
        path.stat().st_mode
        | stat.S_IXUSR
        | stat.S_IRGRP
        | stat.S_IXGRP
        | stat.S_IROTH
        | stat.S_IXOTH
    )


def slurm_up(env_extra: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERWATCH_SLURM_")}
    proc = subprocess.run(
        [str(SLURM_UP)], env={**env, **env_extra}, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture
def hooked_cluster(
    slurm_cluster: SlurmCluster, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> Iterator[tuple[SlurmCluster, Path]]:
    """The cluster with our prolog/epilog installed; restored afterwards."""
    work = tmp_path / "hooks"
    work.mkdir()
    work.chmod(0o755)
    tmp_path.chmod(0o755)
    for hook in ("prolog", "epilog"):
        write_wrapper(work / hook, hook, kafka_settings.bootstrap_servers, topic_prefix, work)
    slurm_up({"PEERWATCH_SLURM_PROLOG": str(work / "prolog"),
              "PEERWATCH_SLURM_EPILOG": str(work / "epilog")})  # fmt: skip
    try:
        yield slurm_cluster, work
    finally:
        slurm_up({})


def hook_times(work: Path, hook: str, job_id: str) -> list[tuple[int, int]]:
    lines = (
        (work / f"{hook}.times").read_text().splitlines()
        if (work / f"{hook}.times").exists()
        else []
    )
    return [(int(rc), int(ms)) for j, rc, ms in (line.split() for line in lines) if j == job_id]


def test_prolog_and_epilog_publish_started_and_ended(
    hooked_cluster: tuple[SlurmCluster, Path],
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    cluster, work = hooked_cluster
    [spec] = [s for s in catalogue(topic_prefix) if s.name.endswith(JOB_EVENTS.name)]
    ensure_topics(kafka_settings, [spec])
    reader = TopicReader(kafka_settings, spec.name, "JobEvent")
    out = f"--output={tmp_path}/slurm-%j.out"

    ok_job = cluster.sbatch(out, "--gres=gpu:3", "--wrap", "sleep 3")
    cluster.wait_for_job_state(ok_job, "RUNNING")
    [running] = [j for j in _squeue(cluster) if j.job_id == ok_job]
    indices = list(running.gpu_indices[cluster.node])
    assert len(indices) == 3
    failing = cluster.sbatch(out, "--gres=gpu:2", "--wrap", "exit 3")
    cluster.wait_for_job_state(ok_job, "COMPLETED", timeout_s=30)
    cluster.wait_for_job_state(failing, "FAILED", timeout_s=30)

    def has(rs: list[dict[str, Any]], job: str, kind: str) -> bool:
        return any(r["job_id"] == job and r["kind"] == kind for r in rs)

    records = reader.read_until(
        lambda rs: all(has(rs, j, k) for j in (ok_job, failing) for k in ("STARTED", "ENDED"))
    )
    by = {(r["job_id"], r["kind"]): r for r in records}
    started, ended = by[(ok_job, "STARTED")], by[(ok_job, "ENDED")]
    assert (started["source"], ended["source"]) == ("PROLOG", "EPILOG")
    for record in (started, ended):
        assert record["allocations"] == [{"node": cluster.node, "gpu_indices": indices}]
        assert (record["user"], record["partition"], record["account"]) == ("root", "gpu", "root")
    assert ended["exit_code"] == 0 and ended["end_ms"] >= started["start_ms"]
    assert by[(failing, "ENDED")]["exit_code"] == 3
    assert len(by[(failing, "STARTED")]["allocations"][0]["gpu_indices"]) == 2

    # Each hook exited 0 without blocking, as slurmd timed it through the wrapper.
    for job in (ok_job, failing):
        for hook in ("prolog", "epilog"):
            [(rc, ms)] = hook_times(work, hook, job)
            print(f"hook wall time: {hook} job {job}: {ms} ms (Kafka up)")
            assert rc == 0 and ms < HOOK_BLOCKED_MS, (hook, job, ms)

    # Kafka unreachable: jobs still run and finish, hooks do not wait, events wait in the outbox.
    for hook in ("prolog", "epilog"):
        write_wrapper(work / hook, hook, "127.0.0.1:1", topic_prefix, work)
    offline = cluster.sbatch(out, "--gres=gpu:1", "--wrap", "true")
    cluster.wait_for_job_state(offline, "COMPLETED", timeout_s=30)
    assert cluster.node_state() in ("idle", "mixed", "completing")
    for hook in ("prolog", "epilog"):
        [(rc, ms)] = hook_times(work, hook, offline)
        print(f"hook wall time: {hook} job {offline}: {ms} ms (Kafka unreachable)")
        assert rc == 0 and ms < HOOK_BLOCKED_MS, (hook, ms)
    env = peerwatch_env(kafka_settings, topic_prefix, tmp_path)
    # Kafka is back: flushing the outbox delivers the two waiting events.
    flushed = run_peerwatch(["slurm", "flush-outbox", "--outbox", str(work / "outbox")], env)
    assert flushed.returncode == 0, flushed.stderr
    records = reader.read_until(
        lambda rs: has(rs, offline, "STARTED") and has(rs, offline, "ENDED")
    )
    assert {r["kind"] for r in records if r["job_id"] == offline} == {"STARTED", "ENDED"}
    reader.close()


def _squeue(cluster: SlurmCluster) -> list[SlurmJob]:
    return parse_squeue(cluster.json("squeue"))
