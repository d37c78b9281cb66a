"""The install per role, as docs/operations.md gives it: a built wheel, ``peerwatch[agent]`` in a
fresh virtualenv, and the node commands run there without the stream workers' libraries.

Uses the local pip cache (and ``PIP_FIND_LINKS``), as ``scripts/setup.sh`` does; about 20 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Distributions a GPU node must not carry (numba + llvmlite alone are about 180 MB).
HEAVY_DISTS = ("numba", "llvmlite", "numpy", "faust-streaming", "aiokafka", "grpcio",
               "opentelemetry-sdk", "zstandard")  # fmt: skip


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=280, check=False, **kw)  # type: ignore[call-overload, no-any-return]


#: Modules a GPU node (agent, health, Slurm hooks) must never import: the stream workers' and
#: exporters' libraries.
HEAVY_MODULES = ("numba", "llvmlite", "numpy", "faust", "mode", "aiokafka", "grpc",
                 "opentelemetry", "zstandard")  # fmt: skip

#: The node code paths: each command's module and what its run function imports.
NODE_MODULES = (
    "peerwatch.commands.agent", "peerwatch.commands.health", "peerwatch.commands.slurm",
    "peerwatch.producers.agent", "peerwatch.producers.delivery", "peerwatch.producers.health.run",
    "peerwatch.producers.health_hook", "peerwatch.producers.nvml.sampler",
    "peerwatch.producers.slurm.hooks", "peerwatch.producers.slurm.hook_sender",
    "peerwatch.exporters.telemetry_start", "peerwatch.schemas.codec", "peerwatch.topic_admin",
)  # fmt: skip


def test_node_code_paths_import_no_heavy_module() -> None:
    code = (
        "import sys, importlib\n"
        f"for m in {NODE_MODULES!r}: importlib.import_module(m)\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True, cwd=ROOT)  # fmt: skip
    loaded = set(done.stdout.split())
    assert "pynvml" in loaded and "confluent_kafka" in loaded  # the probe did import the paths
    assert loaded.isdisjoint(HEAVY_MODULES), sorted(loaded & set(HEAVY_MODULES))


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding the built wheel with the ``agent`` extra only."""
    tmp = tmp_path_factory.mktemp("install")
    wheels = tmp / "wheels"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)]
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("peerwatch-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    installed = _run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[agent]"]
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return env_dir


def test_agent_extra_installs_only_what_a_node_needs(agent_venv: Path) -> None:
    listed = _run([str(agent_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"])
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"peerwatch", "confluent-kafka", "fastavro", "nvidia-ml-py"} <= names
    assert names.isdisjoint(HEAVY_DISTS), sorted(names & set(HEAVY_DISTS))
    probe = _run([str(agent_venv / "bin" / "python"), "-c", "import numba"])
    assert probe.returncode != 0 and "No module named 'numba'" in probe.stderr


def test_the_wheel_carries_the_released_schemas(agent_venv: Path) -> None:
    # Every decoder reads them (writer schemas of earlier releases): a wheel without them
    # cannot decode anything.
    code = ("from peerwatch.schemas import registry; "
            "print(sorted(registry.writer_schemas('JobEvent')))")  # fmt: skip
    done = _run([str(agent_venv / "bin" / "python"), "-c", code])
    assert done.returncode == 0, done.stderr[-2000:]
    released = sorted((ROOT / "schemas" / "released").glob("*.avsc"))
    shipped = _run([str(agent_venv / "bin" / "python"), "-c",
                    "import importlib.resources as r; "
                    "print(sorted(p.name for p in r.files('peerwatch.schemas').joinpath('released').iterdir()))"])  # fmt: skip
    assert shipped.stdout.strip() == str(sorted(p.name for p in released))


@pytest.mark.parametrize("command", ["agent", "health", "slurm"])
def test_node_commands_run_from_the_agent_install(agent_venv: Path, command: str) -> None:
    done = _run([str(agent_venv / "bin" / "peerwatch"), command, "--help"], cwd=agent_venv)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: peerwatch {command}")


def test_agent_samples_from_the_agent_install(agent_venv: Path, tmp_path: Path) -> None:
    # The real sampling path (no GPU here: --allow-no-gpu heartbeats), not just --help.
    env = {**os.environ, "PEERWATCH_SPOOL_DIR": str(tmp_path / "spool")}
    done = _run([str(agent_venv / "bin" / "peerwatch"), "agent", "--dry-run", "--allow-no-gpu",
                 "--count", "1"], cwd=tmp_path, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.splitlines()[0])
    assert record["gpus"] == [] and record["seq"] == 0


def test_a_command_of_another_role_names_its_extra(agent_venv: Path, tmp_path: Path) -> None:
    done = _run([str(agent_venv / "bin" / "peerwatch"), "stream"], cwd=tmp_path)
    assert done.returncode == 2
    assert "pip install 'peerwatch[stream]'" in done.stderr
    assert "Traceback" not in done.stderr
