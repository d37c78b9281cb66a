"""The systemd units of docs/systemd/: one for every long-running service, each hardened, each
accepted by ``systemd-analyze verify`` without a warning, and each starting a command line the
CLI accepts.

``systemd-analyze verify`` refuses a unit whose ExecStart binary does not exist, so it checks a
copy whose only change is ``/opt/peerwatch/venv/bin/peerwatch`` -> ``/bin/true``; the hardening
and the command line are checked on the real files.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from peerwatch import cli

UNITS = Path(__file__).resolve().parents[2] / "docs" / "systemd"
BINARY = "/opt/peerwatch/venv/bin/peerwatch"
#: Every long-running peerwatch service and its command.
SERVICES: dict[str, tuple[str, ...]] = {
    "peerwatch-stream.service": ("stream",),
    "peerwatch-slurm-watch.service": ("slurm", "watch"),
    "peerwatch-archive.service": ("archive",),
    "peerwatch-export-otlp.service": ("export", "otlp"),
    "peerwatch-export-alertmanager.service": ("export", "alertmanager"),
    "peerwatch-drain-controller.service": ("drain-controller", "run"),
    "peerwatch-agent.service": ("agent",),
}
ALL_UNITS = sorted(p.name for p in UNITS.iterdir() if p.suffix in (".service", ".timer"))


def unit_settings(path: Path) -> dict[str, list[str]]:
    """``Section.Key`` -> its values in order (keys repeat in unit files)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.setdefault(f"{section}.{key}", []).append(value)
    return out


def verify(folder: Path, names: list[str]) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: apt-get install systemd"
    return subprocess.run([analyze, "verify", *(str(folder / n) for n in names)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def runnable_copy(tmp_path: Path, names: list[str]) -> None:
    for name in names:
        text = (UNITS / name).read_text()
        copy = text.replace(BINARY, "/bin/true")
        # Only the binary differs: what is verified is the real file.
        assert copy.replace("/bin/true", BINARY) == text
        (tmp_path / name).write_text(copy)


def test_every_long_running_service_has_a_unit() -> None:
    assert set(SERVICES) <= set(ALL_UNITS)


@pytest.mark.parametrize("name", ALL_UNITS)
def test_unit_verifies_without_a_warning(tmp_path: Path, name: str) -> None:
    # A timer is verified with the service it starts.
    names = [name, name.replace(".timer", ".service")] if name.endswith(".timer") else [name]
    runnable_copy(tmp_path, names)
    done = verify(tmp_path, names)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == "", done.stderr


def test_verify_catches_a_bad_unit(tmp_path: Path) -> None:
    # The check above would see a mistake: a misspelt key is only a warning (exit 0) to
    # systemd-analyze, so the tests require empty output as well.
    runnable_copy(tmp_path, ["peerwatch-stream.service"])
    unit = tmp_path / "peerwatch-stream.service"
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict"))
    done = verify(tmp_path, [unit.name])
    assert "Unknown key 'ProtectSytem'" in done.stderr


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_is_hardened(name: str) -> None:
    unit = unit_settings(UNITS / name)
    one = {key: values[-1] for key, values in unit.items()}
    assert one["Service.User"] == "peerwatch" and one["Service.Group"] == "peerwatch"
    assert one["Service.ProtectSystem"] == "strict"
    assert one["Service.ProtectHome"] == "yes" and one["Service.PrivateTmp"] == "yes"
    assert one["Service.NoNewPrivileges"] == "yes"
    assert one["Service.CapabilityBoundingSet"] == ""
    assert one["Service.SystemCallFilter"] == "@system-service"
    assert one["Service.Restart"] in ("always", "on-failure")
    assert float(one["Service.RestartSec"]) > 0
    assert "peerwatch:/etc/peerwatch/credentials" in unit["Service.LoadCredential"]
    assert "/etc/peerwatch/env" in unit["Service.EnvironmentFile"]
    # Whatever it keeps on disk is writable, nothing else.
    writable = set(" ".join(unit.get("Service.ReadWritePaths", [])).split())
    for key, root in (("StateDirectory", "/var/lib/"), ("CacheDirectory", "/var/cache/")):
        for folder in unit.get(f"Service.{key}", []):
            assert root + folder in writable, (key, folder)
    assert one["Install.WantedBy"] == "multi-user.target"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_service_starts_a_command_the_cli_accepts(name: str) -> None:
    argv = shlex.split(unit_settings(UNITS / name)["Service.ExecStart"][0])
    assert argv[0] == BINARY
    assert tuple(argv[1 : 1 + len(SERVICES[name])]) == SERVICES[name]
    parser = cli.build_parser(argv[1])
    args = parser.parse_args(argv[1:])  # exits (SystemExit) on an unknown flag
    assert callable(args.func)
