"""Node clock offsets through a real broker and a ``peerwatch stream`` worker (subprocess).

Six nodes publish, one tick at a time in real time; gpu00001's clock runs 2.5 s ahead and gpu00004's 1.8 s
behind (the simulator's ``clock_skew`` shifts their ``ts_ms`` only). The worker estimates each
node's offset from the fleet's median clock (sample times against the times it received batches
read at the head of their partitions), writes it to its counters (exported as the gauge
``peerwatch.node.clock_offset`` per node) and logs each node past ``clock_skew_warn_s``.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

from peerwatch.settings import KafkaSettings
from peerwatch.streams.tools.bench_run import produce_raw, wait_stable
from tests.integration.test_hard_silence_kafka import build
from tests.integration.test_stream_app import fresh_topics, new_worker

#: The sample-to-receipt delays of a loaded test machine stay well within this (ms).
TOLERANCE_MS = 600
SKEWS_MS = {"gpu00001": 2500, "gpu00004": -1800}


def test_skewed_node_clocks_are_estimated_and_reported(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    doc = {
        "fleet": {"nodes": 6, "gpus_per_node": 8, "seed": 23},
        "jobs": [{"job_id": "4003", "gpus": 48, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "confounders": [
            {"name": "clock_skew", "node": 1, "start_s": 0, "params": {"offset_ms": 2500}},
            {"name": "clock_skew", "node": 4, "start_s": 0, "params": {"offset_ms": -1800}},
        ],
    }  # fmt: skip
    sc = build(doc, 40)
    prefix = fresh_topics(kafka_settings)
    ticks = sorted({t for t, _, _, _ in sc.records})  # one every 2 s
    with new_worker(kafka_settings, prefix, tmp_path, "clocks", f"app-{uuid.uuid4().hex[:6]}") as w:
        produce_raw(kafka_settings, sc.raw(prefix, until_ms=ticks[5]))
        started = wait_stable(lambda: int(w.counters().get("samples", 0)), bool, 120, settle_s=1)
        assert started, w.log_tail()
        # One tick at a time, in real time (the estimate assumes producers publish as they
        # sample): the worker reads each at the head of its partition.
        wall0, tick0 = time.monotonic(), ticks[5]
        for t in ticks[5:]:
            time.sleep(max(0.0, wall0 + (t - tick0) / 1000 - time.monotonic()))
            produce_raw(kafka_settings, sc.raw(prefix, since_ms=t, until_ms=t + 1))

        def offsets() -> dict[str, int]:
            assert w.alive(), w.log_tail()
            return dict(w.counters().get("clock_offsets_ms") or {})

        got = wait_stable(offsets, lambda o: len(o) == 6, 60, settle_s=3)
        counters, log = w.counters(), w.log_tail(20_000)
    print(f"estimated clock offsets (ms): {dict(sorted(got.items()))}")
    assert sorted(got) == [f"gpu{i:05d}" for i in range(6)], (counters, log)
    for node, value in got.items():
        assert abs(value - SKEWS_MS.get(node, 0)) <= TOLERANCE_MS, (got, log)
    assert counters["clock_skewed_nodes"] == 2, counters
    for node, skew_ms in SKEWS_MS.items():  # logged with the estimate, to a tenth of a second
        logged = re.findall(rf"node {node}: its clock runs ([+-]\d+\.\d) s", log)
        assert logged and abs(float(logged[-1]) * 1000 - skew_ms) <= TOLERANCE_MS + 50, log
