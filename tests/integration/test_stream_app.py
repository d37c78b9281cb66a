"""The live stream app (``peerwatch stream``, faust) on a real broker, run as subprocesses.

One small scenario (16 nodes x 8 GPUs, 10 s windows, 2 s samples, 240 s of event time): job
2001 (64 GPUs) has an 8% SM-clock drop on gpu00003/5 from 20 s; job 2002 (64 GPUs) gets an
XID 79 on gpu00012/2 at 150 s. Records are pre-published as fast as the broker takes them.

Documented behaviour checked here:

- undecodable records (garbage, unknown schema fingerprint) go to the dead-letter topic with
  ``peerwatch.reason: undecodable`` and the original bytes; the worker keeps going;
- a sample for a window the hot stage already closed is *late*: it is not aggregated, it is
  counted (``late`` counter) and sent to the dead-letter topic with ``peerwatch.reason: late``
  (re-encoded; ``peerwatch.topic`` names the samples topic);
- the live worker closes a window when a later sample moves its partition's watermark past it,
  so with no more input the last open windows stay open; the offline pipeline is therefore fed
  the same records without ``finish()`` (the same closing rule) for the comparison.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec, decode_any
from peerwatch.settings import KafkaSettings, Settings
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings
from peerwatch.streams.tools.bench_run import WorkerProcess, produce_raw, read_topic, wait_stable
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import (
    DEADLETTER,
    JOB_WINDOWS,
    RECOMMENDATIONS,
    SAMPLES,
    STRAGGLERS,
    catalogue,
)

WINDOW_S, LATENESS_S, DURATION_S, INTERVAL_S = 10, 5.0, 240, 2.0
STRAGGLER, XID_GPU = ("gpu00003", 5), ("gpu00012", 2)
WORKER_ARGS = [
    "--window-s",
    str(WINDOW_S),
    "--lateness-s",
    str(LATENESS_S),
    "--loglevel",
    "warning",
]
#: A worker needs ~10-20 s to start and join; then it processes this input in seconds on an idle
#: machine. A hang guard only: with both cores busy elsewhere (CI, other tests) 120 s was too few.
RUN_TIMEOUT_S = 300.0
#: Each test runs up to two workers one after the other, each up to RUN_TIMEOUT_S.
pytestmark = pytest.mark.timeout(1200)

Raw = tuple[str, bytes | None, bytes, int | None]


def scenario_doc(start_ms: int) -> dict[str, Any]:
    return {
        "fleet": {"nodes": 16, "gpus_per_node": 8, "interval_s": INTERVAL_S,
                  "duration_s": DURATION_S, "seed": 7, "start_ms": start_ms},
        "jobs": [
            {"job_id": "2001", "gpus": 64, "first_node": 0, "warmup_s": 0, "duration_s": 7200},
            {"job_id": "2002", "gpus": 64, "first_node": 8, "warmup_s": 0, "duration_s": 7200},
        ],
        "faults": [
            {"name": "sm_clock_drop", "node": STRAGGLER[0], "gpu_index": STRAGGLER[1],
             "start_s": 20, "params": {"pct": 8}},
            {"name": "xid", "node": XID_GPU[0], "gpu_index": XID_GPU[1], "start_s": 150,
             "params": {"xid": 79}},
        ],
    }  # fmt: skip


@dataclass
class Scenario:
    fleet: Fleet
    start_ms: int
    #: (tick ms, stream, key, value) in publishing order.
    records: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)

    def raw(
        self, prefix: str, until_ms: int | None = None, since_ms: int | None = None
    ) -> list[Raw]:
        codecs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
        return [
            (prefix + STREAM_TOPICS[stream].name, key.encode(), codecs[stream].encode(value),
             int(value.get("ts_ms", tick)))
            for tick, stream, key, value in self.records
            if (until_ms is None or tick < until_ms) and (since_ms is None or tick >= since_ms)
        ]  # fmt: skip

    @property
    def node_records(self) -> int:
        return sum(stream == "samples" for _, stream, _, _ in self.records)


def recent_scenario(doc_at: Callable[[int], dict[str, Any]], duration_s: int) -> Scenario:
    """Every record of the scenario ``doc_at(start_ms)``, in publishing order. Stamped in the
    recent past (retention is one day) and aligned to the window, so every run and the
    in-process runner see the same window boundaries."""
    now_ms = int(time.time() * 1000) - (duration_s + 60) * 1000
    start_ms = now_ms - now_ms % (WINDOW_S * 1000)
    fleet = Fleet(parse_scenario(doc_at(start_ms)))
    out = Scenario(fleet, start_ms)
    for tick, recs in fleet.timed_ticks():
        out.records += [(tick, r.stream, r.key, r.value) for r in recs]
    return out


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    return recent_scenario(scenario_doc, DURATION_S)


@dataclass(frozen=True)
class Outcome:
    findings: list[dict[str, Any]]
    recommendations: list[dict[str, Any]]
    deadletters: list[Any]
    counters: dict[str, Any]

    @property
    def rec_ids(self) -> list[str]:
        return [r["recommendation_id"] for r in self.recommendations]

    @property
    def finding_ids(self) -> set[str]:
        return {f["finding_id"] for f in self.findings}


def outcome(kafka: KafkaSettings, prefix: str, counters: dict[str, Any]) -> Outcome:
    def decoded(topic: str) -> list[dict[str, Any]]:
        return [decode_any(r.value)[1] for r in read_topic(kafka, prefix + topic)]

    return Outcome(
        decoded(STRAGGLERS.name),
        decoded(RECOMMENDATIONS.name),
        read_topic(kafka, prefix + DEADLETTER.name),
        counters,
    )


def run_until_stable(
    worker: WorkerProcess, kafka: KafkaSettings, prefix: str, samples: int, *workers: WorkerProcess
) -> Outcome:
    """Poll until the workers' sample count reaches ``samples`` and the recommendations topic
    stopped changing; every worker is alive throughout."""
    everyone = (worker, *workers)

    def poll() -> tuple[int, int, int]:
        for w in everyone:
            assert w.alive(), f"{w.name} died:\n{w.log_tail()}"
        seen = sum(int(w.counters().get("samples", 0)) for w in everyone)
        recs = len(read_topic(kafka, prefix + RECOMMENDATIONS.name))
        found = len(read_topic(kafka, prefix + STRAGGLERS.name))
        return seen, recs, found

    state = wait_stable(poll, lambda r: r[0] >= samples and r[1] > 0, RUN_TIMEOUT_S)
    assert state[0] >= samples, f"processed {state} of {samples}:\n{worker.log_tail()}"
    return outcome(kafka, prefix, worker.counters())


def offline(sc: Scenario) -> tuple[set[str], list[str]]:
    """Finding ids and recommendation ids of the offline pipeline on the same records (fed
    without ``finish()``: windows close on the same watermark rule as the live hot stage)."""
    pipeline = Pipeline(
        Settings(
            detector=DetectorSettings(window_s=WINDOW_S),
            stream=StreamSettings(lateness_s=LATENESS_S, fan_out_job_wide=True),
        )
    )
    findings: set[str] = set()
    recs: list[str] = []
    for _, stream, key, value in sc.records:
        for out in pipeline.feed(stream, key, value):
            if out.kind == FINDING:
                findings.add(out.value["finding_id"])
            elif out.kind == RECOMMENDATION:
                recs.append(out.value["recommendation_id"])
    return findings, recs


def fresh_topics(kafka: KafkaSettings) -> str:
    """A new topic prefix with the catalogue's topics created under it."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    ensure_topics(kafka, catalogue(prefix))
    return prefix


def new_worker(kafka_settings: KafkaSettings, prefix: str, tmp: Path, name: str, app: str) -> Any:
    return WorkerProcess(
        kafka_settings.bootstrap_servers, prefix, app, tmp, name=name, args=WORKER_ARGS
    )


def late_sample(sc: Scenario) -> dict[str, Any]:
    """A valid sample of gpu00001 for the scenario's second window (closed long ago)."""
    ts = sc.start_ms + WINDOW_S * 1000 + 1000
    for _, stream, _, value in sc.records:
        if stream == "samples" and value["node"] == "gpu00001" and value["ts_ms"] >= ts:
            return {**value, "ts_ms": ts, "seq": value["seq"] + 100_000}
    raise AssertionError("no sample of gpu00001")


def garbage(prefix: str, sc: Scenario) -> list[Raw]:
    """Two undecodable samples: not Avro at all, and a valid body behind an unknown fingerprint."""
    good = AvroCodec("NodeGpuSample").encode(sc.records[-1][3])
    return [
        (prefix + SAMPLES.name, b"gpu00001", b"\x00not avro at all", None),
        (prefix + SAMPLES.name, b"gpu00002", b"\xc3\x01" + b"\xfe" * 8 + good[10:], None),
    ]


@pytest.fixture(scope="module")
def main_run(
    scenario: Scenario, kafka_settings: KafkaSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Outcome, str]]:
    """One uninterrupted worker on: two undecodable records, the scenario, then a late sample."""
    prefix = fresh_topics(kafka_settings)
    samples = prefix + SAMPLES.name
    produce_raw(kafka_settings, garbage(prefix, scenario) + scenario.raw(prefix))
    tmp = tmp_path_factory.mktemp("main")
    with new_worker(kafka_settings, prefix, tmp, "main", f"app-{uuid.uuid4().hex[:6]}") as worker:
        run_until_stable(worker, kafka_settings, prefix, scenario.node_records)
        late = AvroCodec("NodeGpuSample").encode(late_sample(scenario))
        produce_raw(kafka_settings, [(samples, b"gpu00001", late, None)])
        wait_stable(lambda: worker.counters().get("late", 0), lambda n: n >= 1, 60, settle_s=2)
        yield outcome(kafka_settings, prefix, worker.counters()), prefix


def test_end_to_end_matches_offline(scenario: Scenario, main_run: tuple[Outcome, str]) -> None:
    out, _ = main_run
    flagged = {(f["node"], f["gpu_index"], f["status"]) for f in out.findings}
    assert (STRAGGLER[0], STRAGGLER[1], "SUSPECT") in flagged
    assert (STRAGGLER[0], STRAGGLER[1], "CONFIRMED") in flagged
    assert (XID_GPU[0], XID_GPU[1], "HARD_ERROR") in flagged
    # Nothing else is flagged: no other GPU, no job-wide finding.
    assert {(n, g) for n, g, _ in flagged} == {STRAGGLER, XID_GPU}, flagged
    for f in out.findings:
        if f["status"] in ("SUSPECT", "CONFIRMED"):
            clk = [e for e in f["features"] if e["feature"] == "clk"]
            assert clk and clk[0]["z"] <= -3.5 and clk[0]["value"] < 0.95 * clk[0]["peer_median"]
    by_node = {(r["node"], r["action"]) for r in out.recommendations}
    assert (XID_GPU[0], "DRAIN") in by_node
    assert (STRAGGLER[0], "ALERT") in by_node
    assert {n for n, _ in by_node} == {STRAGGLER[0], XID_GPU[0]}
    # The offline pipeline on the same records: the same finding and recommendation ids.
    offline_findings, offline_recs = offline(scenario)
    assert out.finding_ids == offline_findings
    assert sorted(out.rec_ids) == sorted(offline_recs)
    assert len(out.rec_ids) == len(set(out.rec_ids))
    assert out.counters["unattributed"] == offline_unattributed(scenario)


def offline_unattributed(sc: Scenario) -> int:
    # GPU readings after job 2002 ended (the XID failed it): owned by no job, live or offline.
    pipeline = Pipeline(Settings(detector=DetectorSettings(window_s=WINDOW_S)))
    for _, stream, key, value in sc.records:
        pipeline.feed(stream, key, value)
    pipeline.finish()
    return pipeline.counters()["unattributed"]


def test_dead_letters_carry_reason_and_worker_goes_on(
    scenario: Scenario, main_run: tuple[Outcome, str]
) -> None:
    out, prefix = main_run
    reasons = sorted(r.headers["peerwatch.reason"] for r in out.deadletters)
    assert reasons == [b"late", b"undecodable", b"undecodable"], reasons
    undecodable = [r for r in out.deadletters if r.headers["peerwatch.reason"] == b"undecodable"]
    assert {r.value for r in undecodable} == {g[2] for g in garbage(prefix, scenario)}
    assert all(
        r.headers["peerwatch.topic"] == (prefix + SAMPLES.name).encode() for r in undecodable
    )
    assert any(b"fingerprint" in r.headers["peerwatch.error"] for r in undecodable)
    # The garbage came first on its partitions; everything after it was still processed.
    assert out.counters["samples"] == scenario.node_records + 1  # + the late one
    assert out.counters["deadletter"] == 2


def test_late_sample_is_counted_and_dead_lettered(
    scenario: Scenario, main_run: tuple[Outcome, str]
) -> None:
    out, prefix = main_run
    (late,) = [r for r in out.deadletters if r.headers["peerwatch.reason"] == b"late"]
    assert late.key == b"gpu00001"
    assert late.headers["peerwatch.topic"] == (prefix + SAMPLES.name).encode()
    codec = AvroCodec("NodeGpuSample")  # floats are Avro floats: compare after a round trip
    assert decode_any(late.value)[1] == codec.decode(codec.encode(late_sample(scenario)))
    assert out.counters["late"] == 1


def window_keys(kafka: KafkaSettings, prefix: str) -> list[tuple[str, str, int, int, int]]:
    """(job, node, GPU, window start, samples in it) of every GpuWindow on the job-windows
    topic: a window rebuilt from part of its samples would differ in the last."""
    return [
        (w["job_id"], w["node"], w["gpu_index"], w["window_start_ms"], w["samples"])
        for w in (decode_any(r.value)[1] for r in read_topic(kafka, prefix + JOB_WINDOWS.name))
    ]


def test_restart_after_sigkill_loses_and_duplicates_nothing(
    scenario: Scenario,
    main_run: tuple[Outcome, str],
    kafka_settings: KafkaSettings,
    tmp_path: Path,
) -> None:
    reference, reference_prefix = main_run
    prefix = fresh_topics(kafka_settings)
    app = f"app-{uuid.uuid4().hex[:6]}"
    half_ms = scenario.start_ms + 120_000
    first = scenario.raw(prefix, until_ms=half_ms)
    produce_raw(kafka_settings, first)
    first_samples = sum(t.endswith(SAMPLES.name) for t, *_ in first)
    with new_worker(kafka_settings, prefix, tmp_path, "before", app) as worker:
        before = run_until_stable(worker, kafka_settings, prefix, first_samples)
        worker.kill()  # SIGKILL: no clean shutdown, no final commit
    # Some windows were processed (the straggler is already flagged), not all.
    assert before.recommendations and set(before.rec_ids) < set(reference.rec_ids)
    produce_raw(kafka_settings, scenario.raw(prefix, since_ms=half_ms))
    with new_worker(kafka_settings, prefix, tmp_path, "after", app) as worker:
        after = run_until_stable(
            worker, kafka_settings, prefix, scenario.node_records - first_samples
        )
    assert len(after.rec_ids) == len(set(after.rec_ids)), "a recommendation was sent twice"
    assert set(after.rec_ids) == set(reference.rec_ids)
    # The hot stage's offsets trail its oldest open window: the windows open at the kill were
    # rebuilt from Kafka by the second worker, none was lost and none was emitted twice.
    restarted = window_keys(kafka_settings, prefix)
    assert len({k[:4] for k in restarted}) == len(restarted), "a window was emitted twice"
    assert set(restarted) == set(window_keys(kafka_settings, reference_prefix))


def test_two_workers_in_one_group_find_the_same(
    scenario: Scenario,
    main_run: tuple[Outcome, str],
    kafka_settings: KafkaSettings,
    tmp_path: Path,
) -> None:
    reference, _ = main_run
    prefix = fresh_topics(kafka_settings)
    app = f"app-{uuid.uuid4().hex[:6]}"
    with (
        new_worker(kafka_settings, prefix, tmp_path, "one", app) as one,
        new_worker(kafka_settings, prefix, tmp_path, "two", app) as two,
    ):
        # Publish once both run (their counters files appear once the app started) and had
        # time to share the partitions, so that both take part.
        wait_stable(lambda: bool(one.counters() and two.counters()), bool, 60, settle_s=0)
        time.sleep(8)
        produce_raw(kafka_settings, scenario.raw(prefix))
        both = run_until_stable(one, kafka_settings, prefix, scenario.node_records, two)
        shares = [one.counters()["samples"], two.counters()["samples"]]
    assert min(shares) > 0, f"one worker did all the work: {shares}"
    assert both.finding_ids == reference.finding_ids
    assert sorted(both.rec_ids) == sorted(reference.rec_ids)


def test_step_times_reach_the_job_stage(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    """StepTime records (keyed by job) are joined to their GPU's window by stage 3: the live
    GpuWindows carry the same mean step_ms as the offline pipeline computes. Step times are
    published ahead of the samples, as training code publishes them before a window closes."""
    now_ms = int(time.time() * 1000) - 200_000
    doc = {
        "fleet": {"nodes": 4, "gpus_per_node": 8, "interval_s": INTERVAL_S, "duration_s": 90,
                  "seed": 11, "start_ms": now_ms - now_ms % (WINDOW_S * 1000),
                  "step_times": True},
        "jobs": [{"job_id": "3001", "gpus": 32, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    sc = Scenario(fleet, doc["fleet"]["start_ms"])
    for tick, recs in fleet.timed_ticks():
        sc.records += [(tick, r.stream, r.key, r.value) for r in recs]
    prefix = fresh_topics(kafka_settings)
    raw = sc.raw(prefix)
    samples_topic = prefix + SAMPLES.name
    produce_raw(kafka_settings, [r for r in raw if r[0] != samples_topic])
    with new_worker(kafka_settings, prefix, tmp_path, "steps", f"app-{uuid.uuid4().hex[:6]}") as w:
        wait_stable(lambda: int(w.counters().get("step_times", 0)),
                    lambda n: n >= sum(s == "step-times" for _, s, _, _ in sc.records), 90)  # fmt: skip
        produce_raw(kafka_settings, [r for r in raw if r[0] == samples_topic])
        wait_stable(lambda: int(w.counters().get("samples", 0)),
                    lambda n: n >= sc.node_records, 90, settle_s=8)  # fmt: skip
        live = [
            decode_any(r.value)[1] for r in read_topic(kafka_settings, prefix + JOB_WINDOWS.name)
        ]
    pipeline = Pipeline(Settings(detector=DetectorSettings(window_s=WINDOW_S),
                                 stream=StreamSettings(lateness_s=LATENESS_S,
                                                       fan_out_job_wide=True)))  # fmt: skip
    offline = [o.value for _, s, k, v in sc.records for o in pipeline.feed(s, k, v)
               if o.kind == "window"]  # fmt: skip

    def key(w: dict[str, Any]) -> tuple[Any, ...]:
        return (w["job_id"], w["node"], w["gpu_index"], w["window_start_ms"])

    want = {key(w): w["step_ms"] for w in offline if w["job_id"] == "3001"}
    got = {key(w): w["step_ms"] for w in live if w["job_id"] == "3001"}
    assert want and all(v is not None for v in want.values())
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-9), k
