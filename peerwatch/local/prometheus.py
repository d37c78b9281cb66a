"""A local Prometheus (Debian's ``prometheus`` 2.x package) on loopback, without systemd.

Prometheus scrapes the collector's Prometheus endpoint (:mod:`peerwatch.local.collector`),
with ``honor_labels`` so the ``job``/``instance`` labels the collector derives from each
process's ``service.name``/``service.instance.id`` are kept. Its configuration, data, pid file
and log live in ``<state>/prometheus-<port>``; ``start`` reports ready when ``/-/ready``
answers 200. Rule files (peerwatch's own alerting and recording rules) are loaded when given.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from peerwatch.errors import ServiceError
from peerwatch.local.process import ServiceFiles, launch, port_in_use

#: The rules shipped with peerwatch (recording rules for the peer band, alerts on its health).
RULES_FILE = Path(__file__).resolve().parents[2] / "dashboards" / "peerwatch.rules.yml"


def prometheus_config(
    targets: Sequence[str], rule_files: Sequence[Path], scrape_interval_s: float
) -> dict[str, Any]:
    """The configuration (JSON is YAML): one scrape job over the collectors at ``targets``."""
    interval = f"{scrape_interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{
            "job_name": "peerwatch-otelcol",
            "honor_labels": True,
            "static_configs": [{"targets": list(targets)}],
        }],
    }  # fmt: skip


def binary(name: str = "prometheus") -> str:
    """``prometheus`` or ``promtool`` from PATH. Raises ServiceError naming the package."""
    found = shutil.which(name)
    if found is None:
        raise ServiceError(f"{name} not found on PATH (apt-get install prometheus)")
    return found


@dataclass(frozen=True)
class LocalPrometheus(ServiceFiles):
    """Prometheus on ``127.0.0.1:port`` scraping ``targets`` every ``scrape_interval_s``."""

    name: ClassVar[str] = "prometheus"

    state_dir: Path
    targets: tuple[str, ...] = ("127.0.0.1:8889",)
    port: int = 9090
    scrape_interval_s: float = 5.0
    rule_files: tuple[Path, ...] = field(default_factory=tuple)
    retention: str = "2d"

    @property
    def home(self) -> Path:
        return self.state_dir / f"prometheus-{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        if not port_in_use(self.port):
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:  # noqa: S310 (http://127.0.0.1)
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def start(self, timeout_s: float = 60.0) -> str:
        """Start (idempotent): 'started' or 'running'. Raises ServiceError with the log tail."""
        if self.pid() is not None and self.ready():
            return "running"
        if port_in_use(self.port):
            raise ServiceError(f"127.0.0.1:{self.port} is in use by another process; use --port")
        exe = binary()
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "prometheus.yml"
        config.write_text(json.dumps(
            prometheus_config(self.targets, self.rule_files, self.scrape_interval_s), indent=1
        ))  # fmt: skip
        argv = [
            exe, f"--config.file={config}", f"--storage.tsdb.path={self.home / 'data'}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
        ]  # fmt: skip
        launch("Prometheus", argv, pid_file=self.pid_file, log_file=self.log_file,
               ready=self.ready, timeout_s=timeout_s, cwd=self.home)  # fmt: skip
        return "started"

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return f"running (pid {pid}, {self.url})" if self.ready() else f"starting (pid {pid})"

    # -- the HTTP API ---------------------------------------------------------------------------
    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return ``data``. Raises ServiceError on an error answer
        (a PromQL parse error included, with Prometheus's message)."""
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:  # noqa: S310
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServiceError(f"Prometheus API {path}: {exc}") from exc
        if body.get("status") != "success":
            raise ServiceError(
                f"Prometheus API {path}: {body.get('errorType')}: {body.get('error')}"
            )
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query: the result vector as ``[{"metric": {...}, "value": [t, "v"]}]``."""
        data = self.api("query", query=promql)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result
