"""A local OpenTelemetry Collector on loopback: OTLP in, a Prometheus scrape endpoint out.

The binary is the one ``scripts/build-collector.sh`` builds from ``docker/collector`` (OTLP
receiver, batch processor, Prometheus/file/debug exporters). Prometheus 2.x has no OTLP
receiver, so peerwatch's metrics reach it through this collector's ``prometheus`` exporter,
which Prometheus scrapes (:mod:`peerwatch.local.prometheus`). Log events (findings,
recommendations) go to the debug exporter's summary lines in the log.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from peerwatch.errors import ServiceError
from peerwatch.local.process import ServiceFiles, launch, port_in_use

#: A series the collector's Prometheus endpoint has not updated this long is dropped there.
METRIC_EXPIRATION = "10m"


def collector_config(grpc_port: int, http_port: int, metrics_port: int) -> dict[str, object]:
    """The collector's configuration (JSON is YAML): every endpoint on 127.0.0.1."""
    return {
        "receivers": {"otlp": {"protocols": {
            "grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
            "http": {"endpoint": f"127.0.0.1:{http_port}"},
        }}},
        "processors": {"batch": {"timeout": "1s"}},
        "exporters": {
            # Resource attributes other than service.name / service.instance.id (which become
            # job / instance) stay in target_info: they are not copied onto every series.
            "prometheus": {"endpoint": f"127.0.0.1:{metrics_port}",
                           "metric_expiration": METRIC_EXPIRATION},
            "debug": {"verbosity": "basic"},
        },
        "service": {
            "telemetry": {"logs": {"level": "warn"}, "metrics": {"level": "none"}},
            "pipelines": {
                "metrics": {"receivers": ["otlp"], "processors": ["batch"],
                            "exporters": ["prometheus"]},
                "logs": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["debug"]},
            },
        },
    }  # fmt: skip


def find_binary(cache_dir: Path, explicit: str | None = None) -> Path:
    """The collector binary: ``explicit``, else ``$PEERWATCH_OTELCOL_BIN``, else built (or found
    already built) by ``scripts/build-collector.sh`` of this checkout. Raises ServiceError."""
    chosen = explicit or os.environ.get("PEERWATCH_OTELCOL_BIN")
    if chosen:
        path = Path(chosen)
        if not path.is_file():
            raise ServiceError(f"collector binary {path} does not exist")
        return path
    script = Path(__file__).resolve().parents[2] / "scripts" / "build-collector.sh"
    if not script.is_file():
        raise ServiceError("no collector binary: pass --collector-bin or set PEERWATCH_OTELCOL_BIN")
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=False,
        env={**os.environ, "PEERWATCH_CACHE_DIR": str(cache_dir)},
    )  # fmt: skip
    if proc.returncode != 0:
        raise ServiceError(f"building the collector failed:\n{(proc.stderr + proc.stdout)[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class LocalCollector(ServiceFiles):
    """A collector receiving OTLP on ``grpc_port``/``http_port`` and serving the metrics for
    Prometheus on ``metrics_port``, all on 127.0.0.1; state in ``<state>/otelcol-<grpc_port>``."""

    name: ClassVar[str] = "otelcol"

    binary: Path
    state_dir: Path
    grpc_port: int = 4317
    http_port: int = 4318
    metrics_port: int = 8889

    @property
    def home(self) -> Path:
        return self.state_dir / f"otelcol-{self.grpc_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_target(self) -> str:
        return f"127.0.0.1:{self.metrics_port}"

    def ready(self) -> bool:
        return all(port_in_use(p) for p in (self.grpc_port, self.http_port, self.metrics_port))

    def start(self, timeout_s: float = 30.0) -> str:
        """Start (idempotent): 'started' or 'running'. Raises ServiceError with the log tail."""
        if self.pid() is not None and self.ready():
            return "running"
        for port in (self.grpc_port, self.http_port, self.metrics_port):
            if port_in_use(port):
                raise ServiceError(f"127.0.0.1:{port} is in use by another process")
        self.home.mkdir(parents=True, exist_ok=True)
        config = self.home / "config.yaml"
        config.write_text(json.dumps(
            collector_config(self.grpc_port, self.http_port, self.metrics_port), indent=1
        ))  # fmt: skip
        launch("the collector", [str(self.binary), "--config", f"file:{config}"],
               pid_file=self.pid_file, log_file=self.log_file, ready=self.ready,
               timeout_s=timeout_s)  # fmt: skip
        return "started"

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return f"running (pid {pid}, OTLP {self.grpc_endpoint}, metrics {self.metrics_target})"
