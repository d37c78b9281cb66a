"""A node whose link degrades inside a 32-node job, named with cause NETWORK by a real
``peerwatch stream`` worker (subprocess) on a real broker, by a replay of the broker's topics and
by ``peerwatch replay --archive`` over what the archiver kept (issue 38 item 4, the live wiring
of the network comparison).

The simulator's 32-node job (256 GPUs, 2 InfiniBand ports a node) trains normally for 60 s, then
node gpu00017's NIC retransmits on ``mlx5_0/1``: every rank waits on it, SM activity falls job-wide
and the GPU detector names nobody (every GPU slows alike). The worker's hot stage summarises each
node's ports per closed window and sends them, as ``network`` messages on the window-batches
topic, ahead of the job's window batches; stage 3 opens the gate (the job slowed against its own
recent past) and names the node and port. The ticks are published a few at a time behind the
first minute, as agents publish them, so each window's NIC samples are read before the samples
that close it. The offline pipeline over the same records, over the broker's topics read back
(:func:`~peerwatch.streams.offline.replay_kafka.kafka_records`) and ``peerwatch replay --archive``
(the split replay: the NIC samples and the comparison in its stages process) must name the same
node and port with the same finding bytes (live = replay).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings, Settings
from peerwatch.streams.core.pipeline import FINDING, Pipeline
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings
from peerwatch.streams.offline.replay import TimeRange
from peerwatch.streams.offline.replay_kafka import kafka_records
from peerwatch.streams.tools.bench_run import produce_raw, wait_stable
from peerwatch.topics import STRAGGLERS
from tests.integration.archive_helpers import peerwatch_env, run, start
from tests.integration.test_hard_silence_kafka import build, decoded
from tests.integration.test_replay import stop
from tests.integration.test_stream_app import (
    INTERVAL_S,
    LATENESS_S,
    RUN_TIMEOUT_S,
    WINDOW_S,
    fresh_topics,
    new_worker,
)

NODE, PORT, ONSET_S, DURATION_S = "gpu00017", "mlx5_0/1", 60, 130
CODEC = AvroCodec("StragglerFinding")


def offline(records: list[tuple[str, str, dict[str, Any]]]) -> list[bytes]:
    """The offline pipeline's NETWORK findings (Avro bytes, sorted), fed without ``finish()``
    (the live closing rule), with the worker's settings."""
    pipeline = Pipeline(Settings(detector=DetectorSettings(window_s=WINDOW_S),
                                 stream=StreamSettings(lateness_s=LATENESS_S,
                                                       fan_out_job_wide=True)))  # fmt: skip
    out = []
    for stream, key, value in records:
        out += [CODEC.encode(o.value) for o in pipeline.feed(stream, key, value)
                if o.kind == FINDING and o.value["cause"] == "NETWORK"]  # fmt: skip
    return sorted(out)


def test_a_degraded_link_in_a_32_node_job_is_named_live_and_replay_says_the_same(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    doc = {
        "fleet": {"nodes": 32, "gpus_per_node": 8, "seed": 38, "nics_per_node": 2,
                  "nodes_per_leaf": 8},
        "jobs": [{"job_id": "3801", "gpus": 256, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "faults": [{"name": "nic_retransmit", "node": 17, "start_s": ONSET_S,
                    "params": {"port": 0}}],
    }  # fmt: skip
    sc = build(doc, DURATION_S)
    onset_ms = sc.start_ms + ONSET_S * 1000
    nic = AvroCodec("NodeNicSample")
    records = [(s, k, nic.decode(nic.encode(v)) if s == "nic-samples" else v)
               for _, s, k, v in sc.records]  # fmt: skip
    want = offline(records)
    named = [CODEC.decode(f) for f in want]
    assert [(f["node"], f["port"], f["status"]) for f in named] == [(NODE, PORT, "CONFIRMED")]
    assert named[0]["detected_ms"] - onset_ms <= 15_000

    prefix = fresh_topics(kafka_settings)
    root, env = tmp_path / "archive", peerwatch_env(kafka_settings, prefix)
    archiver = start(["archive", "--dir", str(root), "--group-id", f"{prefix}archive",
                      "--flush-interval-s", "0.5"], env, tmp_path / "archive.log")  # fmt: skip
    try:
        live, log = run_worker(kafka_settings, prefix, tmp_path, sc)
        time.sleep(3)  # the archiver's flush interval, several times over
    finally:
        stop(archiver)
    assert [(f["node"], f["port"], f["status"], f["gpu_index"]) for f in live] == [
        (NODE, PORT, "CONFIRMED", None)
    ], log
    assert sorted(CODEC.encode(f) for f in live) == want  # live = offline, byte for byte
    # live = replay of the broker's topics
    span = TimeRange(sc.start_ms, sc.start_ms + DURATION_S * 1000)
    replayed, bad = kafka_records(kafka_settings, span, prefix)
    assert bad == 0
    assert offline(replayed) == want
    # live = the archive replayed (the split replay: NIC samples and comparison in its stages
    # process); replay closes the windows the worker left open, none names a link
    out = tmp_path / "replay.jsonl"
    run(["replay", "--archive", str(root), "--from", str(span.from_ms), "--to", str(span.to_ms),
         "--window-s", str(WINDOW_S), "--lateness-s", str(LATENESS_S), "--no-progress",
         "--findings", str(out)], env)  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    archived = sorted(CODEC.encode({k: v for k, v in x.items() if k != "kind"}) for x in lines
                      if x["kind"] == "finding" and x["cause"] == "NETWORK")  # fmt: skip
    assert archived == want


def run_worker(
    kafka_settings: KafkaSettings, prefix: str, tmp_path: Path, sc: Any
) -> tuple[list[dict[str, Any]], str]:
    """The scenario through a new worker, published as agents publish it: its NETWORK findings
    (once there is one and nothing more comes) and its log."""
    app = f"app-{uuid.uuid4().hex[:6]}"
    with new_worker(kafka_settings, prefix, tmp_path, "netpeers", app) as w:
        first = sc.start_ms + (ONSET_S - 20) * 1000
        produce_raw(kafka_settings, sc.raw(prefix, until_ms=first))
        before = sum(s == "samples" and t < first for t, s, _, _ in sc.records)
        got = wait_stable(lambda: int(w.counters().get("samples", 0)),
                          lambda n: n >= before, RUN_TIMEOUT_S, settle_s=1)  # fmt: skip
        assert got >= before, w.log_tail()
        step_ms = int(INTERVAL_S * 1000)
        for t in range(first, sc.start_ms + DURATION_S * 1000, step_ms):  # tick by tick
            produce_raw(kafka_settings, sc.raw(prefix, since_ms=t, until_ms=t + step_ms))
            time.sleep(0.05)

        def network() -> list[dict[str, Any]]:
            assert w.alive(), w.log_tail()
            return [f for f, _ in decoded(kafka_settings, prefix + STRAGGLERS.name)
                    if f["cause"] == "NETWORK"]  # fmt: skip

        live = wait_stable(network, lambda fs: bool(fs), RUN_TIMEOUT_S, settle_s=3)
        return live, w.log_tail()
