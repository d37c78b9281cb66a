"""Findings and recommendations -> Alertmanager alerts: the pure state machine, no processes."""

from __future__ import annotations

from typing import Any

import pytest

from peerwatch.errors import ConfigError, ServiceError
from peerwatch.exporters.alertmanager import AlertSender, AlertSink, ReplayProgress, book_for
from peerwatch.exporters.alerts import (
    GPU_HARD_ERROR,
    GPU_STRAGGLER,
    NODE_DRAIN,
    RUNBOOK,
    AlertBook,
    BadAlertRecord,
    iso_ms,
    to_api,
)
from peerwatch.exporters.base import ExportError
from peerwatch.settings import AlertmanagerSettings, Settings, with_overrides

T0 = 1_796_000_000_000  # ms, 2026-12
MIN = 60_000
TTL = 60 * MIN
RESEND = MIN


def book(**kw: Any) -> AlertBook:
    args = dict(finding_ttl_ms=TTL, resend_ms=RESEND, resolved_retention_ms=15 * MIN,
                max_alerts=100)  # fmt: skip
    return AlertBook(**{**args, **kw})


def finding(status: str, t_ms: int, *, job: str = "1001", node: str = "gpu00003", gpu: int | None = 5,
            cause: str = "THERMAL", **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {
        "finding_id": f"f-{status}-{t_ms}", "job_id": job, "node": node, "gpu_index": gpu,
        "gpu_uuid": None, "status": status, "window_start_ms": t_ms - 30_000,
        "window_end_ms": t_ms,
        "features": [{"feature": "clk", "value": 1650.0, "peer_median": 1750.0, "mad": 10.0,
                      "z": -6.7}],
        "hard_rules": [], "windows_flagged": 4, "windows_considered": 6,
        "first_flagged_ms": t_ms - 120_000, "peer_group_size": 16,
        "reason": "confirmed slow vs peers: clk -5.7% z=-6.7; 4/6 windows", "cause": cause,
        "detected_ms": t_ms, **extra,
    }  # fmt: skip


def rec(t_ms: int, *, expires_ms: int | None, node: str = "gpu00003", action: str = "DRAIN",
        severity: str = "WARNING", rec_id: str = "r1") -> dict[str, Any]:  # fmt: skip
    return {
        "recommendation_id": rec_id, "node": node, "ts_ms": t_ms, "action": action,
        "severity": severity, "hard": False, "reason": "GPU 5 slow 10 min (clk -5.7%)",
        "gpu_indices": [5], "job_ids": ["1001"], "partition": "gpu",
        "evidence": [{"kind": "straggler", "detail": "clk -5.7% z=-6.7", "finding_id": "f1",
                      "job_id": "1001", "gpu_index": 5}],
        "expires_ms": expires_ms, "cause": "THERMAL",
    }  # fmt: skip


def only(b: AlertBook) -> Any:
    assert len(b.alerts) == 1, b.alerts
    return next(iter(b.alerts.values()))


def test_confirmed_finding_opens_an_alert_with_labels_evidence_and_runbook() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    a = only(b)
    assert dict(a.labels) == {"alertname": GPU_STRAGGLER, "severity": "warning", "job_id": "1001",
                              "node": "gpu00003", "gpu": "5", "cause": "thermal"}  # fmt: skip
    assert (
        a.annotations["summary"]
        == "GPU 5 on gpu00003 runs slow against its peers in job 1001 (thermal)"
    )
    assert a.annotations["evidence"] == "clk -5.7% z=-6.7"
    assert "4/6 windows flagged; 16 peers" in a.annotations["description"]
    assert a.annotations["runbook"] == RUNBOOK["THERMAL"]
    assert a.annotations["first_flagged"] == iso_ms(T0 - 120_000)
    assert a.firing and a.starts_ms == T0 and a.valid_until_ms == T0 + TTL


@pytest.mark.parametrize("status", ["SUSPECT", "UNKNOWN"])
def test_suspect_and_unknown_open_nothing(status: str) -> None:
    b = book()
    b.apply("StragglerFinding", finding(status, T0))
    assert b.alerts == {} and b.stats.ignored == 1


def test_heartbeat_refreshes_the_same_alert_and_keeps_its_labels() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    b.apply("StragglerFinding", finding("CONFIRMED", T0 + 5 * MIN, cause="POWER", reason="newer"))
    a = only(b)
    assert dict(a.labels)["cause"] == "thermal"  # fixed when it opened
    assert a.annotations["description"].startswith("newer")  # evidence follows the records
    assert a.starts_ms == T0 and a.valid_until_ms == T0 + 5 * MIN + TTL
    assert b.stats.opened == 1 and b.stats.refreshed == 1


def test_cleared_finding_of_the_same_gpu_resolves_it_and_no_other() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    b.apply("StragglerFinding", finding("CONFIRMED", T0, gpu=6))
    b.apply("StragglerFinding", finding("CLEARED", T0 + 10 * MIN))
    by_gpu = {dict(a.labels)["gpu"]: a for a in b.alerts.values()}
    assert by_gpu["5"].ends_ms == T0 + 10 * MIN and by_gpu["6"].firing
    body = to_api(by_gpu["5"], now_ms=T0 + 11 * MIN, resend_ms=RESEND)
    assert body["endsAt"] == iso_ms(T0 + 10 * MIN) and body["startsAt"] == iso_ms(T0)


def test_a_new_episode_after_clearing_is_a_new_alert_with_a_new_start() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    b.apply("StragglerFinding", finding("CLEARED", T0 + 10 * MIN))
    b.apply("StragglerFinding", finding("CONFIRMED", T0 + 20 * MIN))
    a = only(b)  # the same labels: Alertmanager sees the alert fire again
    assert a.firing and a.starts_ms == T0 + 20 * MIN


def test_hard_error_is_critical_ignores_cleared_and_ends_after_the_ttl() -> None:
    b = book()
    b.apply("StragglerFinding", finding("HARD_ERROR", T0, cause="HARDWARE", hard_rules=["xid_79"]))
    b.apply("StragglerFinding", finding("CLEARED", T0 + MIN))
    a = only(b)
    assert (
        dict(a.labels)["alertname"] == GPU_HARD_ERROR and dict(a.labels)["severity"] == "critical"
    )
    assert "rule xid_79" in a.annotations["evidence"] and a.firing
    b.expire(T0 + TTL)
    assert a.ends_ms == T0 + TTL


def test_drain_recommendation_alert_ends_at_its_expiry_and_reopens_after() -> None:
    b = book()
    b.apply("DrainRecommendation", rec(T0, expires_ms=T0 + 30 * MIN, severity="CRITICAL"))
    a = only(b)
    assert dict(a.labels) == {"alertname": NODE_DRAIN, "severity": "critical", "node": "gpu00003",
                              "gpu": "5", "job_id": "1001", "cause": "thermal"}  # fmt: skip
    assert a.annotations["recommendation_id"] == "r1"
    assert a.annotations["evidence"] == "straggler: clk -5.7% z=-6.7"
    b.apply(
        "DrainRecommendation",
        rec(T0 + 10 * MIN, expires_ms=T0 + 40 * MIN, severity="CRITICAL", rec_id="r2"),
    )
    assert only(b).valid_until_ms == T0 + 40 * MIN and only(b).starts_ms == T0
    body = to_api(a, now_ms=T0 + 35 * MIN, resend_ms=RESEND)
    assert body["endsAt"] == iso_ms(T0 + 39 * MIN)  # 4 resends ahead, within the expiry
    b.expire(T0 + 41 * MIN)
    assert a.ends_ms == T0 + 40 * MIN
    b.apply(
        "DrainRecommendation",
        rec(T0 + 50 * MIN, expires_ms=T0 + 80 * MIN, severity="CRITICAL", rec_id="r3"),
    )
    assert only(b).firing and only(b).starts_ms == T0 + 50 * MIN


def test_job_end_resolves_the_jobs_alerts_and_its_late_findings_open_nothing() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    b.apply("StragglerFinding", finding("CONFIRMED", T0, job="2002"))
    b.apply("JobEvent", {"job_id": "1001", "kind": "ENDED", "ts_ms": T0 + MIN, "end_ms": T0 + MIN})
    by_job = {dict(a.labels)["job_id"]: a for a in b.alerts.values()}
    assert by_job["1001"].ends_ms == T0 + MIN and by_job["2002"].firing
    b.apply("StragglerFinding", finding("CONFIRMED", T0 + 30_000, gpu=7))  # read late
    assert len(b.alerts) == 2 and b.stats.ignored == 1


def test_a_hard_error_outlives_its_job() -> None:
    """The lost GPU that ended the job is still lost: only the TTL ends its alert."""
    b = book()
    b.apply("StragglerFinding", finding("HARD_ERROR", T0, cause="HARDWARE"))
    b.apply("JobEvent", {"job_id": "1001", "kind": "ENDED", "ts_ms": T0 + MIN, "end_ms": T0 + MIN})
    b.apply("StragglerFinding", finding("HARD_ERROR", T0 + 30_000, gpu=7, cause="HARDWARE"))
    assert len(b.alerts) == 2 and all(a.firing for a in b.alerts.values())


def test_due_sends_new_then_waits_for_resend_and_sends_changes_at_once() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    due = b.due(T0)
    assert len(due) == 1
    b.mark_sent(due, T0)
    assert b.due(T0 + RESEND - 1) == []
    assert len(b.due(T0 + RESEND)) == 1
    b.mark_sent(b.alerts.values(), T0 + RESEND)
    b.apply("StragglerFinding", finding("CLEARED", T0 + RESEND + 1))
    assert [a.ends_ms for a in b.due(T0 + RESEND + 2)] == [T0 + RESEND + 1]


def test_resolved_alerts_are_resent_for_the_retention_then_forgotten() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    b.apply("StragglerFinding", finding("CLEARED", T0 + MIN))
    b.mark_sent(b.due(T0 + MIN), T0 + MIN)
    assert len(b.due(T0 + 2 * MIN)) == 1  # resent while retained
    b.expire(T0 + MIN + 15 * MIN + 1)
    assert b.alerts == {} and b.stats.forgotten == 1


def test_replaying_the_records_rebuilds_the_same_alerts() -> None:
    """The restart guarantee: a fresh book given the same records (topic replay) holds alerts
    with the same labels and start, so Alertmanager merges them and notifies nobody again."""
    records = [
        ("StragglerFinding", finding("CONFIRMED", T0)),
        ("StragglerFinding", finding("CONFIRMED", T0, gpu=6)),
        ("StragglerFinding", finding("CONFIRMED", T0 + 5 * MIN)),
        ("DrainRecommendation", rec(T0 + 10 * MIN, expires_ms=T0 + 90 * MIN)),
        ("StragglerFinding", finding("CLEARED", T0 + 12 * MIN, gpu=6)),
    ]
    now = T0 + 13 * MIN
    first, second = book(), book()
    for name, r in records:
        first.apply(name, r)
    first.mark_sent(first.due(now), now)
    for name, r in records:
        second.apply(name, r)
    bodies = [
        sorted((to_api(a, now, RESEND) for a in b.due(now)), key=str) for b in (first, second)
    ]
    assert len(second.due(now)) == 3 and bodies[0] == []
    assert sorted((to_api(a, now, RESEND) for a in first.alerts.values()), key=str) == bodies[1]


def test_api_times_are_never_in_the_future() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0 + MIN))  # event time ahead of the wall
    b.apply("StragglerFinding", finding("CLEARED", T0 + 2 * MIN))
    body = to_api(only(b), now_ms=T0, resend_ms=RESEND)
    assert body["startsAt"] == body["endsAt"] == iso_ms(T0)


def test_idle_jobs_get_no_job_label_and_bad_records_are_refused() -> None:
    b = book()
    b.apply("StragglerFinding", finding("HARD_ERROR", T0, job="idle:gpu00003", cause="HARDWARE"))
    assert "job_id" not in dict(only(b).labels)
    with pytest.raises(BadAlertRecord):
        b.apply("StragglerFinding", finding("CONFIRMED", T0, job=""))
    with pytest.raises(ExportError):
        AlertSink(b).write("DrainRecommendation", rec(T0, expires_ms=None, node=""))
    b.apply("GpuWindow", {"node": "x"})  # not an alert's business
    assert b.stats.ignored == 1


def test_label_values_are_cleaned_and_bounded() -> None:
    b = book()
    b.apply("StragglerFinding", finding("CONFIRMED", T0, node="n\x1b[31m" + "x" * 300))
    node = dict(only(b).labels)["node"]
    assert "\x1b" not in node and len(node) == 128


def test_a_full_book_forgets_resolved_alerts_first_then_drops_new_ones() -> None:
    b = book(max_alerts=2)
    b.apply("StragglerFinding", finding("CONFIRMED", T0, gpu=1))
    b.apply("StragglerFinding", finding("CONFIRMED", T0, gpu=2))
    b.apply("StragglerFinding", finding("CLEARED", T0 + MIN, gpu=1))
    b.apply("StragglerFinding", finding("CONFIRMED", T0 + MIN, gpu=3))
    assert sorted(dict(a.labels)["gpu"] for a in b.alerts.values()) == ["2", "3"]
    b.apply("StragglerFinding", finding("CONFIRMED", T0 + MIN, gpu=4))
    assert b.stats.dropped_full == 1 and len(b.alerts) == 2


class FakeClock:
    def __init__(self) -> None:
        self.ms, self.mono_s = T0, 0.0

    def now_ms(self) -> int:
        return self.ms

    def monotonic_s(self) -> float:
        return self.mono_s


class FlakyClient:
    url = "http://127.0.0.1:1"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.posted: list[list[dict[str, Any]]] = []

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        if self.failures:
            self.failures -= 1
            raise ServiceError("Alertmanager unreachable: connection refused")
        self.posted.append(list(alerts))


def test_sender_keeps_alerts_and_backs_off_while_alertmanager_fails() -> None:
    b, clock, client = book(), FakeClock(), FlakyClient(failures=2)
    b.apply("StragglerFinding", finding("CONFIRMED", T0))
    sender = AlertSender(b, client, retry_max_s=0.8, clock=clock)  # type: ignore[arg-type]
    assert sender.tick() == 0 and sender.stats.failures == 1
    assert sender.tick() == 0 and sender.stats.failures == 1  # backing off: not even tried
    clock.mono_s += 0.5
    assert sender.tick() == 0 and sender.stats.failures == 2
    clock.mono_s += 0.7
    assert sender.tick() == 0  # second backoff is 0.8 s (doubled, capped)
    clock.mono_s += 0.1
    assert sender.tick() == 1
    assert client.posted[0][0]["labels"]["alertname"] == GPU_STRAGGLER
    assert sender.tick() == 0  # sent: not due again before the resend


def test_replay_progress_waits_for_every_partition() -> None:
    progress = ReplayProgress(ends={("t", 0): 5, ("t", 1): 2})
    assert not progress.check({("t", 0): 5, ("t", 1): -1001})
    assert progress.check({("t", 0): 5, ("t", 1): 2})
    assert progress.check({})  # stays caught up
    assert ReplayProgress().check({})  # nothing to replay


def test_settings_name_the_bad_field() -> None:
    with pytest.raises(ConfigError, match=r"alertmanager\.url"):
        AlertmanagerSettings(url="ftp://x")
    with pytest.raises(ConfigError, match=r"alertmanager\.resend_s"):
        with_overrides(Settings(), {"alertmanager.resend_s": 0})
    b = book_for(AlertmanagerSettings(resend_s=2.5))
    assert b.resend_ms == 2500 and b.finding_ttl_ms == 3_600_000


# --- the network: port, device and switch labels --------------------------------------------


def net_finding(t_ms: int, port: str, *, node: str = "gpu00003", **extra: Any) -> dict[str, Any]:
    return finding("CONFIRMED", t_ms, node=node, gpu=None, cause="NETWORK", port=port,
                   features=[{"feature": "net_errors", "value": 40.0, "peer_median": 0.0,
                              "mad": 1.0, "z": 40.0}], **extra)  # fmt: skip


def test_a_network_finding_names_its_port_and_device_and_each_port_is_its_own_alert() -> None:
    b = book()
    b.apply("StragglerFinding", net_finding(T0, "mlx5_0/1"))
    b.apply("StragglerFinding", net_finding(T0, "mlx5_1/1"))
    b.apply("StragglerFinding", net_finding(T0 + MIN, "mlx5_0/1"))  # a heartbeat: refreshes
    by_port = {dict(a.labels)["port"]: a for a in b.alerts.values()}
    assert set(by_port) == {"mlx5_0/1", "mlx5_1/1"} and b.stats.opened == 2
    assert dict(by_port["mlx5_0/1"].labels) == {
        "alertname": GPU_STRAGGLER, "severity": "warning", "job_id": "1001", "node": "gpu00003",
        "cause": "network", "port": "mlx5_0/1", "device": "mlx5_0",
    }  # fmt: skip
    ann = by_port["mlx5_0/1"].annotations
    assert ann["summary"].startswith("port mlx5_0/1 of gpu00003 runs slow")
    assert ann["runbook"] == RUNBOOK["NETWORK"]


def test_a_leaf_switch_finding_is_labelled_with_the_switch_and_each_switch_apart() -> None:
    b = book()
    for switch in ("leaf03", "leaf04"):
        b.apply("StragglerFinding", finding("FLEET_WIDE", T0, job="fleet", node="", gpu=None,
                                            cause="NETWORK", switch=switch))  # fmt: skip
    labels = sorted(dict(a.labels)["switch"] for a in b.alerts.values())
    assert labels == ["leaf03", "leaf04"]
    a = next(a for a in b.alerts.values() if dict(a.labels)["switch"] == "leaf03")
    assert "port" not in dict(a.labels) and dict(a.labels)["cause"] == "network"
    assert a.annotations["summary"].startswith("leaf switch leaf03: a symptom shared")


def test_a_network_recommendation_carries_port_and_device() -> None:
    b = book()
    r = {**rec(T0, expires_ms=T0 + 10 * MIN), "cause": "NETWORK", "port": "eth0",
         "reason": "port eth0 down 8 s"}  # fmt: skip
    b.apply("DrainRecommendation", r)
    labels = dict(only(b).labels)
    assert (labels["port"], labels["device"], labels["cause"]) == ("eth0", "eth0", "network")
    assert "switch" not in labels


def test_the_label_values_of_a_hostile_port_name_are_cleaned() -> None:
    b = book()
    b.apply("StragglerFinding", net_finding(T0, "mlx5_0/1\x1b[31m" + "x" * 300))
    labels = dict(only(b).labels)
    assert "\x1b" not in labels["port"] and len(labels["port"]) <= 128
