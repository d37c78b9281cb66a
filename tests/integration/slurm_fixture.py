"""pytest plugin: a real one-node Slurm cluster for integration tests.

Register with ``pytest_plugins = ["tests.integration.slurm_fixture"]``. The session fixture
``slurm_cluster`` reuses a cluster that is already up (CI may start it beforehand with
``scripts/slurm-up.sh``) and otherwise runs that script. It never skips: a machine without
Slurm, or without root to start it, fails with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SLURM_UP = REPO_ROOT / "scripts" / "slurm-up.sh"
GPUS_PER_NODE = 8
_USABLE = {"idle", "mixed", "allocated", "completing"}


def _run(argv: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)


@dataclass(frozen=True)
class SlurmCluster:
    """The running test cluster: ``node`` name, ``gpus`` per node, ``bin_dir`` of sinfo etc."""

    node: str
    gpus: int
    bin_dir: Path

    def cmd(self, name: str, *args: str, timeout_s: float = 30.0) -> str:
        """Run Slurm command ``name`` with ``args``; return stdout. Fails the test on error."""
        proc = _run([str(self.bin_dir / name), *args], timeout_s)
        if proc.returncode != 0:
            pytest.fail(f"{name} {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def json(self, name: str, *args: str) -> dict[str, Any]:
        """``name --json args`` parsed."""
        doc = json.loads(self.cmd(name, "--json", *args))
        assert isinstance(doc, dict)
        return doc

    def sbatch(self, *args: str) -> str:
        """Submit a batch job; return its id (``--parsable`` output without cluster name)."""
        return self.cmd("sbatch", "--parsable", *args).strip().split(";")[0]

    def job_state(self, job_id: str) -> str | None:
        """The job's state as squeue shows it (``RUNNING``, ``FAILED``...), None if unknown."""
        proc = _run([str(self.bin_dir / "squeue"), "-h", "-t", "all", "-j", job_id, "-o", "%T"])
        lines = proc.stdout.split()
        return lines[0] if proc.returncode == 0 and lines else None

    def wait_for_job_state(
        self, job_id: str, states: str | Sequence[str], timeout_s: float = 30.0
    ) -> str:
        """Poll until the job is in one of ``states``; return the state. Fails on timeout."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in wanted:
                return state
            time.sleep(0.2)
        pytest.fail(f"job {job_id} not in {sorted(wanted)} after {timeout_s}s (last: {state})")

    def node_state(self) -> str:
        """The node's sinfo state in long form (``idle``, ``mixed``, ``drained``...)."""
        return _node_state(self.bin_dir, self.node) or ""

    def wait_for_node_state(self, states: str | Sequence[str], timeout_s: float = 30.0) -> str:
        """Poll until the node's sinfo state is one of ``states``. Fails on timeout."""
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            if state in wanted:
                return state
            time.sleep(0.2)
        pytest.fail(f"node {self.node} not in {sorted(wanted)} after {timeout_s}s ({state!r})")


def _node_state(bin_dir: Path, node: str) -> str | None:
    try:
        proc = _run([str(bin_dir / "sinfo"), "-h", "-N", "-n", node, "-o", "%T"], 10.0)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.split()
    return lines[0] if proc.returncode == 0 and lines else None


def _start_cluster(bin_dir: Path | None) -> None:
    if os.geteuid() != 0:
        pytest.fail(
            "Slurm test cluster is not running and starting it needs root: "
            f"run `sudo {SLURM_UP}` first"
        )
    try:
        proc = _run([str(SLURM_UP)], timeout_s=600.0)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{SLURM_UP} did not finish within 600 s")
    if proc.returncode != 0:
        pytest.fail(f"{SLURM_UP} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A running one-node Slurm cluster with ``GPUS_PER_NODE`` placeholder GPUs."""
    node = socket.gethostname().split(".")[0]
    sinfo = shutil.which("sinfo")
    bin_dir = Path(sinfo).parent if sinfo else None
    if bin_dir is None or _node_state(bin_dir, node) not in _USABLE:
        _start_cluster(bin_dir)
        sinfo = shutil.which("sinfo")
        if sinfo is None:
            pytest.fail(f"{SLURM_UP} succeeded but `sinfo` is not on PATH")
        bin_dir = Path(sinfo).parent
    state = _node_state(bin_dir, node)
    if state not in _USABLE:
        pytest.fail(f"Slurm node {node} is not usable after start-up (sinfo state {state!r})")
    yield SlurmCluster(node=node, gpus=GPUS_PER_NODE, bin_dir=bin_dir)
