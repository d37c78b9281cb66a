"""The offline pipeline on small simulated scenarios."""

from __future__ import annotations

from typing import Any

from peerwatch.producers.sim import Fleet, parse_scenario
from peerwatch.settings import Settings, with_overrides
from peerwatch.streams.core.job_stage import JobStage
from peerwatch.streams.core.pipeline import (
    FINDING,
    RECOMMENDATION,
    WINDOW,
    Output,
    Pipeline,
)
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.core.windows import JobWindowBatch


def _fan_out(on: bool) -> Settings:
    """The tree's defaults with ``stream.fan_out_job_wide`` set to ``on``."""
    return with_overrides(Settings(), {"stream.fan_out_job_wide": on})


def scenario(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "fleet": {"nodes": 3, "interval_s": 2.0, "duration_s": 1500, "seed": 4},
        "jobs": [{"job_id": "42", "gpus": 16, "first_node": 0, "warmup_s": 30}],
    }
    doc.update(extra)
    return doc


def run(doc: dict[str, Any]) -> tuple[list[Output], Fleet]:
    fleet = Fleet(parse_scenario(doc))
    outs = list(Pipeline(Settings()).run(r for batch in fleet.ticks() for r in batch))
    return outs, fleet


def of(outs: list[Output], kind: str) -> list[dict[str, Any]]:
    return [o.value for o in outs if o.kind == kind]


def test_clock_drop_is_confirmed_on_that_gpu_and_drained_after_ten_minutes() -> None:
    drop = {
        "name": "sm_clock_drop",
        "node": 1,
        "gpu_index": 3,
        "start_s": 200,
        "params": {"pct": 8},
    }
    outs, fleet = run(scenario(faults=[drop]))
    t0 = fleet.spec.start_ms
    findings = of(outs, FINDING)
    slow = {
        (f["node"], f["gpu_index"]) for f in findings if f["status"] in ("SUSPECT", "CONFIRMED")
    }
    assert slow == {("gpu00001", 3)}
    confirmed = [f for f in findings if f["status"] == "CONFIRMED"]
    assert confirmed and confirmed[0]["job_id"] == "42"
    drains = [r for r in of(outs, RECOMMENDATION) if r["action"] == "DRAIN"]
    assert len(drains) == 1
    assert drains[0]["node"] == "gpu00001" and drains[0]["gpu_indices"] == [3]
    assert drains[0]["ts_ms"] - (t0 + 200_000) >= 10 * 60 * 1000
    # Every window of the job came out, annotated by the detector; the fleet's unallocated GPUs
    # come out under their node's idle pseudo job, gated (hard rules only, never peer verdicts).
    idle = [w for w in of(outs, WINDOW) if w["job_id"].startswith("idle:")]
    assert idle and all(w["gated"] == "idle" and w["score"] is None for w in idle)
    ws = [w for w in of(outs, WINDOW) if not w["job_id"].startswith("idle:")]
    assert {w["job_id"] for w in ws} == {"42"} and len(
        {(w["node"], w["gpu_index"]) for w in ws}
    ) == 16
    assert all("gated" in w and "score" in w for w in ws)


def test_checkpoint_confounder_produces_nothing() -> None:
    pause = {"name": "checkpoint", "node": 0, "start_s": 400, "end_s": 460}
    outs, _ = run(scenario(confounders=[pause]))
    assert of(outs, FINDING) == [] and of(outs, RECOMMENDATION) == []
    gated = [w for w in of(outs, WINDOW) if w["gated"] == "low_activity"]
    assert gated  # the pause was seen and gated, not ignored


def test_hard_error_drains_at_once() -> None:
    xid = {"name": "xid", "node": 2, "gpu_index": 5, "start_s": 300, "params": {"xid": 48}}
    doc = scenario(faults=[xid])
    doc["jobs"].append({"job_id": "43", "gpus": 2, "nodes": [2]})
    doc["faults"][0]["gpu_index"] = 1
    outs, fleet = run(doc)
    drains = [r for r in of(outs, RECOMMENDATION) if r["action"] == "DRAIN"]
    assert [(r["node"], r["hard"], r["job_ids"]) for r in drains] == [("gpu00002", True, ["43"])]
    assert drains[0]["ts_ms"] - (fleet.spec.start_ms + 300_000) <= 30_000


def test_same_input_twice_gives_identical_outputs() -> None:
    drop = {
        "name": "sm_clock_drop",
        "node": 0,
        "gpu_index": 1,
        "start_s": 300,
        "params": {"pct": 10},
    }
    doc = scenario(faults=[drop], confounders=[{"name": "clock_skew", "node": 1, "start_s": 0}])
    doc["fleet"]["duration_s"] = 600
    first, _ = run(doc)
    second, _ = run(doc)
    assert first == second
    assert of(first, FINDING)


def test_job_stage_waits_for_all_gpus_or_the_watermark_and_keeps_window_order() -> None:
    settings = DetectorSettings(window_s=30)  # the 30 s windows below
    stage = JobStage(settings, grace_ms=10_000)

    def batch(start: int, node: str) -> JobWindowBatch:
        ws = [{"job_id": "J", "node": node, "gpu_index": i, "window_start_ms": start,
               "window_end_ms": start + 30_000, "samples": 1} for i in range(2)]  # fmt: skip
        return JobWindowBatch("J", start, start + 30_000, ws)

    from peerwatch.streams.core.model import JobContext

    ctx = JobContext(job_id="J", expected_gpus=4)
    stage.add(batch(0, "a"))
    stage.add(batch(30_000, "a"))
    stage.add(batch(30_000, "b"))  # window 30 s complete, window 0 s is not
    assert stage.release(35_000, lambda _: ctx) == []
    released = stage.release(40_000, lambda _: ctx)  # 0 s expires, then 30 s follows
    assert [len(r.scored.windows) for _, r in released if r.scored] == [2, 4]
    assert stage.pending == {}
    round_trip = JobStage.from_dict(stage.to_dict(), settings)
    assert round_trip.to_dict() == stage.to_dict()


def test_job_wide_fan_out_alerts_every_node_of_the_job() -> None:
    # Five of sixteen GPUs slow at once: more than 25% of the group, a shared cause.
    drops = [
        {
            "name": "sm_clock_drop",
            "node": i % 2,
            "gpu_index": i,
            "start_s": 300,
            "params": {"pct": 10},
        }
        for i in range(5)
    ]
    doc = scenario(faults=drops)
    doc["fleet"]["duration_s"] = 500
    fleet = Fleet(parse_scenario(doc))
    records = [r for batch in fleet.ticks() for r in batch]
    plain = list(Pipeline(_fan_out(False)).run(records))
    fanned = list(Pipeline(_fan_out(True)).run(records))
    assert of(plain, FINDING) == of(fanned, FINDING)
    assert [f["status"] for f in of(plain, FINDING)] == ["JOB_WIDE"]
    assert of(plain, RECOMMENDATION) == []
    alerts = of(fanned, RECOMMENDATION)
    assert sorted(r["node"] for r in alerts) == ["gpu00000", "gpu00001"]
    assert {r["action"] for r in alerts} == {"ALERT"}


def test_hard_error_on_an_idle_gpu_drains_the_node_without_a_job() -> None:
    doc = {
        "fleet": {"nodes": 2, "gpus_per_node": 8, "duration_s": 240, "seed": 5},
        "jobs": [{"job_id": "7", "gpus": 8, "first_node": 0, "duration_s": 600, "warmup_s": 0}],
        "faults": [{"name": "xid", "node": "gpu00001", "gpu_index": 4, "start_s": 100,
                    "params": {"xid": 79}}],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    outs = list(
        Pipeline(Settings()).run((r.stream, r.key, r.value) for t in fleet.ticks() for r in t)
    )
    hard = [f for f in of(outs, FINDING) if f["status"] == "HARD_ERROR"]
    # On arrival (the sample that shows it), then the window rule of the same window (a
    # backstop: same drain episode, no second drain).
    assert [(f["node"], f["gpu_index"], f["job_id"]) for f in hard] == [
        ("gpu00001", 4, "idle:gpu00001")
    ] * 2
    assert hard[0]["detected_ms"] < hard[1]["detected_ms"] == hard[1]["window_end_ms"]
    assert hard[0]["window_start_ms"] == hard[1]["window_start_ms"]
    assert hard[0]["hard_rules"] == ["gpu_lost", "xid_79"]
    drains = [r for r in of(outs, RECOMMENDATION) if r["action"] == "DRAIN"]
    assert [(r["node"], r["gpu_indices"], r["job_ids"]) for r in drains] == [("gpu00001", [4], [])]
    # Idle GPUs never get peer verdicts, so nothing else on the idle node is flagged.
    assert not [f for f in of(outs, FINDING) if f["status"] in ("SUSPECT", "CONFIRMED")]


def test_step_times_fill_the_step_feature_and_flag_the_slow_rank() -> None:
    doc = scenario(faults=[{"name": "sm_clock_drop", "node": 1, "gpu_index": 3, "start_s": 200,
                            "params": {"pct": 8}}])  # fmt: skip
    doc["fleet"]["step_times"] = True
    outs, _ = run(doc)
    ws = [w for w in of(outs, WINDOW) if w["job_id"] == "42" and w["gated"] is None]
    assert ws and all(w["step_ms"] is not None for w in ws)
    late = [w for w in ws if w["window_start_ms"] >= ws[0]["window_start_ms"] + 300_000]
    slow = [w["step_ms"] for w in late if (w["node"], w["gpu_index"]) == ("gpu00001", 3)]
    peers = [w["step_ms"] for w in late if (w["node"], w["gpu_index"]) != ("gpu00001", 3)]
    assert min(slow) > 1.05 * max(peers)  # an 8% slower clock: about 8% longer steps
    confirmed = [f for f in of(outs, FINDING) if f["status"] == "CONFIRMED"]
    steps = [e for f in confirmed for e in f["features"] if e["feature"] == "step"]
    assert steps and all(e["z"] > 3.5 and e["value"] > e["peer_median"] for e in steps)
    assert {(f["node"], f["gpu_index"]) for f in confirmed} == {("gpu00001", 3)}


def test_step_times_without_a_gpu_or_after_the_release_are_not_used() -> None:
    stage = JobStage(DetectorSettings(window_s=30))
    w = {"job_id": "9", "node": "n", "gpu_index": 0, "window_start_ms": 0}
    assert not stage.add_step({"job_id": "9", "node": "n", "gpu_index": None, "ts_ms": 5,
                               "step_duration_ms": 100.0})  # fmt: skip
    assert stage.add_step({"job_id": "9", "node": "n", "gpu_index": 0, "ts_ms": 5,
                           "step_duration_ms": 100.0})  # fmt: skip
    assert stage.add_step({"job_id": "9", "node": "n", "gpu_index": 0, "ts_ms": 6,
                           "step_duration_ms": 300.0})  # fmt: skip
    windows = [dict(w)]
    stage._with_steps("9", 0, windows)
    assert windows[0]["step_ms"] == 200.0
    stage.released["9"] = 0
    assert not stage.add_step({"job_id": "9", "node": "n", "gpu_index": 0, "ts_ms": 7,
                               "step_duration_ms": 1.0})  # fmt: skip
    assert stage.steps_late == 1
