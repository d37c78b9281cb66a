"""The agent and the health hook against the real broker.

(a) Several agents (one per simulated node: FakeNvml with 8 GPUs, real XID watcher thread, real
Delivery and Avro codec) publish for a few seconds; every node's seq 0..N-1 arrives exactly once
and in order, and an injected XID arrives in a sample within one interval of its injection.
(b) ``peerwatch health prolog`` publishes a HealthCheckResult whose exit code matches the process's.
(c) With Kafka unreachable the health hook returns within its time bound and the result is spooled.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest
from confluent_kafka import Consumer, TopicPartition
from fakes import FakeGpu, FakeNvml

from peerwatch.cli import main
from peerwatch.clock import SystemClock
from peerwatch.commands import health as health_command
from peerwatch.kafka_config import consumer_config
from peerwatch.producers.agent import NodeAgent
from peerwatch.producers.delivery import Delivery, DeliverySettings
from peerwatch.producers.nvml.sampler import GpuSampler
from peerwatch.producers.nvml.xid import XidWatcher
from peerwatch.producers.spool import Spool
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import HEALTH, SAMPLES, TopicSpec, catalogue

NODES = [f"gpu{i:03d}" for i in range(4)]
INTERVAL_MS = 250
RUN_S = 3.0


def spec_of(prefix: str, base: TopicSpec) -> TopicSpec:
    return next(s for s in catalogue(prefix) if s.name == prefix + base.name)


def consume(settings: KafkaSettings, spec: TopicSpec, expected: int) -> list[Any]:
    consumer = Consumer(consumer_config(settings, group_id=f"check-{time.time_ns()}"))
    consumer.assign([TopicPartition(spec.name, p, 0) for p in range(spec.partitions)])
    out: list[Any] = []
    deadline = time.monotonic() + 30
    idle_since = time.monotonic()
    try:
        # Read until everything expected is in, then a little longer to catch duplicates.
        while time.monotonic() < deadline and (
            len(out) < expected or time.monotonic() - idle_since < 2
        ):
            msgs = consumer.consume(1000, timeout=0.5)
            if msgs:
                idle_since = time.monotonic()
            for m in msgs:
                assert m.error() is None, m.error()
                out.append(m)
    finally:
        consumer.close()
    return out


def test_agents_publish_contiguous_seq_and_prompt_xids(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    spec = spec_of(topic_prefix, SAMPLES)
    ensure_topics(kafka_settings, [spec])
    codec = AvroCodec("NodeGpuSample")
    clock = SystemClock()
    nvmls, agents, deliveries = {}, {}, {}
    for node in NODES:
        nvml = FakeNvml([FakeGpu.h100(i) for i in range(8)])
        nvml.nvmlInit()
        delivery = Delivery(kafka_settings, DeliverySettings(spool_dir=tmp_path / node)).start()
        agents[node] = NodeAgent(
            sampler=GpuSampler(nvml, node, INTERVAL_MS, clock),
            sink=delivery,
            encode=codec.encode,
            topic=spec.name,
            node=node,
            interval_ms=INTERVAL_MS,
            clock=clock,
            watcher_factory=lambda cb, n=nvml: XidWatcher(n, cb, clock, wait_timeout_ms=100),
        )
        nvmls[node], deliveries[node] = nvml, delivery
    threads = [threading.Thread(target=agents[n].run, name=f"agent-{n}") for n in NODES]
    for t in threads:
        t.start()
    try:
        time.sleep(RUN_S / 2)
        injected_ms = clock.now_ms()
        nvmls[NODES[2]].inject_xid(5, 79)
        time.sleep(RUN_S / 2)
    finally:
        for agent in agents.values():
            agent.stop()
        for t in threads:
            t.join(10)
    assert not any(t.is_alive() for t in threads)
    for delivery in deliveries.values():
        stats = delivery.close(timeout_s=20)
        assert stats.delivered == stats.sent and stats.spooled == 0, stats

    counts = {n: agents[n].stats.records for n in NODES}
    assert all(c >= RUN_S * 1000 / INTERVAL_MS - 2 for c in counts.values()), counts
    got = consume(kafka_settings, spec, sum(counts.values()))
    by_node: dict[str, list[dict[str, Any]]] = {n: [] for n in NODES}
    for m in got:
        record = codec.decode(m.value())
        assert m.key() == record["node"].encode()
        assert m.timestamp()[1] == record["ts_ms"]
        by_node[record["node"]].append(record)
    for node in NODES:
        records = by_node[node]
        assert [r["seq"] for r in records] == list(range(counts[node])), node
        assert len({r["agent_run_id"] for r in records}) == 1
        assert all(len(r["gpus"]) == 8 for r in records)
    xid_records = [r for n in NODES for r in by_node[n] if r["xids"]]
    assert len(xid_records) == 1
    (hit,) = xid_records
    assert hit["node"] == NODES[2]
    assert [(x["gpu_index"], x["xid"]) for x in hit["xids"]] == [(5, 79)]
    assert 0 <= hit["ts_ms"] - injected_ms < INTERVAL_MS
    # The XID sample is off the regular grid: it was published at once, not at the next tick.
    assert agents[NODES[2]].stats.xid_records == 1


def _health_env(
    monkeypatch: pytest.MonkeyPatch, bootstrap: str, prefix: str, spool: Path, nvml: FakeNvml
) -> None:
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", bootstrap)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("PEERWATCH_SPOOL_DIR", str(spool))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu042")
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setattr(health_command, "nvml_factory", lambda: nvml)


def _prolog(tmp_path: Path) -> list[str]:
    (tmp_path / "no-ib").mkdir(exist_ok=True)
    return ["health", "prolog", "--expected-gpus", "8", "--ib-sysfs-root", str(tmp_path / "no-ib")]


@pytest.mark.parametrize("pending_remap", [False, True], ids=["ok", "critical"])
def test_health_prolog_publishes_its_result(
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pending_remap: bool,
) -> None:
    spec = spec_of(topic_prefix, HEALTH)
    ensure_topics(kafka_settings, [spec])
    gpus = [FakeGpu.h100(i) for i in range(8)]
    if pending_remap:
        gpus[6].remapped_rows = (0, 1, 1, 0)
    nvml = FakeNvml(gpus)
    _health_env(monkeypatch, kafka_settings.bootstrap_servers, topic_prefix, tmp_path / "s", nvml)
    t0 = time.monotonic()
    code = main(_prolog(tmp_path))
    assert time.monotonic() - t0 < 10
    assert code == (2 if pending_remap else 0)
    (msg,) = consume(kafka_settings, spec, 1)
    record = AvroCodec("HealthCheckResult").decode(msg.value())
    assert msg.key() == b"gpu042"
    assert (record["node"], record["job_id"], record["phase"]) == ("gpu042", "777", "PROLOG")
    assert record["exit_code"] == code
    assert record["status"] == ("CRITICAL" if pending_remap else "OK")
    assert nvml.count("nvmlShutdown") == 1
    assert len(Spool(tmp_path / "s" / "health")) == 0


def test_health_with_kafka_down_returns_in_time_and_spools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ecc = {(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 1}
    nvml = FakeNvml([FakeGpu.h100(i, ecc=ecc if i == 2 else {}) for i in range(8)])
    _health_env(monkeypatch, "127.0.0.1:1", "down.", tmp_path / "s", nvml)
    t0 = time.monotonic()
    code = main([*_prolog(tmp_path), "--kafka-timeout-s", "3"])
    elapsed_s = time.monotonic() - t0
    assert code == 2
    # Bounded by --kafka-timeout-s, not by librdkafka's own minutes-long retries (a loaded
    # machine's margin: the check itself takes well under a second).
    assert elapsed_s < 3 + 20, f"health took {elapsed_s:.1f} s with Kafka down"
    assert "published=spooled" in capsys.readouterr().out
    spool = Spool(tmp_path / "s" / "health")
    (rec,) = spool.peek(10)
    assert rec.topic == "down." + HEALTH.name and rec.key == b"gpu042"
    record = AvroCodec("HealthCheckResult").decode(rec.value)
    assert (record["status"], record["exit_code"], record["job_id"]) == ("CRITICAL", 2, "777")


def test_health_replays_an_earlier_runs_spooled_result_before_it_exits(
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 40 item 1: a result spooled while the broker was unreachable (a wrong port) is
    delivered by the next run, which ends with an empty spool and both results on the topic,
    oldest first, each once (the checks take no time here: no broker probe happens meanwhile)."""
    spec = spec_of(topic_prefix, HEALTH)
    ensure_topics(kafka_settings, [spec])
    nvml = FakeNvml([FakeGpu.h100(i) for i in range(8)])
    _health_env(monkeypatch, "127.0.0.1:1", topic_prefix, tmp_path / "s", nvml)
    monkeypatch.setenv("SLURM_JOB_ID", "801")
    assert main([*_prolog(tmp_path), "--kafka-timeout-s", "2"]) == 0
    assert "published=spooled" in capsys.readouterr().out
    assert len(Spool(tmp_path / "s" / "health")) == 1

    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("SLURM_JOB_ID", "802")
    assert main(_prolog(tmp_path)) == 0
    assert "published=delivered" in capsys.readouterr().out
    assert len(Spool(tmp_path / "s" / "health")) == 0
    got = [
        AvroCodec("HealthCheckResult").decode(m.value()) for m in consume(kafka_settings, spec, 2)
    ]
    assert [r["job_id"] for r in got] == ["801", "802"]


def test_health_names_a_missing_topic_and_how_to_create_it(
    kafka_settings: KafkaSettings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 40 item 7: with the broker up and the topic not created, the log says so (not
    "Kafka unavailable (Local: Purged in queue)") and the result waits in the spool."""
    prefix = f"missing{time.time_ns()}."
    nvml = FakeNvml([FakeGpu.h100(i) for i in range(8)])
    _health_env(monkeypatch, kafka_settings.bootstrap_servers, prefix, tmp_path / "s", nvml)
    assert main([*_prolog(tmp_path), "--kafka-timeout-s", "3"]) == 0
    text = caplog.text
    assert f"topic {prefix}{HEALTH.name} does not exist" in text
    assert "peerwatch topics create" in text
    assert "Purged in queue" not in text and "Kafka unavailable" not in text
    assert len(Spool(tmp_path / "s" / "health")) == 1
