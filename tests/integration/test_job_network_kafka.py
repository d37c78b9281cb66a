"""The network line of ``peerwatch job`` read from a real broker: the NIC samples of the node the
stream named are read from the partition its key lands in, folded per port as they arrive, and
give the port's seconds down; other nodes' samples are not folded. The same records in an archive
give the same line.

The records are what the pipeline publishes (a job's STARTED event, LinkWatch's HARD_ERROR finding
and the policy's DRAIN recommendation naming the port) beside the simulator's NIC samples of a
port down for 12 s; expected values come from those samples (the counter arithmetic's downtime
over them), never from constants.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from peerwatch.io.archive.writer import AvroFileSink
from peerwatch.producers.nic.counters import downtime
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import codec_for
from peerwatch.settings import KafkaSettings
from peerwatch.streams.offline.job_records import archive_job_records, kafka_job_records
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import (
    JOB_EVENTS,
    NIC_SAMPLES,
    RECOMMENDATIONS,
    STRAGGLERS,
    TopicSpec,
    catalogue,
)
from tests.integration.archive_helpers import peerwatch_env, produce, run

JOB, NODE, PORT = "8101", "gpu00002", "mlx5_1/1"


def records(start_ms: int) -> list[tuple[TopicSpec, str, dict[str, Any]]]:
    doc = {
        "fleet": {"nodes": 4, "gpus_per_node": 8, "interval_s": 1.0, "duration_s": 60,
                  "seed": 9, "start_ms": start_ms, "nics_per_node": 2},
        "jobs": [{"job_id": JOB, "gpus": 32, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "faults": [{"name": "nic_port_down", "node": NODE, "start_s": 20, "end_s": 32,
                    "params": {"port": 1}}],
    }  # fmt: skip
    out: list[tuple[TopicSpec, str, dict[str, Any]]] = []
    for _, recs in Fleet(parse_scenario(doc)).timed_ticks():
        for r in recs:
            if r.stream == "nic-samples":
                out.append((NIC_SAMPLES, r.key, r.value))
            elif r.stream == "job-events":
                out.append((JOB_EVENTS, r.key, r.value))
    t = start_ms + 29_000
    finding = {
        "finding_id": "link-1", "job_id": JOB, "node": NODE, "gpu_index": None, "gpu_uuid": None,
        "status": "HARD_ERROR", "window_start_ms": t - t % 10_000,
        "window_end_ms": t - t % 10_000 + 10_000, "features": [],
        "hard_rules": ["port_down", "link_downed"], "windows_flagged": 1,
        "windows_considered": 1, "first_flagged_ms": t, "peer_group_size": 1,
        "reason": f"link {PORT}: port_down, link_downed", "cause": "NETWORK", "detected_ms": t,
        "port": PORT, "switch": None,
    }  # fmt: skip
    rec = {
        "recommendation_id": "rec-1", "node": NODE, "ts_ms": t, "action": "DRAIN",
        "severity": "CRITICAL", "hard": True, "reason": f"link {PORT}: port_down",
        "gpu_indices": [], "job_ids": [JOB], "partition": "gpu", "evidence": [],
        "expires_ms": t + 3_600_000, "cause": "NETWORK", "port": PORT,
    }  # fmt: skip
    return [*out, (STRAGGLERS, JOB, finding), (RECOMMENDATIONS, NODE, rec)]


def expected_down_s(recs: list[tuple[TopicSpec, str, dict[str, Any]]]) -> float:
    states = [(v["ts_ms"], p["up"]) for spec, _, v in recs if spec is NIC_SAMPLES
              and v["node"] == NODE for p in v["ports"] if p["name"] == PORT]  # fmt: skip
    return downtime(states, states[0][0] + 1, states[-1][0] + 1, 2000).down_s


def test_the_network_line_reads_the_named_ports_samples_from_kafka_and_the_archive(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    now_ms = int(time.time() * 1000) - 120_000
    recs = records(now_ms - now_ms % 1000)
    codecs = {spec.name: codec_for(str(spec.value_schema)) for spec, _, _ in recs}
    produce(kafka_settings, [
        (topic_prefix + spec.name, key.encode(), codecs[spec.name].encode(value),
         int(value.get("ts_ms") or value.get("detected_ms")))
        for spec, key, value in recs
    ])  # fmt: skip
    down_s = expected_down_s(recs)
    assert 11.0 <= down_s <= 13.0

    from_kafka = kafka_job_records(kafka_settings, JOB, topic_prefix)
    assert set(from_kafka.nic_ports) == {(NODE, "mlx5_0/1"), (NODE, PORT)}  # the named node only
    assert from_kafka.nic_ports[(NODE, PORT)].down_s == down_s

    archive = tmp_path / "archive"
    sink = AvroFileSink(archive, {spec.name: str(spec.value_schema) for spec, _, _ in recs})
    for spec, _, value in recs:
        sink.write(spec.name, value, int(value.get("ts_ms") or value.get("detected_ms")))
    sink.close()
    from_archive = archive_job_records(archive, JOB)
    assert from_archive.nic_ports.keys() == from_kafka.nic_ports.keys()
    assert from_archive.nic_ports[(NODE, PORT)] == from_kafka.nic_ports[(NODE, PORT)]

    # The command end to end: the network line in --json and in the verdict.
    summary = json.loads(run(["job", JOB, "--json"], peerwatch_env(kafka_settings, topic_prefix)))
    [line] = summary["network"]
    assert (line["node"], line["port"], line["action"], line["down_s"]) == (NODE, PORT, "DRAIN",
                                                                              down_s)  # fmt: skip
    assert f"network: {NODE} {PORT}: HARD_ERROR (link_downed, port_down)" in summary["verdict"]
