"""Live = replay on real Kafka: the helpers of the tests that require it (issue 37 item 3).

:func:`live_and_replay` publishes a simulated scenario through the real broker to one real
worker (``peerwatch stream``) while the archiver (``peerwatch archive``) keeps the topics, then
replays the archive (``peerwatch replay --archive``); :func:`offline_bytes` is the in-process
runner on the same records as the worker reads them. Outputs are compared as the Avro bytes of
each record, sorted. The replay closes the last open windows at the end of its range, the
worker waits for later samples: replay outputs of windows ending after the last sample time -
lateness are left out (as in test_replay). The replay's JSON lines are encoded again with the
same Avro schemas (JSON keeps a double exactly). As in test_stream_app, the in-process runner
is fed without ``finish()`` (the live closing rule).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings, Settings
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings
from peerwatch.streams.tools.bench_run import produce_raw, read_topic
from peerwatch.topics import RECOMMENDATIONS, STRAGGLERS

from .archive_helpers import peerwatch_env, run, start
from .test_replay import stop
from .test_stream_app import (
    LATENESS_S,
    WINDOW_S,
    Scenario,
    fresh_topics,
    new_worker,
    run_until_stable,
)

FINDINGS = AvroCodec("StragglerFinding")
RECOMMENDATIONS_CODEC = AvroCodec("DrainRecommendation")


def offline_bytes(sc: Scenario) -> tuple[list[bytes], list[bytes]]:
    """The in-process runner's findings and recommendations on the same records as the worker
    reads them (decoded from their Avro bytes: Avro floats are single precision), Avro-encoded
    as the worker publishes them (fed without ``finish()``: the live closing rule)."""
    pipeline = Pipeline(
        Settings(
            detector=DetectorSettings(window_s=WINDOW_S),
            stream=StreamSettings(lateness_s=LATENESS_S, fan_out_job_wide=True),
        )
    )
    codecs = {FINDING: FINDINGS, RECOMMENDATION: RECOMMENDATIONS_CODEC}
    out: dict[str, list[bytes]] = {FINDING: [], RECOMMENDATION: []}
    inputs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
    for _, stream, key, value in sc.records:
        read = inputs[stream].decode(inputs[stream].encode(value))
        for o in pipeline.feed(stream, key, read):
            if o.kind in codecs:
                out[o.kind].append(codecs[o.kind].encode(o.value))
    return sorted(out[FINDING]), sorted(out[RECOMMENDATION])


@dataclass
class LiveReplay:
    """What the worker published and what the replay of its archive said (sorted Avro bytes;
    the replay's only on windows the worker closed)."""

    live_findings: list[bytes]
    live_recs: list[bytes]
    replay_findings: list[bytes]
    replay_recs: list[bytes]
    counters: dict[str, Any]
    log: str


def live_and_replay(
    kafka: KafkaSettings, tmp_path: Path, sc: Scenario, duration_s: int
) -> LiveReplay:
    """Publish ``sc`` to a fresh worker with the archiver running, then replay the archive
    (module docstring)."""
    prefix = fresh_topics(kafka)
    app = f"app-{uuid.uuid4().hex[:6]}"
    root = tmp_path / "archive"
    env = peerwatch_env(kafka, prefix)
    archiver = start(["archive", "--dir", str(root), "--group-id", f"{prefix}archive",
                      "--flush-interval-s", "0.5"], env, tmp_path / "archive.log")  # fmt: skip
    try:
        with new_worker(kafka, prefix, tmp_path, "fleet", app) as worker:
            produce_raw(kafka, sc.raw(prefix))
            counters = run_until_stable(worker, kafka, prefix, sc.node_records).counters
            log = worker.log_tail()
        time.sleep(3)  # the archiver's flush interval, several times over
    finally:
        stop(archiver)
    live_findings = sorted(r.value for r in read_topic(kafka, prefix + STRAGGLERS.name))
    live_recs = sorted(r.value for r in read_topic(kafka, prefix + RECOMMENDATIONS.name))

    out = tmp_path / "replay.jsonl"
    span = ["--from", str(sc.start_ms), "--to", str(sc.start_ms + duration_s * 1000)]
    run(["replay", "--archive", str(root), *span, "--window-s", str(WINDOW_S), "--lateness-s",
         str(LATENESS_S), "--no-progress", "--findings", str(out)], env)  # fmt: skip
    last_sample_ms = max(v["ts_ms"] for _, stream, _, v in sc.records if stream == "samples")
    bound = last_sample_ms - int(LATENESS_S * 1000)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    replay_findings = sorted(FINDINGS.encode(_record(x)) for x in lines
                             if x["kind"] == "finding" and x["window_end_ms"] <= bound)  # fmt: skip
    replay_recs = sorted(RECOMMENDATIONS_CODEC.encode(_record(x)) for x in lines
                         if x["kind"] == "recommendation" and x["ts_ms"] <= bound)  # fmt: skip
    return LiveReplay(live_findings, live_recs, replay_findings, replay_recs, counters, log)


def assert_live_is(want_findings: list[bytes], want_recs: list[bytes], got: LiveReplay) -> None:
    """The worker's outputs are ``want_*`` (the in-process runner's), and the replay's are the
    worker's, byte for byte; a difference in findings is shown decoded."""
    if got.live_findings != want_findings:  # what differs, readable
        only_live = [FINDINGS.decode(b) for b in got.live_findings if b not in want_findings]
        only_replay = [FINDINGS.decode(b) for b in want_findings if b not in got.live_findings]
        pytest.fail(f"live only: {only_live}\nreplay only: {only_replay}\n{got.counters}\n"
                    f"{got.log}")  # fmt: skip
    assert got.live_recs == want_recs
    assert got.replay_findings == got.live_findings
    assert got.replay_recs == got.live_recs


def _record(line: dict[str, Any]) -> dict[str, Any]:
    """A replay output line without its ``kind``: the record."""
    return {k: v for k, v in line.items() if k != "kind"}
