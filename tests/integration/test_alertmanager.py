"""``peerwatch export alertmanager`` end to end: findings and recommendations on real Kafka -> the
exporter (the real CLI in a subprocess) -> a real Alertmanager (Debian's package, started by
:class:`~peerwatch.local.alertmanager.LocalAlertmanager`) -> its webhook notifications, which a
small HTTP server in this process records (Alertmanager's own behaviour: it POSTs to a URL).

The test config routes by ``job_id`` (``group_by: [job_id]``), so a job's alerts reach the
receiver as one notification. Checked: the alerts and their labels (``GET /api/v2/alerts``), one
notification per job, a CLEARED finding and an expired recommendation resolving their alerts,
re-sending while active, and a restart of the exporter re-sending its alerts without any new
notification.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Producer

from peerwatch.kafka_config import producer_config
from peerwatch.local.alertmanager import LocalAlertmanager
from peerwatch.schemas.codec import codec_for
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import RECOMMENDATIONS, STRAGGLERS, catalogue

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 90.0
GROUP_INTERVAL_S = 2
CONFIG = """\
route:
  receiver: webhook
  group_by: [job_id]
  group_wait: 2s
  group_interval: {group_interval}s
  repeat_interval: 1h
receivers:
  - name: webhook
    webhook_configs:
      - url: http://127.0.0.1:{hook_port}/hook
        send_resolved: true
"""
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Webhook:
    """Records every notification Alertmanager POSTs (JSON bodies, in arrival order)."""

    port: int
    received: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def notifications(self, job: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            got = list(self.received)
        return [n for n in got if job is None or n["groupLabels"].get("job_id") == job]


@contextmanager
def webhook_server() -> Iterator[Webhook]:
    hook = Webhook(free_port())

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with hook.lock:
                hook.received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", hook.port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Stack:
    am: LocalAlertmanager
    hook: Webhook

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.am.url}{path}", timeout=10) as response:
            data = response.read().decode()
        return json.loads(data) if path.startswith("/api") else data

    def alerts(self) -> list[dict[str, Any]]:
        """The active alerts Alertmanager holds."""
        return list(self.get("/api/v2/alerts"))

    def received_total(self) -> float:
        """``alertmanager_alerts_received_total``: every alert any client POSTed."""
        total = 0.0
        for line in str(self.get("/metrics")).splitlines():
            if line.startswith("alertmanager_alerts_received_total{"):
                total += float(line.rsplit(" ", 1)[1])
        return total


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """A real Alertmanager routing by job_id to a webhook in this process."""
    with webhook_server() as hook:
        config = tmp_path / "alertmanager.yml"
        config.write_text(CONFIG.format(hook_port=hook.port, group_interval=GROUP_INTERVAL_S))
        am = LocalAlertmanager(state_dir=tmp_path, port=free_port(), config_file=config)
        am.start()
        try:
            yield Stack(am, hook)
        finally:
            am.stop()


@contextmanager
def exporter(
    stack: Stack,
    kafka: KafkaSettings,
    prefix: str,
    log_path: Path,
    resend_s: float,
    **settings: str,
) -> Iterator[Callable[[], str]]:
    """``peerwatch export alertmanager`` in a subprocess (``settings``: more PEERWATCH_*
    variables); yields a reader of its log. SIGTERM must stop it cleanly."""
    env = {**os.environ, "PEERWATCH_KAFKA_BOOTSTRAP": kafka.bootstrap_servers,
           "PEERWATCH_TOPIC_PREFIX": prefix, "PYTHONPATH": str(REPO_ROOT), **settings}  # fmt: skip
    with log_path.open("a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "peerwatch.cli", "export", "alertmanager", "--url", stack.am.url,
             "--resend-s", str(resend_s), "--group-id", f"{prefix}alerts"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
        )  # fmt: skip

    def read_log() -> str:
        return log_path.read_text(errors="replace")

    try:
        yield read_log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"exporter ignored SIGTERM:\n{read_log()[-3000:]}")
    assert proc.returncode == 0, read_log()[-3000:]
    assert "export alertmanager stopped" in read_log()


def wait_for(what: str, probe: Callable[[], T | None], diagnose: Callable[[], str]) -> T:
    """Poll ``probe`` until it returns something truthy; fail after WAIT_S with ``diagnose()``."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.25)
    pytest.fail(f"timed out waiting for {what}\n{diagnose()}")


def finding(status: str, job: str, node: str, gpu: int, now_ms: int) -> dict[str, Any]:
    return {
        "finding_id": f"{job}-{node}-{gpu}-{status}", "job_id": job, "node": node,
        "gpu_index": gpu, "gpu_uuid": None, "status": status,
        "window_start_ms": now_ms - 30_000, "window_end_ms": now_ms,
        "features": [{"feature": "clk", "value": 1650.0, "peer_median": 1750.0, "mad": 12.0,
                      "z": -5.6}],
        "hard_rules": [], "windows_flagged": 4, "windows_considered": 6,
        "first_flagged_ms": now_ms - 120_000, "peer_group_size": 8,
        "reason": "confirmed slow vs peers: clk -5.7% z=-5.6; 4/6 windows", "cause": "THERMAL",
        "detected_ms": now_ms,
    }  # fmt: skip


def recommendation(node: str, action: str, job: str, gpus: list[int], now_ms: int,
                   expires_ms: int) -> dict[str, Any]:  # fmt: skip
    return {
        "recommendation_id": f"r-{node}-{action}", "node": node, "ts_ms": now_ms,
        "action": action, "severity": "WARNING" if action == "DRAIN" else "INFO", "hard": False,
        "reason": f"GPU {gpus[0]} slow (clk -5.7%)", "gpu_indices": gpus, "job_ids": [job],
        "partition": "gpu",
        "evidence": [{"kind": "straggler", "detail": "clk -5.7% z=-5.6", "finding_id": None,
                      "job_id": job, "gpu_index": gpus[0]}],
        "expires_ms": expires_ms, "cause": "THERMAL",
    }  # fmt: skip


class Records:
    """Produces findings and recommendations to the test's prefixed topics."""

    def __init__(self, kafka: KafkaSettings, prefix: str) -> None:
        ensure_topics(kafka, catalogue(prefix))
        self.prefix = prefix
        self.producer = Producer(producer_config(kafka))

    def finding(self, record: dict[str, Any]) -> None:
        self._send(STRAGGLERS.name, "StragglerFinding", record["job_id"], record)

    def recommendation(self, record: dict[str, Any]) -> None:
        self._send(RECOMMENDATIONS.name, "DrainRecommendation", record["node"], record)

    def _send(self, topic: str, schema: str, key: str, record: dict[str, Any]) -> None:
        value = codec_for(schema).encode(record)
        self.producer.produce(self.prefix + topic, value, key.encode())
        assert self.producer.flush(30) == 0


def by_name(alerts: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Alerts keyed by (alertname, node, gpu)."""
    return {(a["labels"]["alertname"], a["labels"].get("node", ""), a["labels"].get("gpu", "")): a
            for a in alerts}  # fmt: skip


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_alerts_appear_group_by_job_and_resolve(
    stack: Stack, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    records = Records(kafka_settings, topic_prefix)
    t = now_ms()
    job_a, job_b = "4001", "4002"
    for node, gpu in (("gpu00011", 0), ("gpu00011", 1), ("gpu00012", 3)):
        records.finding(finding("CONFIRMED", job_a, node, gpu, t))
    records.finding(finding("CONFIRMED", job_b, "gpu00013", 2, t))
    records.recommendation(recommendation("gpu00011", "DRAIN", job_a, [0, 1], t, t + 3_600_000))
    # An ALERT recommendation that expires soon: its alert must end by itself.
    records.recommendation(recommendation("gpu00013", "ALERT", job_b, [2], t, now_ms() + 20_000))

    with exporter(stack, kafka_settings, topic_prefix, tmp_path / "export.log", 1.0) as log:

        def diagnose() -> str:
            return (f"exporter log:\n{log()[-2500:]}\nalertmanager log:\n{stack.am.log_tail()}\n"
                    f"webhook: {json.dumps(stack.hook.notifications())[-2500:]}")  # fmt: skip

        alerts = wait_for("6 alerts", lambda: a if len(a := stack.alerts()) == 6 else None,
                          diagnose)  # fmt: skip
        found = by_name(alerts)
        straggler = found[("GpuStraggler", "gpu00011", "0")]
        assert straggler["labels"] == {"alertname": "GpuStraggler", "severity": "warning",
                                       "job_id": job_a, "node": "gpu00011", "gpu": "0",
                                       "cause": "thermal"}  # fmt: skip
        assert straggler["annotations"]["evidence"] == "clk -5.7% z=-5.6"
        assert "nvidia-smi" in straggler["annotations"]["runbook"]
        assert straggler["status"]["state"] == "active"
        drain = found[("NodeDrainRecommended", "gpu00011", "0,1")]
        assert drain["labels"]["severity"] == "warning" and drain["labels"]["job_id"] == job_a
        assert found[("NodeAlert", "gpu00013", "2")]["labels"]["severity"] == "info"

        # group_by job_id: each job's alerts arrive together, in one notification.
        first_a = wait_for(
            "job A's notification", lambda: stack.hook.notifications(job_a), diagnose
        )
        assert len(first_a) == 1 and first_a[0]["status"] == "firing"
        assert {(a["labels"]["alertname"], a["labels"]["node"], a["labels"]["gpu"])
                for a in first_a[0]["alerts"]} == {
            ("GpuStraggler", "gpu00011", "0"), ("GpuStraggler", "gpu00011", "1"),
            ("GpuStraggler", "gpu00012", "3"), ("NodeDrainRecommended", "gpu00011", "0,1"),
        }  # fmt: skip
        first_b = wait_for(
            "job B's notification", lambda: stack.hook.notifications(job_b), diagnose
        )
        assert len(first_b[0]["alerts"]) == 2

        # Re-sent while active: Alertmanager keeps receiving the same alerts.
        received = stack.received_total()
        wait_for("a re-send", lambda: stack.received_total() >= received + 6, diagnose)

        # A CLEARED finding for job A, node gpu00011, GPU 0 resolves that alert only.
        records.finding(finding("CLEARED", job_a, "gpu00011", 0, now_ms()))

        def resolved_in(job: str, key: tuple[str, str, str]) -> dict[str, Any] | None:
            for note in stack.hook.notifications(job):
                for a in note["alerts"]:
                    labels = a["labels"]
                    if (labels["alertname"], labels["node"], labels["gpu"]) == key and (
                        a["status"] == "resolved"
                    ):
                        return note
            return None

        note = wait_for("the resolved straggler",
                        lambda: resolved_in(job_a, ("GpuStraggler", "gpu00011", "0")), diagnose)  # fmt: skip
        assert sorted(a["status"] for a in note["alerts"]) == ["firing"] * 3 + ["resolved"]
        active = by_name(stack.alerts())
        assert ("GpuStraggler", "gpu00011", "0") not in active
        assert ("GpuStraggler", "gpu00011", "1") in active

        # The ALERT recommendation expired: its alert resolves without another record.
        wait_for("the expired recommendation",
                 lambda: resolved_in(job_b, ("NodeAlert", "gpu00013", "2")), diagnose)  # fmt: skip
        assert ("NodeAlert", "gpu00013", "2") not in by_name(stack.alerts())
        assert "caught up after 6 records" in log()


def test_network_alerts_carry_port_device_switch_and_cause_that_matchers_select(
    stack: Stack, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    """A port's finding, the node's port-down recommendation and a leaf switch's finding: the
    labels Alertmanager holds, selected with its own label matchers (as a silence or a route
    would select them)."""
    records = Records(kafka_settings, topic_prefix)
    t, job = now_ms(), "4201"
    link = {**finding("CONFIRMED", job, "gpu00021", 0, t), "gpu_index": None,
            "finding_id": f"{job}-net", "cause": "NETWORK", "port": "mlx5_2/1",
            "reason": "port mlx5_2/1 errors 40/s against peers 0/s"}  # fmt: skip
    records.finding(link)
    records.finding({**finding("FLEET_WIDE", "fleet", "", 0, t), "node": None,
                     "gpu_index": None, "finding_id": "sw", "cause": "NETWORK",
                     "switch": "leaf07"})  # fmt: skip
    records.recommendation({**recommendation("gpu00021", "DRAIN", job, [0, 1], t,
                                             t + 3_600_000),
                            "cause": "NETWORK", "port": "mlx5_2/1",
                            "reason": "port mlx5_2/1 down 8 s"})  # fmt: skip

    with exporter(stack, kafka_settings, topic_prefix, tmp_path / "export.log", 1.0) as log:

        def diagnose() -> str:
            return f"exporter log:\n{log()[-2500:]}\nalertmanager log:\n{stack.am.log_tail()}"

        wait_for("3 alerts", lambda: len(stack.alerts()) == 3, diagnose)
        port = stack.get("/api/v2/alerts?filter=port%3D%22mlx5_2%2F1%22")
        assert {a["labels"]["alertname"] for a in port} == {"GpuStraggler", "NodeDrainRecommended"}
        for a in port:
            assert (a["labels"]["node"], a["labels"]["device"], a["labels"]["cause"]) == (
                "gpu00021",
                "mlx5_2",
                "network",
            )
        [switch] = stack.get("/api/v2/alerts?filter=switch%3D%22leaf07%22")
        assert switch["labels"]["alertname"] == "FleetWideShift"
        assert switch["labels"]["cause"] == "network" and "node" not in switch["labels"]
        assert "leaf switch leaf07" in switch["annotations"]["summary"]
        assert len(stack.get("/api/v2/alerts?filter=cause%3D%22network%22")) == 3


def test_restart_resends_the_same_alerts_and_notifies_nobody_again(
    stack: Stack, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    records = Records(kafka_settings, topic_prefix)
    job = "4101"
    log_path = tmp_path / "export.log"

    def diagnose() -> str:
        return (f"exporter log:\n{log_path.read_text()[-3000:]}\n"
                f"webhook: {json.dumps(stack.hook.notifications())[-2500:]}")  # fmt: skip

    # resend 15 s: Alertmanager holds a firing alert for 4 resends (60 s) without news, longer
    # than the restart takes on a loaded machine, as Prometheus's 1 min resend gives 4 min.
    with exporter(stack, kafka_settings, topic_prefix, log_path, 15.0) as log:
        # Live this time: the records arrive after the (empty) replay.
        wait_for("the replay", lambda: "caught up after 0 records" in log(), diagnose)
        t = now_ms()
        records.finding(finding("CONFIRMED", job, "gpu00021", 4, t))
        records.finding(finding("CONFIRMED", job, "gpu00022", 6, t))
        wait_for("the job's notification",
                 lambda: (n := stack.hook.notifications(job)) and len(n[0]["alerts"]) == 2,
                 diagnose)  # fmt: skip
        before = {a["fingerprint"]: a["startsAt"] for a in stack.alerts()}
        assert len(before) == 2
    notes_before = len(stack.hook.notifications())
    received = stack.received_total()

    with exporter(stack, kafka_settings, topic_prefix, log_path, 15.0) as log:
        # The restarted exporter replays the topic and sends the same two alerts again...
        wait_for("the re-sent alerts", lambda: stack.received_total() >= received + 2, diagnose)
        assert log().count("replay caught up after 2 records: 2 alerts firing") == 1
        # ...which Alertmanager merges: same fingerprints, same start, and after several group
        # intervals still no new notification.
        time.sleep(3 * GROUP_INTERVAL_S + 2)
        after = {a["fingerprint"]: a["startsAt"] for a in stack.alerts()}
        assert after == before
        assert len(stack.hook.notifications()) == notes_before, diagnose()


def test_alerts_wait_for_alertmanager_and_arrive_when_it_is_back(
    stack: Stack, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    """Alertmanager down: the exporter keeps the alert, logs each failed try and backs off; the
    alert arrives once Alertmanager answers again (the loop did not die meanwhile)."""
    records = Records(kafka_settings, topic_prefix)
    stack.am.stop()
    job = "4201"
    with exporter(stack, kafka_settings, topic_prefix, tmp_path / "export.log", 1.0,
                  PEERWATCH_ALERTMANAGER_RETRY_MAX_S="1") as log:  # fmt: skip

        def diagnose() -> str:
            return f"exporter log:\n{log()[-3000:]}\nalertmanager log:\n{stack.am.log_tail()}"

        wait_for("the replay", lambda: "caught up after 0 records" in log(), diagnose)
        records.finding(finding("CONFIRMED", job, "gpu00031", 1, now_ms()))
        wait_for("two failed tries", lambda: log().count("unreachable") >= 2, diagnose)
        assert "1 alerts kept" in log()
        stack.am.start()
        alerts = wait_for("the alert", stack.alerts, diagnose)
        assert [a["labels"]["job_id"] for a in alerts] == [job]
        wait_for("its notification", lambda: stack.hook.notifications(job), diagnose)
        assert "answers again" in log()


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (
            {"alertname": "NodeDrainRecommended", "severity": "warning", "node": "n1"},
            "oncall-pager",
        ),
        ({"alertname": "GpuHardError", "severity": "critical", "node": "n1"}, "oncall-pager"),
        ({"alertname": "GpuStraggler", "severity": "warning", "job_id": "1"}, "gpu-team-email"),
        ({"alertname": "JobWideSlowdown", "severity": "info", "job_id": "1"}, "slack-gpu"),
    ],
)
def test_the_routing_example_in_the_operations_guide_is_valid(
    labels: dict[str, str], receiver: str, tmp_path: Path
) -> None:
    """docs/operations.md's Alertmanager config passes ``amtool check-config`` and routes as the
    guide says (amtool comes with Debian's prometheus-alertmanager)."""
    doc = (REPO_ROOT / "docs" / "operations.md").read_text()
    start = doc.index("# /etc/prometheus/alertmanager.yml")
    config = tmp_path / "alertmanager.yml"
    config.write_text(doc[start : doc.index("```", start)])
    check = subprocess.run(["amtool", "check-config", str(config)],
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    route = subprocess.run(
        ["amtool", "config", "routes", "test", f"--config.file={config}",
         *(f"{k}={v}" for k, v in labels.items())],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert route.returncode == 0 and route.stdout.strip() == receiver, route.stdout + route.stderr
