"""The thin Alertmanager edges without processes: the HTTP client's request and error
translation (urlopen injected), the local Alertmanager's command line, the CLI wiring."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from peerwatch.cli import build_parser
from peerwatch.errors import ServiceError
from peerwatch.exporters.alertmanager import AlertmanagerClient
from peerwatch.local.alertmanager import LocalAlertmanager


class Response(io.BytesIO):
    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_client_posts_json_to_the_v2_api_with_its_timeout() -> None:
    seen: list[tuple[urllib.request.Request, float]] = []

    def opener(request: urllib.request.Request, timeout: float) -> Response:
        seen.append((request, timeout))
        return Response(b"")

    alerts = [{"labels": {"alertname": "GpuStraggler"}, "startsAt": "2026-12-01T00:00:00.000Z"}]
    AlertmanagerClient("http://127.0.0.1:9093/", 2.5, opener).post_alerts(alerts)
    request, timeout = seen[0]
    assert request.full_url == "http://127.0.0.1:9093/api/v2/alerts"
    assert request.get_method() == "POST" and timeout == 2.5
    assert request.get_header("Content-type") == "application/json"
    assert isinstance(request.data, bytes) and json.loads(request.data) == alerts


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (urllib.error.HTTPError("u", 400, "Bad Request", {}, io.BytesIO(b"start time must be before end time")),  # type: ignore[arg-type]
         "answered 400: start time must be before end time"),
        (urllib.error.URLError(ConnectionRefusedError(111, "Connection refused")), "unreachable"),
        (TimeoutError("timed out"), "unreachable: timed out"),
    ],
)  # fmt: skip
def test_client_failures_become_service_errors(error: Exception, message: str) -> None:
    def opener(request: Any, timeout: float) -> Response:
        raise error

    with pytest.raises(ServiceError, match=message):
        AlertmanagerClient("http://127.0.0.1:9093", 1.0, opener).post_alerts([])


def test_local_alertmanager_listens_on_loopback_without_a_cluster_port(tmp_path: Path) -> None:
    am = LocalAlertmanager(state_dir=tmp_path, port=19093)
    argv = am.command("/usr/bin/prometheus-alertmanager", tmp_path / "am.yml")
    assert "--web.listen-address=127.0.0.1:19093" in argv
    assert "--cluster.listen-address=" in argv  # no HA gossip on 0.0.0.0:9094
    assert f"--storage.path={tmp_path / 'alertmanager-19093' / 'data'}" in argv
    assert am.url == "http://127.0.0.1:19093" and am.status() == "stopped"
    with pytest.raises(ServiceError, match="does not exist"):
        LocalAlertmanager(state_dir=tmp_path, config_file=tmp_path / "missing.yml")._config()


def test_cli_wires_export_alertmanager_and_the_service_command() -> None:
    args = build_parser("export").parse_args(
        ["export", "alertmanager", "--url", "http://127.0.0.1:19093", "--resend-s", "5"]
    )
    assert args.url == "http://127.0.0.1:19093" and args.resend_s == 5.0
    assert args.func.__name__ == "run_alertmanager"
    args = build_parser("alertmanager").parse_args(["alertmanager", "start", "--port", "19093"])
    assert args.action == "start" and args.port == 19093
