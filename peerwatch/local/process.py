"""A local service as a plain child process: pid file, log file, readiness poll, stop.

Shared by the local Kafka, Prometheus and OpenTelemetry Collector (:mod:`peerwatch.local`). A
service keeps its pid file and log under its own folder of ``<state>``; ``start`` is idempotent
and reports ready only when the service's own readiness check passes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

from peerwatch.errors import ServiceError

#: Children started by this process, kept referenced (and reaped) while it lives.
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a child of ours that exited is reaped here)."""
    child = CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del CHILDREN[pid]
        return False
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def read_pid(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if it names a live process."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if alive(pid) else None


def log_tail(log_file: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


#: Open files a broker is given where the limits allow (Kafka keeps a few descriptors open per
#: partition: a test suite's thousands of partitions passed the usual 20,000 and the broker shut
#: down on "Too many open files").
BROKER_OPEN_FILES = 262_144


def raise_open_files_limit(want: int = BROKER_OPEN_FILES) -> int:
    """Raise this process's open-files limit towards ``want`` (children inherit it): the soft
    limit up to the hard one, and as root the hard one too. Returns the soft limit in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return soft
    for target in ((want, max(hard, want)), (min(want, hard), hard)):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, target)
            return target[0]
        except (ValueError, OSError):  # not root, or over the kernel's nr_open
            continue
    return soft


def launch(
    name: str,
    argv: Sequence[str],
    *,
    pid_file: Path,
    log_file: Path,
    ready: Callable[[], bool],
    timeout_s: float,
    cwd: Path | None = None,
) -> None:
    """Start ``argv`` (an argument vector, no shell) in its own session, logging to
    ``log_file``, and wait until ``ready()``. Raises ServiceError with the log's tail when it
    exits or is not ready within ``timeout_s`` (then it is stopped)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=cwd,
        )  # fmt: skip
    CHILDREN[proc.pid] = proc
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pid_file.unlink(missing_ok=True)
            raise ServiceError(f"{name} exited with {proc.returncode}:\n{log_tail(log_file)}")
        if ready():
            return
        time.sleep(0.2)
    terminate(pid_file)
    raise ServiceError(f"{name} was not ready within {timeout_s:.0f} s:\n{log_tail(log_file)}")


def terminate(pid_file: Path, timeout_s: float = 30.0) -> str:
    """Stop the process named by ``pid_file``: SIGTERM, then SIGKILL after ``timeout_s``.
    Returns 'not running', 'stopped' or 'killed'."""
    pid = read_pid(pid_file)
    if pid is None:
        pid_file.unlink(missing_ok=True)
        return "not running"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            pid_file.unlink(missing_ok=True)
            return "stopped"
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    child = CHILDREN.pop(pid, None)
    if child is not None:
        child.wait(10)
    pid_file.unlink(missing_ok=True)
    return "killed"


class ServiceFiles:
    """What every local service has in its folder (``home``, which it names): ``<name>.pid``
    and ``<name>.log``, and what is done with them: the live pid, stop, the log's tail."""

    #: the stem of the pid and log file names
    name: ClassVar[str]
    #: how long :meth:`stop` waits after SIGTERM before SIGKILL
    stop_timeout_s: ClassVar[float] = 30.0

    @property
    def home(self) -> Path:
        raise NotImplementedError

    @property
    def pid_file(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.home / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid the pid file names, if that process lives."""
        return read_pid(self.pid_file)

    def stop(self) -> str:
        """SIGTERM, then SIGKILL after :attr:`stop_timeout_s`: 'not running', 'stopped' or
        'killed'."""
        return terminate(self.pid_file, self.stop_timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_file, lines)
