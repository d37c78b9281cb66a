"""A real Prometheus Alertmanager on loopback, from Debian's ``prometheus-alertmanager`` package.

A plain process (no systemd): a config file, a data dir, the web API on ``127.0.0.1:port`` and
HA clustering off. Config (unless one is given), data, the pid file and the log live in
``<state>/alertmanager-<port>``. ``start`` reports ready only when ``/-/ready`` answers 200.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from peerwatch.errors import ServiceError
from peerwatch.local.process import ServiceFiles, launch, port_in_use

BINARIES = ("prometheus-alertmanager", "alertmanager")
#: Used when no config file is given: every alert is accepted and grouped, and nobody notified.
#: Operators give their own (routes to PagerDuty, Slack, ...; docs/operations.md).
DEFAULT_CONFIG = """\
route:
  receiver: "null"
  group_by: [alertname, job_id]
receivers:
  - name: "null"
"""


def find_binary() -> str:
    """The Alertmanager executable. Raises ServiceError naming the package when missing."""
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    raise ServiceError("Alertmanager not found: apt-get install prometheus-alertmanager")


@dataclass(frozen=True)
class LocalAlertmanager(ServiceFiles):
    """Alertmanager on ``127.0.0.1:port`` with ``config_file`` (or :data:`DEFAULT_CONFIG`)."""

    name: ClassVar[str] = "alertmanager"
    stop_timeout_s: ClassVar[float] = 10.0

    state_dir: Path
    port: int = 9093
    config_file: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def home(self) -> Path:
        return self.state_dir / f"alertmanager-{self.port}"

    def _config(self) -> Path:
        if self.config_file is not None:
            if not self.config_file.is_file():
                raise ServiceError(f"Alertmanager config {self.config_file} does not exist")
            return self.config_file
        path = self.home / "alertmanager.yml"
        path.write_text(DEFAULT_CONFIG)
        return path

    def command(self, binary: str, config: Path) -> list[str]:
        return [
            binary,
            f"--config.file={config}",
            f"--storage.path={self.home / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            f"--web.external-url={self.url}",
            "--cluster.listen-address=",  # no HA gossip port: a single local instance
        ]

    def ready(self, timeout_s: float = 2.0) -> bool:
        """True when ``/-/ready`` answers 200."""
        try:
            ready_url = f"{self.url}/-/ready"  # http://127.0.0.1: built here
            with urllib.request.urlopen(ready_url, timeout=timeout_s) as response:  # noqa: S310
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def start(self, timeout_s: float = 30.0) -> str:
        """Start it (idempotent); returns 'started' or 'running'. Raises ServiceError with the
        log's tail when it exits or is not ready within ``timeout_s``."""
        if self.pid() is not None and self.ready():
            return "running"
        if port_in_use(self.port):
            raise ServiceError(f"127.0.0.1:{self.port} is in use by another process; use --port")
        binary = find_binary()
        self.home.mkdir(parents=True, exist_ok=True)
        config = self._config()
        launch("Alertmanager", self.command(binary, config), pid_file=self.pid_file,
               log_file=self.log_file, ready=lambda: self.ready(timeout_s=1.0),
               timeout_s=timeout_s)  # fmt: skip
        return "started"

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return f"running (pid {pid}, {self.url})" if self.ready() else f"starting (pid {pid})"
