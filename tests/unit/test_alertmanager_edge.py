"""The thin Alertmanager edges without processes: the HTTP client's request and error
translation (an httpx MockTransport), the local Alertmanager's command line, the CLI wiring."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fakes import FakeClock
from hostile_http import book_with_one_alert

from peerwatch.cli import build_parser
from peerwatch.errors import ConfigError, ServiceError
from peerwatch.exporters.alertmanager import AlertmanagerClient, AlertSender
from peerwatch.local.alertmanager import LocalAlertmanager
from peerwatch.settings import AlertmanagerSettings


class _Body(httpx.AsyncByteStream):
    """An answer's body streamed as a network answer is (``content=`` would be read at once)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data


def answer(status: int, body: bytes = b"") -> httpx.Response:
    return httpx.Response(status, stream=_Body(body))


def test_client_posts_json_to_the_v2_api() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(200)

    alerts = [{"labels": {"alertname": "GpuStraggler"}, "startsAt": "2026-12-01T00:00:00.000Z"}]
    client = AlertmanagerClient("http://127.0.0.1:9093/", 2.5, httpx.MockTransport(handler))
    client.post_alerts(alerts)
    request = seen[0]
    assert str(request.url) == "http://127.0.0.1:9093/api/v2/alerts"
    assert request.method == "POST"
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == alerts


def _refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def _timed_out(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def _odd(request: httpx.Request) -> httpx.Response:
    raise ValueError("a client fault")


@pytest.mark.parametrize(
    ("handler", "message"),
    [
        (lambda r: answer(400, b"start time must be before end time"),
         "answered 400: start time must be before end time"),
        (lambda r: answer(500, b"x" * 100_000), "more than 65536 bytes"),
        (_refused, "unreachable: ConnectError"),
        (_timed_out, "unreachable: ReadTimeout: timed out"),
    ],
)  # fmt: skip
def test_client_failures_become_service_errors(handler: Any, message: str) -> None:
    client = AlertmanagerClient("http://127.0.0.1:9093", 1.0, httpx.MockTransport(handler))
    with pytest.raises(ServiceError, match=message):
        client.post_alerts([])


def test_a_client_fault_is_a_retried_failure_too(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    book = book_with_one_alert(clock.now_ms())
    client = AlertmanagerClient("http://127.0.0.1:9093", 1.0, httpx.MockTransport(_odd))
    sender = AlertSender(book, client, retry_max_s=8.0, clock=clock)
    assert sender.tick() == 0 and sender.stats.failures == 1
    assert "a client fault" in caplog.text and "Traceback" in caplog.text


def test_the_request_deadline_is_bounded_in_the_settings() -> None:
    with pytest.raises(ConfigError, match=r"alertmanager\.timeout_s"):
        AlertmanagerSettings(timeout_s=3600.0)


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
