"""Hard faults on arrival and silent agents, through a real broker and a ``peerwatch stream``
worker (subprocess).

- An XID 48 on a busy GPU and a GPU turning LOST on an idle node: the input stops right after
  the sample that shows each, so no window can close; a DRAIN recommendation must still come
  (from the sample itself). The time from publishing that sample to the recommendation on the
  topic is printed (the benchmark measures it; no wall-clock assert here but a generous bound).
- An agent that stops while its node's GPUs are allocated: a SILENT finding (cause NO_SAMPLES)
  and an ALERT, in event time (the other nodes go on); when its samples return, CLEARED.
- A facility power cap over a whole Slurm partition: FLEET_WIDE findings of one episode from the
  hot stage's fleet watch, nobody blamed, CLEARED after the cap.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import decode_any
from peerwatch.settings import KafkaSettings
from peerwatch.streams.tools.bench_run import produce_raw, read_topic, wait_stable
from peerwatch.topics import RECOMMENDATIONS, STRAGGLERS
from tests.integration.test_stream_app import (
    INTERVAL_S,
    RUN_TIMEOUT_S,
    WINDOW_S,
    Scenario,
    fresh_topics,
    new_worker,
)

#: Generous: a worker needs ~10-20 s to start; a recommendation then takes well under a second.
BOUND_S = 60.0


def build(doc: dict[str, Any], duration_s: int) -> Scenario:
    now_ms = int(time.time() * 1000) - (duration_s + 60) * 1000
    start_ms = now_ms - now_ms % (WINDOW_S * 1000)
    doc["fleet"].update(start_ms=start_ms, duration_s=duration_s, interval_s=INTERVAL_S)
    fleet = Fleet(parse_scenario(doc))
    sc = Scenario(fleet, start_ms)
    for tick, recs in fleet.timed_ticks():
        sc.records += [(tick, r.stream, r.key, r.value) for r in recs]
    return sc


def decoded(kafka: KafkaSettings, topic: str) -> list[tuple[dict[str, Any], int]]:
    """(record, broker timestamp ms) of every record of ``topic`` (asked again while a new
    topic's partition leaders are still being elected)."""
    from confluent_kafka import KafkaException

    for attempt in range(10):
        try:
            return [(decode_any(r.value)[1], r.ts_ms) for r in read_topic(kafka, topic)]
        except KafkaException:
            if attempt == 9:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def samples_in(sc: Scenario, since_ms: int, until_ms: int) -> int:
    return sum(s == "samples" and since_ms <= t < until_ms for t, s, _, _ in sc.records)


def test_hard_faults_are_recommended_from_the_sample_that_shows_them(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    doc = {
        "fleet": {"nodes": 4, "gpus_per_node": 8, "seed": 21},
        "jobs": [{"job_id": "4001", "gpus": 16, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],  # nodes gpu00002-3 idle
        "faults": [
            {"name": "xid", "node": 0, "gpu_index": 3, "start_s": 41, "params": {"xid": 48}},
            {"name": "gpu_lost", "node": 3, "gpu_index": 5, "start_s": 41},
        ],
    }  # fmt: skip
    sc = build(doc, 60)
    fault_ms = sc.start_ms + 42_000  # the first tick after the onsets shows both
    prefix = fresh_topics(kafka_settings)
    with new_worker(kafka_settings, prefix, tmp_path, "hard", f"app-{uuid.uuid4().hex[:6]}") as w:
        produce_raw(kafka_settings, sc.raw(prefix, until_ms=fault_ms))
        before = samples_in(sc, sc.start_ms, fault_ms)
        state = wait_stable(lambda: int(w.counters().get("samples", 0)),
                            lambda n: n >= before, 120, settle_s=1)  # fmt: skip
        assert state >= before, w.log_tail()
        assert not decoded(kafka_settings, prefix + RECOMMENDATIONS.name)
        published_ms = time.time() * 1000
        # the fault's tick, and nothing after it: no window can close on these samples
        produce_raw(kafka_settings, sc.raw(prefix, since_ms=fault_ms, until_ms=fault_ms + 1))

        def drains() -> list[tuple[dict[str, Any], int]]:
            assert w.alive(), w.log_tail()
            recs = decoded(kafka_settings, prefix + RECOMMENDATIONS.name)
            return [(r, ts) for r, ts in recs if r["action"] == "DRAIN"]

        got = wait_stable(drains, lambda d: len(d) >= 2, BOUND_S, settle_s=2)
        findings = [f for f, _ in decoded(kafka_settings, prefix + STRAGGLERS.name)]
        log, counters = w.log_tail(), w.counters()
    by_node = {r["node"]: (r, ts) for r, ts in got}
    assert sorted(by_node) == ["gpu00000", "gpu00003"], (findings, counters, log)
    busy, idle = by_node["gpu00000"][0], by_node["gpu00003"][0]
    assert (busy["hard"], busy["gpu_indices"], busy["job_ids"], busy["cause"]) == (
        True, [3], ["4001"], "HARDWARE"
    )  # fmt: skip
    assert (idle["hard"], idle["gpu_indices"], idle["job_ids"]) == (True, [5], [])
    sample_ms = {f["node"]: f["detected_ms"] for f in findings if f["status"] == "HARD_ERROR"}
    assert busy["ts_ms"] == sample_ms["gpu00000"] and idle["ts_ms"] == sample_ms["gpu00003"]
    assert {f["job_id"] for f in findings} == {"4001", "idle:gpu00003"}
    for node, (_, ts) in sorted(by_node.items()):
        print(f"{node}: sample published -> DrainRecommendation {ts - published_ms:.0f} ms")
        assert ts - published_ms < BOUND_S * 1000


def test_a_stopped_agent_is_silent_and_its_return_clears_it(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    doc = {
        "fleet": {"nodes": 4, "gpus_per_node": 8, "seed": 22},
        "jobs": [{"job_id": "4002", "gpus": 32, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "faults": [{"name": "agent_silent", "node": 2, "start_s": 40, "end_s": 100}],
    }  # fmt: skip
    sc = build(doc, 130)
    back_ms = sc.start_ms + 100_000
    prefix = fresh_topics(kafka_settings)
    topic = prefix + STRAGGLERS.name

    def silence() -> list[tuple[str, str | None, str]]:
        assert w.alive(), w.log_tail()
        return [
            (f["status"], f["node"], f["cause"])
            for f, _ in decoded(kafka_settings, topic)
            if f["cause"] == "NO_SAMPLES"
        ]

    with new_worker(kafka_settings, prefix, tmp_path, "quiet", f"app-{uuid.uuid4().hex[:6]}") as w:
        # gpu00002 stops at 40 s; the others go on to 100 s: silent from 70 s of event time
        produce_raw(kafka_settings, sc.raw(prefix, until_ms=back_ms))
        found = wait_stable(silence, bool, BOUND_S + 60, settle_s=3)
        assert found == [("SILENT", "gpu00002", "NO_SAMPLES")], w.log_tail()
        (silent,) = [f for f, _ in decoded(kafka_settings, topic) if f["status"] == "SILENT"]
        # its last sample at 38 s, plus stream.silent_after_s (30 s)
        assert silent["job_id"] == "4002" and silent["detected_ms"] == sc.start_ms + 68_000
        recs = [r for r, _ in decoded(kafka_settings, prefix + RECOMMENDATIONS.name)]
        assert [(r["node"], r["action"], r["cause"]) for r in recs] == [
            ("gpu00002", "ALERT", "NO_SAMPLES")
        ]
        # its samples return
        produce_raw(kafka_settings, sc.raw(prefix, since_ms=back_ms))
        done = wait_stable(silence, lambda s: len(s) >= 2, BOUND_S, settle_s=3)
        assert done == [("SILENT", "gpu00002", "NO_SAMPLES"), ("CLEARED", "gpu00002", "NO_SAMPLES")]
        assert int(w.counters().get("samples", 0)) == samples_in(sc, sc.start_ms, 1 << 62)


def test_a_partition_wide_power_cap_is_one_fleet_finding_from_the_live_worker(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    """A facility power cap over every busy GPU, through a real broker and worker: stage 3's
    fleet watch (merging every samples partition's census) publishes ONE FLEET_WIDE finding
    (cause POWER, no GPU blamed, every busy GPU counted), and no straggler finding or drain;
    one CLEARED once the cap is lifted."""
    doc = {
        "fleet": {"nodes": 48, "gpus_per_node": 8, "seed": 23},
        "jobs": [{"job_id": "4003", "gpus": 384, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "confounders": [{"name": "cluster_power_cap", "start_s": 60, "end_s": 120,
                         "params": {"limit_w": 450}}],
    }  # fmt: skip
    sc = build(doc, 480)  # the episode clears after detector.clear_after_s (300 s) of no cap
    prefix = fresh_topics(kafka_settings)
    topic = prefix + STRAGGLERS.name

    def fleet() -> list[tuple[str, str, str]]:
        assert w.alive(), w.log_tail()
        return sorted(
            {(f["status"], f["finding_id"], f["cause"])
             for f, _ in decoded(kafka_settings, topic) if f["job_id"] == "fleet"}
        )  # fmt: skip

    with new_worker(kafka_settings, prefix, tmp_path, "fleet", f"app-{uuid.uuid4().hex[:6]}") as w:
        produce_raw(kafka_settings, sc.raw(prefix))
        found = wait_stable(fleet, lambda s: len(s) >= 2, RUN_TIMEOUT_S, settle_s=5)
        findings = [f for f, _ in decoded(kafka_settings, topic)]
        recs = [r for r, _ in decoded(kafka_settings, prefix + RECOMMENDATIONS.name)]
        log, counters = w.log_tail(), w.counters()
    print(f"fleet findings: {found}; published {counters['fleet_findings']}")
    statuses = [s for s, _, _ in found]
    assert statuses == ["CLEARED", "FLEET_WIDE"], (found, log)
    assert {c for _, _, c in found} == {"POWER"}
    shift = [f for f in findings if f["status"] == "FLEET_WIDE"]
    # one record for the whole fleet (DETECTION.md item 12), not one per samples partition
    assert len(shift) == 1 and counters["fleet_findings"] == 2  # FLEET_WIDE and CLEARED
    assert shift[0]["windows_considered"] > 300  # the whole job's GPUs, not a partition's
    assert all(f["node"] is None and f["gpu_index"] is None for f in shift)
    assert shift[0]["window_start_ms"] >= sc.start_ms + 60_000
    # nobody blamed: the cap moved every GPU of the job together
    assert [f for f in findings if f["job_id"] != "fleet"] == [], findings
    assert not [r for r in recs if r["action"] == "DRAIN"], recs
