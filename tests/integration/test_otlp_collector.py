"""``peerwatch export otlp`` end to end: known records on real Kafka -> the exporter -> a real
OpenTelemetry Collector (built from source by the fixture) -> its file output, read back.

gRPC runs the real CLI in a subprocess (stopped with SIGTERM); HTTP/protobuf runs the library
loop in a thread. Both check metric names, units, attributes and values, the events, the
eviction of an ended job's series and the dead-letter record of an undecodable input.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from peerwatch.exporters.consume import kafka_export_loop
from peerwatch.exporters.otlp_sdk import otlp_sink
from peerwatch.kafka_config import consumer_config, producer_config
from peerwatch.schemas.codec import codec_for
from peerwatch.settings import ExportSettings, KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import (
    ACTIONS,
    DEADLETTER,
    HEALTH,
    JOB_EVENTS,
    JOB_WINDOWS,
    RECOMMENDATIONS,
    STRAGGLERS,
    catalogue,
)
from tests.integration.collector_fixture import OtelCollector

# A cold collector build (first run on a machine) takes minutes on two cores.
pytestmark = pytest.mark.timeout(1800)

T0_MS = 1_795_000_000_000
WINDOW_MS = 60_000
NODE, JOB, OTHER_NODE, OTHER_JOB = "gpu00005", "1001", "gpu00006", "1002"
EXPECTED_METRICS = {
    "hw.gpu.utilization", "hw.power", "hw.temperature", "hw.energy", "hw.errors",
    "peerwatch.gpu.sm_clock.ratio", "peerwatch.gpu.throttle.ratio",
    "peerwatch.gpu.power_cap.ratio", "peerwatch.gpu.power_limit.ratio",
    "peerwatch.training.step.duration", "peerwatch.straggler.score",
}  # fmt: skip


def gpu_window(job: str, node: str, gpu: int, n: int) -> dict[str, Any]:
    """Window n of one GPU. Window 1 of GPU 3 is the straggler: 650 W, clock ratio 0.93."""
    straggler = gpu == 3 and n == 1
    return {
        "job_id": job, "node": node, "gpu_index": gpu, "gpu_uuid": f"GPU-{node}-{gpu:04d}",
        "window_start_ms": T0_MS + n * WINDOW_MS, "window_end_ms": T0_MS + (n + 1) * WINDOW_MS,
        "samples": 60, "user": "alice", "partition": "h100", "account": "llm",
        "clk_ratio": 0.93 if straggler else 0.998, "throttle_frac": 0.25 if straggler else 0.0,
        "power_cap_frac": 0.0, "sm_frac": 0.9, "power_ratio": 0.8,
        "power_w": 500.0 if n == 0 else 620.0 + 10 * gpu, "temperature_c_max": 60 + gpu,
        "energy_j": 1000.0 if n == 0 else 1500.0, "ecc_uncorrected_delta": 0,
        "nvlink_errors_delta": 2 if straggler else 0, "pcie_replay_delta": 0,
        "pcie_link_width_min": 16, "pcie_link_width_max": 16, "remap_pending": False,
        "remap_failed": False, "lost": False, "xids": [], "step_ms": 1500.0,
        "score": None if gpu == 7 else (4.7 if straggler else 0.4),
        "gated": "low_activity" if gpu == 7 else None,
    }  # fmt: skip


FINDING: dict[str, Any] = {
    "finding_id": "sf-1001-3", "job_id": JOB, "node": NODE, "gpu_index": 3,
    "gpu_uuid": f"GPU-{NODE}-0003", "status": "CONFIRMED", "window_start_ms": T0_MS + WINDOW_MS,
    "window_end_ms": T0_MS + 2 * WINDOW_MS,
    "features": [{"feature": "clk", "value": 0.93, "peer_median": 0.998, "mad": 0.004, "z": -11.5}],
    "hard_rules": [], "windows_flagged": 4, "windows_considered": 5,
    "first_flagged_ms": T0_MS, "peer_group_size": 8, "reason": "gpu 3 clock 7% below peers",
}  # fmt: skip
RECOMMENDATION: dict[str, Any] = {
    "recommendation_id": "dr-gpu00005-1", "node": NODE, "ts_ms": T0_MS + 2 * WINDOW_MS,
    "action": "DRAIN", "severity": "CRITICAL", "hard": False, "reason": "straggler gpu 3",
    "gpu_indices": [3], "job_ids": [JOB], "partition": "h100",
    "evidence": [{"kind": "straggler", "detail": "clk 0.93 vs 0.998", "finding_id": "sf-1001-3",
                  "job_id": JOB, "gpu_index": 3}],
    "expires_ms": None,
}  # fmt: skip
HEALTH_RESULT: dict[str, Any] = {
    "event_id": "hc-1", "node": NODE, "ts_ms": T0_MS, "phase": "PROLOG", "job_id": JOB,
    "status": "OK", "exit_code": 0, "duration_ms": 420,
    "checks": [{"name": "gpu_count", "status": "OK", "message": "8 of 8", "gpu_index": None}],
}  # fmt: skip
ACTION: dict[str, Any] = {
    "action_id": "dr-gpu00005-1-SHADOWED", "recommendation_id": "dr-gpu00005-1", "node": NODE,
    "ts_ms": T0_MS + 2 * WINDOW_MS + 20, "decision": "SHADOWED", "mode": "SHADOW",
    "refusal": None, "slurm_reason": "peerwatch: straggler gpu 3", "partition": "h100",
    "detail": "shadow mode: would have drained",
}  # fmt: skip


def job_event(job: str, kind: str) -> dict[str, Any]:
    return {
        "event_id": f"je-{job}-{kind}", "job_id": job, "kind": kind, "ts_ms": T0_MS,
        "source": "WATCHER", "state": "COMPLETED", "exit_code": 0, "user": "alice",
        "partition": "h100", "account": "llm", "job_name": "x", "allocations": [],
        "start_ms": T0_MS, "end_ms": T0_MS + 3 * WINDOW_MS, "restart_count": 0,
    }  # fmt: skip


def produce(settings: KafkaSettings, records: list[tuple[str, str, bytes]]) -> None:
    producer = Producer(producer_config(settings))
    for topic, key, value in records:
        producer.produce(topic, value, key.encode())
    assert producer.flush(30) == 0


def encoded(schema: str, record: dict[str, Any]) -> bytes:
    return codec_for(schema).encode(record)


def ours(items: list[dict[str, Any]], instance: str) -> list[dict[str, Any]]:
    return [i for i in items if i["resource"].get("service.instance.id") == instance]


def point(
    points: list[dict[str, Any]], name: str, job: str, gpu: int, **attrs: Any
) -> dict[str, Any]:
    """The latest point of ``name`` for the job's GPU."""
    matching = [p for p in points if p["name"] == name and p["attributes"]["slurm.job.id"] == job
                and p["attributes"]["gpu.index"] == gpu
                and all(p["attributes"].get(k) == v for k, v in attrs.items())]  # fmt: skip
    assert matching, f"no {name} point for job {job} GPU {gpu} {attrs}"
    return max(matching, key=lambda p: p["time_unix_nano"])


@contextmanager
def cli_exporter(
    collector: OtelCollector, settings: KafkaSettings, prefix: str, instance: str
) -> Iterator[None]:
    """``peerwatch export otlp`` over gRPC in a subprocess; SIGTERM must stop it cleanly."""
    env = {**os.environ, "PEERWATCH_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
           "PEERWATCH_TOPIC_PREFIX": prefix, "OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={instance}"}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "peerwatch.cli", "export", "otlp", "--protocol", "grpc",
         "--endpoint", collector.grpc_endpoint, "--interval-s", "1", "--group-id", f"{prefix}export"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
            pytest.fail(f"exporter ignored SIGTERM:\n{err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    assert "export otlp stopped" in err and "undecodable=1" in err, err[-3000:]


@contextmanager
def library_exporter(
    collector: OtelCollector, settings: KafkaSettings, prefix: str, instance: str
) -> Iterator[None]:
    """The library loop over OTLP/HTTP in a thread."""
    sink = otlp_sink(ExportSettings(endpoint=collector.http_endpoint, protocol="http", interval_s=1.0),
                     resource_attributes={"service.instance.id": instance})  # fmt: skip
    loop, consumer, deadletter = kafka_export_loop(
        settings, sink, group_id=f"{prefix}export", topic_prefix=prefix
    )
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), kwargs={"poll_timeout_s": 0.2})
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
        sink.close()
        consumer.close()
        assert deadletter.flush(10) == 0
    assert not thread.is_alive()
    assert loop.stats.records >= 20 and loop.stats.undecodable == 1
    assert sink.stats()["metric_export_failed"] == 0 and sink.stats()["event_export_failed"] == 0


def read_deadletter(settings: KafkaSettings, topic: str) -> list[Any]:
    consumer = Consumer(consumer_config(settings, f"dlq-{uuid.uuid4().hex}"))
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msgs = [m for m in consumer.consume(10, timeout=1.0) if m.error() is None]
            if msgs:
                return msgs
        return []
    finally:
        consumer.close()


Exporter = Callable[[OtelCollector, KafkaSettings, str, str], Any]


@pytest.mark.parametrize(
    ("protocol", "exporter"), [("grpc", cli_exporter), ("http", library_exporter)]
)
def test_export_to_a_real_collector(
    otel_collector: OtelCollector, kafka_settings: KafkaSettings, topic_prefix: str,
    protocol: str, exporter: Exporter,
) -> None:  # fmt: skip
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    t = {spec.name: topic_prefix + spec.name for spec in
         (JOB_WINDOWS, JOB_EVENTS, STRAGGLERS, RECOMMENDATIONS, HEALTH, ACTIONS, DEADLETTER)}  # fmt: skip
    windows = [gpu_window(JOB, NODE, g, n) for n in (0, 1) for g in range(8)]
    windows.append(gpu_window(OTHER_JOB, OTHER_NODE, 0, 0))
    produce(kafka_settings, [(t[JOB_WINDOWS.name], w["job_id"], encoded("GpuWindow", w)) for w in windows]
            + [(t[JOB_WINDOWS.name], JOB, b"\xc3\x01 not an avro record"),
               (t[STRAGGLERS.name], JOB, encoded("StragglerFinding", FINDING)),
               (t[RECOMMENDATIONS.name], NODE, encoded("DrainRecommendation", RECOMMENDATION)),
               (t[HEALTH.name], NODE, encoded("HealthCheckResult", HEALTH_RESULT)),
               (t[ACTIONS.name], NODE, encoded("DrainAction", ACTION))])  # fmt: skip
    instance = f"{protocol}-{uuid.uuid4().hex}"
    with exporter(otel_collector, kafka_settings, topic_prefix, instance):

        def complete(points: list[dict[str, Any]]) -> bool:
            mine = ours(points, instance)
            return any(p["name"] == "hw.power" and p["attributes"]["slurm.job.id"] == JOB
                       and p["attributes"]["gpu.index"] == 3 and p["value"] == 650.0 for p in mine) and \
                any(p["attributes"].get("slurm.job.id") == OTHER_JOB for p in mine)  # fmt: skip

        points = ours(otel_collector.wait_for(otel_collector.read_metrics, complete), instance)
        logs = ours(otel_collector.wait_for(
            otel_collector.read_logs, lambda ls: len(ours(ls, instance)) >= 4), instance)  # fmt: skip

        # The job ends: its series must stop being exported while job 1001's go on.
        ended_ns = time.time_ns()
        produce(
            kafka_settings,
            [(t[JOB_EVENTS.name], OTHER_JOB, encoded("JobEvent", job_event(OTHER_JOB, "ENDED")))],
        )

        def evicted(all_points: list[dict[str, Any]]) -> bool:
            mine = ours(all_points, instance)
            latest = max(
                (p["time_unix_nano"] for p in mine if p["attributes"].get("slurm.job.id") == JOB),
                default=0,
            )
            other = max(
                (
                    p["time_unix_nano"]
                    for p in mine
                    if p["attributes"].get("slurm.job.id") == OTHER_JOB
                ),
                default=0,
            )
            return latest > ended_ns + 1_500_000_000 and other < latest

        otel_collector.wait_for(otel_collector.read_metrics, evicted)

    # Names and units.
    names = {p["name"] for p in points}
    assert names >= EXPECTED_METRICS
    assert {"peerwatch.exporter.series.active", "peerwatch.exporter.discarded"} <= names
    units = {p["name"]: p["unit"] for p in points}
    assert (
        units["hw.power"] == "W" and units["hw.temperature"] == "Cel" and units["hw.energy"] == "J"
    )

    # Attributes and values of the straggler GPU: latest window's gauges, summed counters.
    power = point(points, "hw.power", JOB, 3)
    assert power["value"] == 650.0 and power["type"] == "gauge"
    assert power["attributes"] == {
        "host.name": NODE, "hw.id": f"GPU-{NODE}-0003", "hw.type": "gpu", "gpu.index": 3,
        "slurm.job.id": JOB, "slurm.user": "alice", "slurm.partition": "h100", "slurm.account": "llm",
    }  # fmt: skip
    assert power["resource"]["service.name"] == "peerwatch"
    # Per-GPU series did not overwrite each other.
    assert {g: point(points, "hw.power", JOB, g)["value"] for g in range(8)} == {
        g: 620.0 + 10 * g for g in range(8)
    }
    assert point(points, "peerwatch.gpu.sm_clock.ratio", JOB, 3)["value"] == 0.93
    assert point(points, "peerwatch.gpu.throttle.ratio", JOB, 3)["value"] == 0.25
    assert point(points, "peerwatch.straggler.score", JOB, 3)["value"] == 4.7
    assert point(points, "hw.temperature", JOB, 3)["value"] == 63.0
    assert point(points, "peerwatch.training.step.duration", JOB, 3)["value"] == 1.5
    energy = point(points, "hw.energy", JOB, 3)
    assert energy["value"] == 2500.0 and energy["type"] == "sum" and energy["monotonic"]
    assert point(points, "hw.errors", JOB, 3, **{"error.type": "nvlink"})["value"] == 2
    assert point(points, "hw.errors", JOB, 2, **{"error.type": "nvlink"})["value"] == 0
    gated = [p for p in points if p["name"] == "peerwatch.straggler.score"
             and p["attributes"]["gpu.index"] == 7]  # fmt: skip
    assert gated == [], "a gated window has no straggler score"

    # Events.
    by_name = {r["event_name"]: r for r in logs}
    assert set(by_name) == {"peerwatch.straggler.finding", "peerwatch.drain.recommendation",
                            "peerwatch.health.result", "peerwatch.drain.action"}  # fmt: skip
    finding = by_name["peerwatch.straggler.finding"]
    assert finding["severity_text"] == "WARN" and finding["severity_number"] == 13
    assert finding["time_unix_nano"] == FINDING["window_end_ms"] * 1_000_000
    assert finding["attributes"]["slurm.job.id"] == JOB and finding["attributes"]["gpu.index"] == 3
    assert finding["attributes"]["host.name"] == NODE
    assert finding["body"]["reason"] == FINDING["reason"]
    assert finding["body"]["features"][0]["z"] == -11.5
    rec = by_name["peerwatch.drain.recommendation"]
    assert rec["severity_text"] == "ERROR"
    assert rec["attributes"]["peerwatch.recommendation.action"] == "DRAIN"
    assert rec["attributes"]["gpu.indices"] == [3] and rec["attributes"]["slurm.job.ids"] == [JOB]
    assert "expires_ms" not in rec["body"]
    assert (
        by_name["peerwatch.drain.action"]["attributes"]["peerwatch.action.decision"] == "SHADOWED"
    )
    assert by_name["peerwatch.health.result"]["attributes"]["peerwatch.health.status"] == "OK"

    # The undecodable record went to the dead-letter topic with the reason.
    dead = read_deadletter(kafka_settings, t[DEADLETTER.name])
    assert len(dead) == 1 and dead[0].value() == b"\xc3\x01 not an avro record"
    headers = dict(dead[0].headers())
    assert headers["peerwatch.reason"].startswith(b"undecodable: ")
    assert headers["peerwatch.topic"] == t[JOB_WINDOWS.name].encode()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_collector_down_retries_then_drops_with_counters(protocol: str) -> None:
    """Nothing listens on the endpoint: exports fail after the SDK's retries within timeout_s,
    the batches are dropped and counted, and the event queue stays bounded (oldest dropped)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connection refused from here on
    config = ExportSettings(endpoint=f"http://127.0.0.1:{port}", protocol=protocol,
                        interval_s=60.0, timeout_s=1.0, max_queued_events=4, event_batch_size=2,
                        event_delay_s=60.0)  # fmt: skip
    sink = otlp_sink(config)
    sink.write("GpuWindow", gpu_window(JOB, NODE, 3, 1))
    for i in range(200):
        sink.write("StragglerFinding", {**FINDING, "finding_id": f"sf-{i}"})
    started = time.monotonic()
    assert sink.flush(10.0) is False
    sink.close()
    elapsed_s = time.monotonic() - started
    stats = sink.stats()
    assert stats["metric_exports_ok"] == 0 and stats["metric_exports_failed"] >= 1
    assert stats["metric_export_failed"] >= len(EXPECTED_METRICS)  # points of the failed batches
    assert stats["events_emitted"] == 200 and stats["events_exported"] == 0
    # Every event is accounted for: failed after retries, or dropped from the full queue (4).
    assert stats["event_export_failed"] >= 1 and sink.events_dropped_queue_full >= 1
    assert stats["event_export_failed"] + sink.events_dropped_queue_full == 200
    # Retries are bounded by timeout_s per export, so giving up is quick.
    assert elapsed_s < 30
