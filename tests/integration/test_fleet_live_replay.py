"""Live = replay for fleet context (issue 37 items 2 and 3; DETECTION.md item 12).

A 32-node fleet (12 samples partitions; three of them hold no node) with a cooling event and then a fleet-wide power cap,
a small job (4 GPUs: no peers, judged against its own past and the fleet's clock ratio), a
node whose agent stops for 90 s and an XID 79 (a hard fault), published fast through the real
broker to one real worker (``peerwatch stream``) while the archiver (``peerwatch archive``)
keeps the topics; then ``peerwatch replay --archive`` replays the archive. The worker's findings
and recommendations must be byte for byte (the Avro bytes of each record, sorted):

- the offline pipeline's on the same records as the worker reads them, all of them;
- the archive replay's, on every window the worker closed (replay closes the last open
  windows at the end of its range, the worker waits for later samples: outputs of windows
  ending after the last sample time - lateness are left out, as in test_replay). In particular the cooling
event and the power cap are ONE ``FLEET_WIDE`` finding each (before, the worker published one per
samples partition that held busy GPUs, each counting only its own GPUs), and the silent node's
SILENT and CLEARED carry the same times (before, the worker checked on its own clock). Findings
have no wall-clock field (``detected_ms`` is event time), so nothing is masked.

The replay's JSON lines are encoded again with the same Avro schemas (JSON keeps a double
exactly). As in test_stream_app, the offline pipeline is fed without ``finish()``.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings, Settings
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings
from peerwatch.streams.live.hot_stage import samples_partition
from peerwatch.streams.tools.bench_run import produce_raw, read_topic
from peerwatch.topics import NODE_PARTITIONS, RECOMMENDATIONS, STRAGGLERS

from .archive_helpers import peerwatch_env, run, start
from .test_replay import stop
from .test_stream_app import (
    INTERVAL_S,
    LATENESS_S,
    WINDOW_S,
    Scenario,
    fresh_topics,
    new_worker,
    run_until_stable,
)

pytestmark = pytest.mark.timeout(900)
DURATION_S = 300
#: A node of job 3001 whose agent stops for 90 s (a SILENT finding, then its CLEARED).
SILENT_NODE = "gpu00005"


def scenario_doc(start_ms: int) -> dict[str, Any]:
    return {
        "fleet": {"nodes": 32, "gpus_per_node": 8, "interval_s": INTERVAL_S,
                  "duration_s": DURATION_S, "seed": 11, "start_ms": start_ms},
        "jobs": [
            {"job_id": "3001", "gpus": 128, "first_node": 0, "warmup_s": 0, "duration_s": 7200},
            {"job_id": "3002", "gpus": 112, "first_node": 16, "warmup_s": 0, "duration_s": 7200},
            {"job_id": "3003", "gpus": 4, "first_node": 30, "warmup_s": 0, "duration_s": 7200},
        ],
        "faults": [
            {"name": "xid", "node": "gpu00020", "gpu_index": 3, "start_s": 250,
             "params": {"xid": 79}},
            {"name": "agent_silent", "node": SILENT_NODE, "start_s": 100, "end_s": 190},
        ],
        "confounders": [
            {"name": "cluster_cooling", "start_s": 60, "end_s": 120,
             "params": {"clock_drop_pct": 6}},
            {"name": "cluster_power_cap", "start_s": 170, "end_s": 240,
             "params": {"limit_w": 450}},
        ],
    }  # fmt: skip


def offline_bytes(sc: Scenario) -> tuple[list[bytes], list[bytes]]:
    """The offline pipeline's findings and recommendations on the same records as the worker
    reads them (decoded from their Avro bytes: Avro floats are single precision), Avro-encoded
    as the worker publishes them (fed without ``finish()``: the live closing rule)."""
    pipeline = Pipeline(
        Settings(
            detector=DetectorSettings(window_s=WINDOW_S),
            stream=StreamSettings(lateness_s=LATENESS_S, fan_out_job_wide=True),
        )
    )
    codecs = {
        FINDING: AvroCodec("StragglerFinding"),
        RECOMMENDATION: AvroCodec("DrainRecommendation"),
    }
    out: dict[str, list[bytes]] = {FINDING: [], RECOMMENDATION: []}
    inputs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
    for _, stream, key, value in sc.records:
        read = inputs[stream].decode(inputs[stream].encode(value))
        for o in pipeline.feed(stream, key, read):
            if o.kind in codecs:
                out[o.kind].append(codecs[o.kind].encode(o.value))
    return sorted(out[FINDING]), sorted(out[RECOMMENDATION])


def test_live_fleet_findings_are_the_replays_byte_for_byte(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    now_ms = int(time.time() * 1000) - (DURATION_S + 60) * 1000
    start_ms = now_ms - now_ms % (WINDOW_S * 1000)
    fleet = Fleet(parse_scenario(scenario_doc(start_ms)))
    sc = Scenario(fleet, start_ms)
    for tick, recs in fleet.timed_ticks():
        sc.records += [(tick, r.stream, r.key, r.value) for r in recs]
    want_findings, want_recs = offline_bytes(sc)
    codec = AvroCodec("StragglerFinding")
    fleet_wide = [codec.decode(b) for b in want_findings]
    fleet_wide = [f for f in fleet_wide if f["status"] == "FLEET_WIDE"]
    assert sorted(f["cause"] for f in fleet_wide) == ["POWER", "THERMAL"]  # the scenario works
    assert all(f["windows_considered"] > 200 for f in fleet_wide)  # the whole fleet's GPUs
    silent = [(f["status"], f["node"]) for f in (codec.decode(b) for b in want_findings)
              if f["cause"] == "NO_SAMPLES"]  # fmt: skip
    assert silent == [("SILENT", SILENT_NODE), ("CLEARED", SILENT_NODE)] or sorted(silent) == [
        ("CLEARED", SILENT_NODE), ("SILENT", SILENT_NODE)]  # fmt: skip

    # some samples partitions hold no node: neither fleet nor silence may wait for them
    held = {samples_partition(f"gpu{i:05d}", NODE_PARTITIONS) for i in range(32)}
    assert len(held) < NODE_PARTITIONS
    prefix = fresh_topics(kafka_settings)
    app = f"app-{uuid.uuid4().hex[:6]}"
    root = tmp_path / "archive"
    env = peerwatch_env(kafka_settings, prefix)
    archiver = start(["archive", "--dir", str(root), "--group-id", f"{prefix}archive",
                      "--flush-interval-s", "0.5"], env, tmp_path / "archive.log")  # fmt: skip
    try:
        with new_worker(kafka_settings, prefix, tmp_path, "fleet", app) as worker:
            produce_raw(kafka_settings, sc.raw(prefix))
            counters = run_until_stable(worker, kafka_settings, prefix, sc.node_records).counters
            log = worker.log_tail()
        time.sleep(3)  # the archiver's flush interval, several times over
    finally:
        stop(archiver)
    got_findings = sorted(r.value for r in read_topic(kafka_settings, prefix + STRAGGLERS.name))
    got_recs = sorted(r.value for r in read_topic(kafka_settings, prefix + RECOMMENDATIONS.name))
    live = [codec.decode(b) for b in got_findings]
    assert [f["cause"] for f in live if f["status"] == "FLEET_WIDE"].count("POWER") == 1, live
    if got_findings != want_findings:  # what differs, readable
        only_live = [codec.decode(b) for b in got_findings if b not in want_findings]
        only_replay = [codec.decode(b) for b in want_findings if b not in got_findings]
        pytest.fail(f"live only: {only_live}\nreplay only: {only_replay}\n{counters}\n{log}")
    assert got_recs == want_recs

    # The archive, replayed: the same bytes on every window the worker closed.
    out = tmp_path / "replay.jsonl"
    span = ["--from", str(start_ms), "--to", str(start_ms + DURATION_S * 1000)]
    run(["replay", "--archive", str(root), *span, "--window-s", str(WINDOW_S), "--lateness-s",
         str(LATENESS_S), "--no-progress", "--findings", str(out)], env)  # fmt: skip
    last_sample_ms = max(v["ts_ms"] for _, stream, _, v in sc.records if stream == "samples")
    bound = last_sample_ms - int(LATENESS_S * 1000)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    rec_codec = AvroCodec("DrainRecommendation")
    replayed = sorted(codec.encode(_record(x)) for x in lines
                      if x["kind"] == "finding" and x["window_end_ms"] <= bound)  # fmt: skip
    replayed_recs = sorted(rec_codec.encode(_record(x)) for x in lines
                           if x["kind"] == "recommendation" and x["ts_ms"] <= bound)  # fmt: skip
    assert replayed == got_findings
    assert replayed_recs == got_recs


def _record(line: dict[str, Any]) -> dict[str, Any]:
    """A replay output line without its ``kind``: the record."""
    return {k: v for k, v in line.items() if k != "kind"}
