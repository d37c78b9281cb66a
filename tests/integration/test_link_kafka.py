"""A NIC port down on an allocated node, through a real broker and a ``peerwatch stream`` worker
(subprocess), and the same records replayed from the broker (issue 38 item 3, issue 37).

The node's NIC samples (``peerwatch.nic.samples``) are published tick by tick with its GPU
samples, up to the tick that shows the port down for longer than ``network.port_down_s`` (7 s),
and nothing after it: no window can close, so every finding must come from the sample itself
(the hot stage's :class:`~peerwatch.streams.core.network_stage.NetworkStage`). The worker must
publish a DRAIN recommendation naming node and port, and the port_down finding. The offline
pipeline on the same records, and a replay of the broker's topics
(:func:`~peerwatch.streams.offline.replay_kafka.kafka_records`, which now reads the NIC topic),
must give the same link findings and recommendations byte for byte (live = replay). An undecodable NIC record is dead-lettered with its reason. The time
from publishing the sample passing 7 s to the port_down finding on the topic is printed (a
measurement, not an assert).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings, Settings
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings
from peerwatch.streams.offline.replay import TimeRange
from peerwatch.streams.offline.replay_kafka import kafka_records
from peerwatch.streams.tools.bench_run import produce_raw, read_topic, wait_stable
from peerwatch.topics import DEADLETTER, NIC_SAMPLES, RECOMMENDATIONS, STRAGGLERS
from tests.integration.test_hard_silence_kafka import BOUND_S, build, decoded
from tests.integration.test_stream_app import LATENESS_S, WINDOW_S, fresh_topics, new_worker

NODE, PORT = "gpu00001", "mlx5_1/1"
CODECS = {FINDING: AvroCodec("StragglerFinding"), RECOMMENDATION: AvroCodec("DrainRecommendation")}


def offline(records: list[tuple[str, str, dict[str, Any]]]) -> dict[str, list[bytes]]:
    """The offline pipeline's link findings (those naming a port) and recommendations, Avro
    bytes sorted; fed without ``finish()`` (the live closing rule), the worker's settings."""
    pipeline = Pipeline(Settings(detector=DetectorSettings(window_s=WINDOW_S),
                                 stream=StreamSettings(lateness_s=LATENESS_S,
                                                       fan_out_job_wide=True)))  # fmt: skip
    out: dict[str, list[bytes]] = {FINDING: [], RECOMMENDATION: []}
    for stream, key, value in records:
        for o in pipeline.feed(stream, key, value):
            if o.kind == RECOMMENDATION or (o.kind == FINDING and o.value.get("port")):
                out[o.kind].append(CODECS[o.kind].encode(o.value))
    return {k: sorted(v) for k, v in out.items()}


def test_a_port_down_10_s_is_drained_live_and_replay_says_the_same(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    doc = {
        "fleet": {"nodes": 4, "gpus_per_node": 8, "seed": 31, "nics_per_node": 2,
                  "nodes_per_leaf": 4},
        "jobs": [{"job_id": "4101", "gpus": 32, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "faults": [{"name": "nic_port_down", "node": 1, "start_s": 40, "end_s": 50,
                    "params": {"port": 1}}],
    }  # fmt: skip
    sc = build(doc, 60)
    down_ms = sc.start_ms + 40_000
    nic = AvroCodec("NodeNicSample")
    # the first tick whose NIC sample shows the port down for longer than 7 s
    passing_ms = min(
        t for t, s, k, v in sc.records
        if s == "nic-samples" and k == NODE and t > down_ms + 7000
        and any(p["name"] == PORT and not p["up"] for p in v["ports"])
    )  # fmt: skip
    records = [(s, k, v) for t, s, k, v in sc.records if t <= passing_ms]
    want = offline([(s, k, nic.decode(nic.encode(v)) if s == "nic-samples" else v)
                    for s, k, v in records])  # fmt: skip
    assert want[RECOMMENDATION] and want[FINDING]  # the scenario works offline

    prefix = fresh_topics(kafka_settings)
    with new_worker(kafka_settings, prefix, tmp_path, "link", f"app-{uuid.uuid4().hex[:6]}") as w:
        # hostile: an undecodable NIC record first (dead-lettered, the rest read as usual)
        produce_raw(kafka_settings, [(prefix + NIC_SAMPLES.name, b"gpu00002", b"\x00junk", None)])
        produce_raw(kafka_settings, sc.raw(prefix, until_ms=down_ms))
        before = sum(s == "samples" and t < down_ms for t, s, _, _ in sc.records)
        state = wait_stable(lambda: int(w.counters().get("samples", 0)),
                            lambda n: n >= before, 120, settle_s=1)  # fmt: skip
        assert state >= before, w.log_tail()
        down_published_ms = time.time() * 1000  # the ticks that show the port down, to 7 s
        produce_raw(kafka_settings, sc.raw(prefix, since_ms=down_ms, until_ms=passing_ms))
        wait_stable(lambda: int(w.counters().get("samples", 0)),
                    lambda n: n >= before + 4 * ((passing_ms - down_ms) // 2000), 60, settle_s=1)  # fmt: skip
        published_ms = time.time() * 1000  # the tick passing 7 s
        produce_raw(kafka_settings, sc.raw(prefix, since_ms=passing_ms, until_ms=passing_ms + 1))

        def link_findings() -> list[tuple[dict[str, Any], int]]:
            assert w.alive(), w.log_tail()
            return [(f, ts) for f, ts in decoded(kafka_settings, prefix + STRAGGLERS.name)
                    if f.get("port")]  # fmt: skip

        got = wait_stable(link_findings,
                          lambda fs: any(f["hard_rules"] == ["port_down"] for f, _ in fs),
                          BOUND_S, settle_s=2)  # fmt: skip
        recs = decoded(kafka_settings, prefix + RECOMMENDATIONS.name)
        dead = read_topic(kafka_settings, prefix + DEADLETTER.name)
        log, counters = w.log_tail(), w.counters()
    assert [(f["node"], f["port"], f["hard_rules"], f["cause"]) for f, _ in got] == [
        (NODE, PORT, ["link_downed"], "NETWORK"), (NODE, PORT, ["port_down"], "NETWORK")
    ], (counters, log)  # fmt: skip
    assert [(r.key, r.value, r.headers["peerwatch.reason"]) for r in dead] == [
        (b"gpu00002", b"\x00junk", b"undecodable")
    ]
    (down,) = [(f, ts) for f, ts in got if f["hard_rules"] == ["port_down"]]
    assert down[0]["detected_ms"] == passing_ms  # from the sample that shows it
    drains = [r for r, _ in recs if r["action"] == "DRAIN"]
    assert [(r["node"], r["port"], r["cause"], r["job_ids"]) for r in drains] == [
        (NODE, PORT, "NETWORK", ["4101"])
    ]
    (drain_ts,) = [ts for r, ts in recs if r["action"] == "DRAIN"]
    print(
        f"sample passing 7 s published -> port_down finding {down[1] - published_ms:.0f} ms; "
        f"first down samples published -> DRAIN {drain_ts - down_published_ms:.0f} ms"
    )

    # live = offline pipeline on the same records, byte for byte
    live = {
        FINDING: sorted(CODECS[FINDING].encode(f) for f, _ in got),
        RECOMMENDATION: sorted(CODECS[RECOMMENDATION].encode(r) for r, _ in recs),
    }
    assert live == want
    # live = replay of the broker's topics (the NIC topic is a replay input; the junk record
    # skipped and counted there too)
    span = TimeRange(sc.start_ms, passing_ms + 1)
    replayed, bad = kafka_records(kafka_settings, span, prefix)
    assert bad == 1 and sum(s == "nic-samples" for s, _, _ in replayed) == sum(
        s == "nic-samples" for s, _, _ in records
    )
    assert offline(replayed) == want
