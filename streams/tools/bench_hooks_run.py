"""The edges of ``peerwatch bench hooks``: run the Slurm prolog and epilog hooks as slurmd runs
them (a fresh process each, ``python -m peerwatch.commands.slurm prolog|epilog``, the job
described in its environment), time each from process start to exit, and read the job-events
topic back to check every event the hooks stored reached the real broker.

The environment is the one slurmd gives a hook (job id, node, user, partition, account, the GPU
indices in ``SLURM_JOB_GPUS``, the epilog's ``SLURM_JOB_EXIT_CODE2``), so no Slurm is needed and
the hook never asks ``scontrol`` (``--no-scontrol``): where slurmd sets no GPU variable the
hook's scontrol call (bounded by ``--scontrol-timeout-ms``, 150 ms by default) comes on top.
The arithmetic and the verdict are in :mod:`peerwatch.streams.tools.bench_hooks`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from peerwatch.schemas.codec import decode_any
from peerwatch.settings import KafkaSettings
from peerwatch.streams.tools.bench_hooks import hooks_report
from peerwatch.streams.tools.bench_run import delete_prefixed_topics, read_topic
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import JOB_EVENTS, catalogue

#: Job ids of the benchmark start here (far from a test cluster's own ids).
FIRST_JOB_ID = 9_000_000


def hook_env(kafka: KafkaSettings, prefix: str, workdir: Path, job_id: int) -> dict[str, str]:
    """The environment slurmd gives a hook for one job on node ``bench-node`` (2 GPUs)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PEERWATCH_"))},
        "PEERWATCH_KAFKA_BOOTSTRAP": kafka.bootstrap_servers,
        "PEERWATCH_TOPIC_PREFIX": prefix,
        "PEERWATCH_SPOOL_DIR": str(workdir / "spool"),
        "SLURM_JOB_ID": str(job_id),
        "SLURMD_NODENAME": "bench-node",
        "SLURM_JOB_USER": "bench",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_ACCOUNT": "bench",
        "SLURM_JOB_GPUS": "0,1",
        "SLURM_JOB_EXIT_CODE2": "0:0",
    }


def run_hook_once(
    hook: str, env: dict[str, str], outbox: Path, timeout_s: float
) -> tuple[float, str]:
    """Run one hook process; (wall ms from start to exit, its stderr). The hook always exits 0:
    anything on stderr is a failure it reported."""
    argv = [sys.executable, "-m", "peerwatch.commands.slurm", hook, "--outbox", str(outbox),
            "--no-scontrol"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s,
                          check=False)  # fmt: skip
    wall_ms = (time.perf_counter() - start) * 1000.0
    err = proc.stderr.strip()
    if proc.returncode != 0:
        err = f"exit {proc.returncode}: {err}"
    return wall_ms, err


def run_hooks_bench(
    kafka: KafkaSettings,
    runs: int,
    budget_ms: float,
    workdir: Path,
    *,
    deliver_timeout_s: float = 60.0,
    keep_topics: bool = False,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """``runs`` jobs, each a prolog then an epilog; the report of :func:`hooks_report`."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    prefix = f"bench-hooks-{uuid.uuid4().hex[:8]}."
    topic = prefix + JOB_EVENTS.name
    ensure_topics(kafka, [s for s in catalogue(prefix) if s.name == topic])
    outbox = workdir / "outbox"
    wall: dict[str, list[float]] = {"prolog": [], "epilog": []}
    failures: list[str] = []
    try:
        # One warm-up job (not timed, not counted): the first run pays for cold page caches.
        for hook in ("prolog", "epilog"):
            run_hook_once(hook, hook_env(kafka, prefix, workdir, FIRST_JOB_ID - 1), outbox, 60)
        for i in range(runs):
            env = hook_env(kafka, prefix, workdir, FIRST_JOB_ID + i)
            for hook in ("prolog", "epilog"):
                ms, err = run_hook_once(hook, env, outbox, 60)
                wall[hook].append(ms)
                if err:
                    failures.append(f"{hook} job {FIRST_JOB_ID + i}: {err}")
            if (i + 1) % max(1, runs // 10) == 0:
                log(f"bench hooks: {i + 1}/{runs} jobs")
        wanted = {
            (str(FIRST_JOB_ID + i), kind) for i in range(runs) for kind in ("STARTED", "ENDED")
        }
        got = _wait_delivered(kafka, topic, wanted, deliver_timeout_s)
        log(f"bench hooks: {len(got)} of {len(wanted)} events on {topic}")
    finally:
        if not keep_topics:
            delete_prefixed_topics(kafka, prefix)
    for line in failures[:5]:
        log(f"bench hooks: {line}")
    report = hooks_report(wall, budget_ms, events_stored=len(wanted),
                          events_delivered=len(got), failed_runs=len(failures))  # fmt: skip
    report["runs"] = runs
    report["topic"] = topic
    return report


def _wait_delivered(
    kafka: KafkaSettings, topic: str, wanted: set[tuple[str, str]], timeout_s: float
) -> set[tuple[str, str]]:
    """The (job id, kind) pairs of ``wanted`` found on ``topic`` once all arrived or the
    timeout passed (the hooks' detached senders deliver in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = set()
        for rec in read_topic(kafka, topic):
            value = decode_any(rec.value)[1]
            got.add((str(value["job_id"]), str(value["kind"])))
        got &= wanted
        if got == wanted or time.monotonic() > deadline:
            return got
        time.sleep(1.0)
