"""Live == replay on a real broker. A simulated straggler scenario is published to Kafka; the live
worker (``peerwatch stream``) and the archiver (``peerwatch archive``) run on it as processes;
then ``peerwatch replay --kafka`` and ``peerwatch replay --archive`` run over the same range.

Expected: replay (Kafka) and replay (archive) give identical findings and recommendations; they
equal the live ones for every window the live worker closed. The live worker closes a window only
when a later sample moves the watermark past its end (+ lateness), so with no more input its last
windows stay open, while replay closes everything at the end of the range: the comparison is
restricted to windows ending at or before the last sample time - lateness.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from peerwatch.io.archive.reader import read_archive
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import RECOMMENDATIONS, STRAGGLERS, catalogue
from tests.integration.archive_helpers import (
    fleet_messages,
    peerwatch_env,
    produce,
    read_values,
    run,
    start,
    wait_for,
)

DURATION_S, INTERVAL_S, LATENESS_MS = 300, 2.0, 5000
STRAGGLER = ("gpu00005", 3)


def scenario(start_ms: int) -> dict[str, Any]:
    return {
        "fleet": {"nodes": 16, "gpus_per_node": 8, "interval_s": INTERVAL_S,
                  "duration_s": DURATION_S, "seed": 11, "start_ms": start_ms},
        "jobs": [
            {"job_id": "3001", "gpus": 96, "first_node": 0, "warmup_s": 0, "duration_s": 7200},
            {"job_id": "3002", "gpus": 32, "first_node": 12, "warmup_s": 0, "duration_s": 7200},
        ],
        "faults": [{"name": "sm_clock_drop", "node": STRAGGLER[0], "gpu_index": STRAGGLER[1],
                    "start_s": 30, "params": {"pct": 8}}],
    }  # fmt: skip


def load(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [x for x in lines if x["kind"] == "finding"], [
        x for x in lines if x["kind"] == "recommendation"
    ]


def stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except Exception:  # a faust worker has been seen ignoring SIGTERM
            proc.kill()
            proc.wait(10)


def test_live_findings_equal_replay_from_kafka_and_from_the_archive(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - now_ms % 30_000 - 2 * DURATION_S * 1000
    fleet = Fleet(parse_scenario(scenario(start_ms)))
    messages = fleet_messages(fleet, topic_prefix)
    produce(kafka_settings, messages)
    last_sample_ms = max(ts for t, _, _, ts in messages if t.endswith("gpu.samples"))
    env = peerwatch_env(kafka_settings, topic_prefix)
    root = tmp_path / "archive"
    live = start(
        ["stream", "--app-id", "stream", "--loglevel", "warning"], env, tmp_path / "stream.log"
    )
    archiver = start(["archive", "--dir", str(root), "--group-id", f"{topic_prefix}archive",
                      "--flush-interval-s", "0.5"], env, tmp_path / "archive.log")  # fmt: skip
    stragglers_t, recs_t = topic_prefix + STRAGGLERS.name, topic_prefix + RECOMMENDATIONS.name
    try:
        # Findings come out as the live worker processes; done when the count holds still.
        seen: list[int] = []

        def settled() -> bool:
            seen.append(len(read_values(kafka_settings, stragglers_t)))
            return len(seen) >= 4 and seen[-1] > 0 and len(set(seen[-4:])) == 1

        wait_for(settled, 180, "the live worker's findings", poll_s=3.0)
        time.sleep(3)  # let the archiver take the last outputs too
    finally:
        stop(live)
        stop(archiver)
    live_findings = read_values(kafka_settings, stragglers_t)
    live_recs = read_values(kafka_settings, recs_t)

    span = ["--from", str(start_ms), "--to", str(start_ms + DURATION_S * 1000)]
    out_k, out_a = tmp_path / "kafka.jsonl", tmp_path / "archive.jsonl"
    out_p = tmp_path / "kafka-python.jsonl"
    out_w = tmp_path / "archive-workers.jsonl"
    summary = json.loads(run(["replay", "--kafka", *span, "--findings", str(out_k)], env))
    assert summary["node_records"] == 16 * DURATION_S / INTERVAL_S and summary["late_samples"] == 0
    archive_args = ["--archive", str(root), *span, "--no-progress"]
    summary_a = json.loads(run(["replay", *archive_args, "--findings", str(out_a)], env))
    # Kafka is replayed through decoded records, the archive through the C column decoder. The
    # same range again: Kafka with the C decoder off (PEERWATCH_NATIVE=0), and the archive
    # through decoded records with two decoding processes (--workers 2). All must agree.
    assert summary["path"] == "decoded"
    python_env = {**env, "PEERWATCH_NATIVE": "0"}
    json.loads(run(["replay", "--kafka", *span, "--findings", str(out_p)], python_env))
    summary_w = json.loads(
        run(["replay", *archive_args, "--workers", "2", "--findings", str(out_w)], env)
    )
    assert summary_a["path"] == "columns" and summary_w["path"] == "decoded"
    k_findings, k_recs = load(out_k)
    a_findings, a_recs = load(out_a)
    assert load(out_p) == (k_findings, k_recs) == load(out_w)

    # Kafka and archive replays are the same computation on the same records.
    assert [f["finding_id"] for f in k_findings] == [f["finding_id"] for f in a_findings]
    assert [r["recommendation_id"] for r in k_recs] == [r["recommendation_id"] for r in a_recs]

    # Live == replay on every window the live worker closed.
    bound = last_sample_ms - LATENESS_MS
    print(f"live: {len(live_findings)} findings, {len(live_recs)} recommendations; replay: "
          f"{len(k_findings)} findings, {len(k_recs)} recommendations; {summary}")  # fmt: skip
    replay_closed = {f["finding_id"] for f in k_findings if f["window_end_ms"] <= bound}
    assert {f["finding_id"] for f in live_findings} == replay_closed
    assert {(f["node"], f["gpu_index"]) for f in live_findings if f["status"] == "CONFIRMED"} == {
        STRAGGLER
    }
    live_rec_ids = {r["recommendation_id"] for r in live_recs}
    assert live_rec_ids == {r["recommendation_id"] for r in k_recs if r["ts_ms"] <= bound}
    assert live_rec_ids

    # The archive also holds the live outputs: the same findings as read from Kafka.
    archived = {f["finding_id"] for f in read_archive(root, stragglers_t, "StragglerFinding")}
    assert archived == {f["finding_id"] for f in live_findings}

    # ``peerwatch job`` on the live outputs: from Kafka, and from the archive the archiver wrote
    # (its archived outputs, no replay). Both name the straggler the same way.
    from_kafka = json.loads(run(["job", "3001", "--json"], env))
    from_archive = json.loads(
        run(["job", "3001", "--json", "--archive", str(root), "--no-replay"], env)
    )
    for job in (from_kafka, from_archive):
        print(job["verdict"], job["skipped"])
        assert [(g["node"], g["gpu_index"]) for g in job["flagged"]] == [STRAGGLER]
        assert job["flagged"][0]["status"] == "CONFIRMED" and job["gpus"] == 96
        assert job["verdict"].startswith("GPU 3 on gpu00005 ran ") and job["skipped"] == {}
        assert job["windows"] > 0 and len(job["rows"]) == 96
    assert (
        from_kafka["flagged"][0]["first_flagged_ms"]
        == from_archive["flagged"][0]["first_flagged_ms"]
    )

    # The whole archive (no --from/--to) holds the same inputs as the range: the same findings.
    out_all = tmp_path / "archive-all.jsonl"
    run(["replay", "--archive", str(root), "--no-progress", "--findings", str(out_all)], env)
    assert [f["finding_id"] for f in load(out_all)[0]] == [f["finding_id"] for f in a_findings]
