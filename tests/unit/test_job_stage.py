"""Stage 3's release logic without faust: per-source watermarks, pending-table recovery, routing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from windowgen import SETTINGS_30S, WINDOW_MS, window

from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.detector import ScoredValues
from peerwatch.streams.core.job_stage import (
    JobReleaser,
    PendingEntry,
    Release,
    Released,
    batch_of_message,
    batches_of_message,
    route_finding,
)
from peerwatch.streams.core.windows import JobWindowBatch

#: node -> samples partition (source). Job "7" has 2 GPUs on each of a and b; c is another job's.
SOURCE = {"a": 0, "b": 1, "c": 2}
JOB_7 = {"a": [0, 1], "b": [0, 1]}


def scored(r: Release) -> ScoredValues:
    """A release's scored windows (stage 3 scores them as values)."""
    assert r.result.scored is not None
    return r.result.scored


def started(job_id: str, allocs: dict[str, list[int]]) -> dict[str, Any]:
    return {
        "event_id": f"{job_id}-STARTED",
        "job_id": job_id,
        "kind": "STARTED",
        "ts_ms": 0,
        "allocations": [{"node": n, "gpu_indices": g} for n, g in allocs.items()],
    }


def releaser(
    allocs: dict[str, list[int]] = JOB_7, fleet_judged: bool = True, **kw: Any
) -> JobReleaser:
    """``fleet_judged``: the fleet watch already judged every window (its one source closed far
    ahead), so a test sees only the job's own release rules."""
    table = AllocationTable()
    table.apply_event(started("7", allocs))
    # Job 7 has 4 GPUs: its job-wide episodes are reported here (the default reports them from
    # 8 GPUs on), so that their routing can be checked.
    settings = replace(SETTINGS_30S, job_wide_report_min_gpus=1)
    out = JobReleaser(settings, table, partition_of=SOURCE.__getitem__, **kw)
    if fleet_judged:
        out.fleet().closed(0, 1 << 60)
        for channel in range(1, 8):  # the other channels hold the fleet watch's verdict
            out.verdict({"until": 1 << 60, "shifted": {}}, channel)
    return out


def batch(k: int, node: str, gpus: list[int], **fields: Any) -> JobWindowBatch:
    """Window ``k`` of job 7 from the GPUs ``gpus`` of ``node``."""
    ws = [{**window("7", 0, k, **fields), "node": node, "gpu_index": g} for g in gpus]
    return JobWindowBatch("7", k * WINDOW_MS, (k + 1) * WINDOW_MS, ws)


def starts(released: Released) -> list[int]:
    return [r.window_start_ms // WINDOW_MS for r in released.releases]


def test_heartbeats_out_of_order_release_at_the_slowest_source_of_the_job() -> None:
    stage = releaser()
    assert stage.add(batch(0, "a", [0, 1]), src=0)  # b's GPUs never come: only the watermark
    assert starts(stage.heartbeat(1, 2 * WINDOW_MS)) == []  # source 0 not heard from yet
    assert starts(stage.heartbeat(2, 0)) == []  # c holds none of the job's nodes: not waited for
    assert starts(stage.heartbeat(0, WINDOW_MS)) == [0]
    assert stage.watermark_ms("7") == WINDOW_MS
    stage.heartbeat(1, WINDOW_MS)  # an older heartbeat read again moves nothing back
    assert stage.watermarks[0] == {0: WINDOW_MS, 1: 2 * WINDOW_MS, 2: 0}


def test_a_job_whose_start_was_not_read_yet_waits_for_every_source() -> None:
    """Live, one agent reads a channel's job events and window batches in no order between
    the topics: a job's batches can come before its start. Its nodes may then be in any
    source, so its windows wait for all of them (the slowest one heard from released windows
    before a slower source's batches came: the demo's live = replay test found it)."""
    table = AllocationTable()  # job 7's start not read yet
    stage = JobReleaser(replace(SETTINGS_30S, job_wide_report_min_gpus=1), table,
                        partition_of=SOURCE.__getitem__, fleet_sources=3)  # fmt: skip
    stage.fleet().closed(0, 1 << 60)
    stage.fleet().closed(1, 1 << 60)
    stage.fleet().closed(2, 1 << 60)
    assert stage.add(batch(0, "a", [0, 1]), src=0)
    far = 20 * WINDOW_MS
    assert starts(stage.heartbeats({0: far, 2: far})) == []  # source 1 not heard from yet
    assert stage.watermark_ms("7") < 0
    assert starts(stage.heartbeat(1, far)) == [0]


def test_heartbeats_of_another_channel_release_nothing() -> None:
    stage = releaser()
    stage.add(batch(0, "a", [0, 1]), src=0, channel=3)
    assert starts(stage.heartbeat(0, 9 * WINDOW_MS, channel=1)) == []
    assert starts(stage.heartbeat(1, 9 * WINDOW_MS, channel=1)) == []
    assert stage.heartbeat(0, WINDOW_MS, channel=3).releases == []  # source 1 not heard on 3
    assert starts(stage.heartbeat(1, WINDOW_MS, channel=3)) == [0]


def test_heartbeats_of_several_sources_at_once_release_what_one_after_another_would() -> None:
    one_by_one, at_once = releaser(), releaser()
    for stage in (one_by_one, at_once):
        for k in range(3):  # b misses windows 1 and 2: they wait for its source's watermark
            stage.add(batch(k, "a", [0, 1]), src=0)
        stage.add(batch(0, "b", [0, 1]), src=1)
    got = starts(one_by_one.heartbeat(0, 3 * WINDOW_MS))
    got += starts(one_by_one.heartbeat(1, 2 * WINDOW_MS))
    assert got == [0, 1]
    assert starts(at_once.heartbeats({0: 3 * WINDOW_MS, 1: 2 * WINDOW_MS})) == got
    assert at_once.watermarks == one_by_one.watermarks


def test_a_message_of_several_sources_gives_one_batch_per_source() -> None:
    a, b = batch(2, "a", [0, 1]), batch(2, "b", [0])
    msg = {"kind": "windows", "job_id": "7", "window_start_ms": 2 * WINDOW_MS,
           "window_end_ms": 3 * WINDOW_MS, "parts": {"0": a.windows, "1": b.windows}}  # fmt: skip
    assert batches_of_message(msg) == [(a, [0]), (b, [1])]
    single = message(2, "a", [0, 1], 0)
    assert batches_of_message(single) == [(a, [0])] and batch_of_message(single) == (a, 0)


@pytest.mark.parametrize(
    "parts", [{}, [], None, {"x": []}, {"0": None}, {"0": 5}],
)  # fmt: skip
def test_a_message_with_broken_parts_is_refused(parts: Any) -> None:
    msg = {"kind": "windows", "job_id": "7", "window_start_ms": 0, "window_end_ms": WINDOW_MS,
           "parts": parts}  # fmt: skip
    with pytest.raises((KeyError, ValueError, TypeError)):
        batches_of_message(msg)


def test_a_lagging_source_holds_the_job_back() -> None:
    stage = releaser(grace_ms=WINDOW_MS)
    for k in range(3):
        stage.add(batch(k, "a", [0, 1]), src=0)
        stage.heartbeat(0, (k + 1) * WINDOW_MS)
    stage.heartbeat(2, 10 * WINDOW_MS)
    assert stage.stage.pending["7"].keys() == {0, WINDOW_MS, 2 * WINDOW_MS}  # b is behind
    assert starts(stage.heartbeat(1, WINDOW_MS)) == []  # window 0 waits for the grace too
    got = stage.heartbeat(1, 3 * WINDOW_MS)
    assert starts(got) == [0, 1]
    assert [len(scored(r).windows) for r in got.releases] == [2, 2]
    assert got.retired == [PendingEntry("7", 0, 0), PendingEntry("7", WINDOW_MS, 0)]
    assert got.saved["7"]["released_ms"] == WINDOW_MS


def test_a_complete_window_goes_before_the_watermark_but_after_older_incomplete_ones() -> None:
    stage = releaser(fleet_judged=False)
    stage.add(batch(0, "a", [0, 1]), src=0)
    assert starts(stage.release("7")) == []
    stage.add(batch(0, "b", [0, 1]), src=1)
    assert starts(stage.release("7")) == []  # complete, but the fleet has not judged it yet
    stage.fleet().closed(0, 3 * WINDOW_MS)  # the fleet watch's only source closed it
    got = stage.release("7")  # no heartbeat of the job's sources
    assert starts(got) == [0]
    assert [(w["node"], w["gpu_index"]) for w in scored(got.releases[0]).windows] == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1)
    ]  # fmt: skip
    assert got.retired == [PendingEntry("7", 0, 0), PendingEntry("7", 0, 1)]
    stage.add(batch(1, "a", [0]), src=0)  # incomplete
    stage.add(batch(2, "a", [0, 1]), src=0)
    stage.add(batch(2, "b", [0, 1]), src=1)  # complete, but window 1 is older
    assert starts(stage.release("7")) == []
    stage.heartbeat(0, 2 * WINDOW_MS)
    assert starts(stage.heartbeat(1, 2 * WINDOW_MS)) == [1, 2]


def test_a_batch_for_a_released_window_is_dropped() -> None:
    stage = releaser()
    stage.add(batch(0, "a", [0, 1]), src=0)
    stage.add(batch(0, "b", [0, 1]), src=1)
    assert starts(stage.release("7")) == [0]
    assert not stage.add(batch(0, "a", [0, 1]), src=0)  # a restarted hot stage re-sent it
    assert stage.release("7").releases == []
    assert stage.stage.dropped == 1
    assert stage.stage.pending == {} and stage.sources == {}


def message(k: int, node: str, gpus: list[int], src: int, **fields: Any) -> dict[str, Any]:
    b = batch(k, node, gpus, **fields)
    return {"kind": "windows", "src": src, "job_id": b.job_id, "window_start_ms":
            b.window_start_ms, "window_end_ms": b.window_end_ms, "windows": b.windows}  # fmt: skip


def heartbeat(src: int, k: int) -> dict[str, Any]:
    return {"kind": "watermark", "src": src, "closed_until_ms": k * WINDOW_MS}


def stream() -> list[dict[str, Any]]:
    """What stage 2 sends on one channel: both sources' batches and heartbeats; every GPU
    drops its clock from window 6 (a JOB_WIDE finding that the detector state must not
    repeat), and b misses windows 3, 4 and the last (released by the watermark; the last by
    heartbeats alone); then one more heartbeat of each source (they go on after the job:
    watermarks are not kept across a restart, a source's next heartbeat brings it back)."""
    out: list[dict[str, Any]] = []
    for k in range(10):
        clk = {"clk_ratio": 0.80 if k >= 6 else 0.90}
        out += [message(k, "a", [0, 1], 0, **clk), heartbeat(0, k + 1)]
        if k not in (3, 4, 9):
            out.append(message(k, "b", [0, 1], 1, **clk))
        out.append(heartbeat(1, k + 1))
    return [*out, heartbeat(0, 11), heartbeat(1, 11)]


class Driver:
    """What the live agent does around the releaser, with dicts for its changelog tables."""

    def __init__(self, jobs: dict[str, dict[str, Any]], pending: dict[str, dict[str, Any]]):
        self.jobs, self.pending = jobs, pending
        self.stage = releaser(fan_out_job_wide=True)
        self.out: list[Any] = []
        for key in list(pending):  # at start: every job with windows pending
            self.restore(PendingEntry.from_key(key).job_id)

    def restore(self, job_id: str) -> None:
        if not self.stage.seen(job_id):
            mine = [m for k, m in self.pending.items() if PendingEntry.from_key(k).job_id == job_id]
            for entry in self.stage.restore(job_id, self.jobs.get(job_id, {}), mine):
                del self.pending[entry.key]

    def feed(self, msg: dict[str, Any]) -> None:
        if msg["kind"] == "watermark":
            got = self.stage.heartbeat(msg["src"], msg["closed_until_ms"], channel=4)
        else:
            b, src = batch_of_message(msg)
            self.restore(b.job_id)
            if not self.stage.add(b, src, channel=4):
                return
            self.pending[PendingEntry(b.job_id, b.window_start_ms, src).key] = {**msg, "channel": 4}
            got = self.stage.release(b.job_id)
        for entry in got.retired:
            del self.pending[entry.key]
        self.jobs.update(got.saved)
        self.out += [(r.window_start_ms, scored(r).in_place(), r.result.findings, r.to_nodes)
                     for r in got.releases]  # fmt: skip


def test_recovery_from_the_tables_gives_the_releases_of_a_run_without_restart() -> None:
    msgs = stream()
    whole = Driver({}, {})
    for m in msgs:
        whole.feed(m)
    assert [s // WINDOW_MS for s, *_ in whole.out] == list(range(10))
    assert [f["status"] for *_, fs, _ in whole.out for f in fs] == ["JOB_WIDE"]
    assert whole.pending == {}
    for cut in range(1, len(msgs)):
        first = Driver({}, {})
        for m in msgs[:cut]:
            first.feed(m)
        # A new process: only the tables survive (as their changelogs would restore them).
        again = Driver(dict(first.jobs), dict(first.pending))
        for m in msgs[cut:]:
            again.feed(m)
        assert first.out + again.out == whole.out, f"restart after message {cut}"


def test_recovery_drops_entries_of_windows_already_released() -> None:
    stage = releaser()
    stale = message(0, "a", [0, 1], 0)
    assert stage.restore("7", {"released_ms": 0}, [stale, message(1, "a", [0, 1], 0)]) == [
        PendingEntry("7", 0, 0)
    ]
    assert stage.stage.pending["7"].keys() == {WINDOW_MS}


@pytest.mark.parametrize("fan_out", [True, False])
def test_a_job_wide_finding_goes_to_every_node_of_the_job(fan_out: bool) -> None:
    stage = releaser({"b": [1], "a": [0]}, fan_out_job_wide=fan_out)
    routed = []
    for k in range(8):
        clk = {"clk_ratio": 0.80 if k >= 6 else 0.90}
        stage.add(batch(k, "a", [0], **clk), src=0)
        stage.add(batch(k, "b", [1], **clk), src=1)
        routed += [(f, to) for r in stage.release("7").releases
                   for f, to in zip(r.result.findings, r.to_nodes, strict=True)]  # fmt: skip
    [(finding, copies)] = routed
    assert finding["status"] == "JOB_WIDE" and finding["node"] is None
    if fan_out:
        assert copies == [{**finding, "node": "a"}, {**finding, "node": "b"}]
    else:
        assert copies == []


def test_a_node_finding_goes_to_its_node_only() -> None:
    def nodes() -> list[str]:
        raise AssertionError("not asked for a finding with a node")

    finding = {"status": "SUSPECT", "node": "a", "gpu_index": 1}
    assert route_finding(finding, nodes, True) == [finding]
    assert route_finding({"status": "SUSPECT", "node": None}, nodes, True) == []


def test_prune_forgets_an_ended_job_entirely_released_window_included() -> None:
    stage = releaser()
    assert stage.low_watermark_ms() is None
    stage.add(batch(0, "a", [0, 1]), src=0)
    stage.add(batch(0, "b", [0, 1]), src=1)
    assert starts(stage.release("7")) == [0]
    stage.heartbeat(0, WINDOW_MS)
    stage.heartbeat(1, 3 * WINDOW_MS)
    assert stage.low_watermark_ms() == WINDOW_MS
    idle_ms = 10 * WINDOW_MS
    stage.prune(5 * WINDOW_MS, idle_ms)  # not idle long enough: everything kept
    assert "7" in stage.stage.released and "7" in stage.stage.states
    stage.prune(20 * WINDOW_MS, idle_ms)
    assert stage.stage.released == {} and stage.stage.states == {} and stage.channel_of == {}
    assert not stage.seen("7")


class CountingTable(AllocationTable):
    """The allocation table, keeping what stage 3 asked of it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def job(self, job_id: str) -> Any:
        self.asked.append("job")
        return super().job(job_id)

    def nodes_of(self, job_id: str) -> list[str]:
        self.asked.append("nodes_of")
        return super().nodes_of(job_id)


def test_a_job_whose_oldest_window_is_not_judged_is_passed_over_unasked() -> None:
    """Most heartbeats and verdicts find a channel's jobs waiting for the fleet watch: neither
    their context nor their watermark (a walk over the job's nodes) is made for nothing."""
    table = CountingTable()
    table.apply_event(started("7", JOB_7))
    table.apply_event(started("8", {"c": [0, 1]}))
    stage = JobReleaser(SETTINGS_30S, table, partition_of=SOURCE.__getitem__, fleet_sources=3)
    stage.add(batch(0, "a", [0, 1]), src=0)
    stage.add(batch(0, "b", [0, 1]), src=1)  # complete
    job_8 = [{**window("8", 0, 0), "node": "c", "gpu_index": g} for g in (0, 1)]
    stage.add(JobWindowBatch("8", 0, WINDOW_MS, job_8), src=2, channel=3)  # complete
    table.asked.clear()
    far = 20 * WINDOW_MS
    assert starts(stage.heartbeats({0: far, 1: far})) == []  # source 2 not heard from
    assert starts(stage.verdict({"until": None, "shifted": {}}, 3)) == []
    assert starts(stage.release("7", "8")) == []
    assert table.asked == []
    assert starts(stage.heartbeat(2, far)) == [0]  # job 7, judged now
    assert table.asked == ["job", "nodes_of"]
    assert starts(stage.verdict({"until": far, "shifted": {}}, 3)) == [0]  # job 8


def _releaser_pair() -> tuple[JobReleaser, JobReleaser]:
    """Two releasers of jobs 7 (nodes a, b) and 8 (b, c) over three sources; the second asks
    :meth:`JobStage.release_job` for every job, as the release did before it passed over
    the jobs whose oldest window waits for the fleet watch."""
    pair = []
    for _ in range(2):
        table = AllocationTable()
        table.apply_event(started("7", JOB_7))
        table.apply_event(started("8", {"b": [2, 3], "c": [0, 1]}))
        pair.append(JobReleaser(replace(SETTINGS_30S, job_wide_report_min_gpus=1), table,
                                partition_of=SOURCE.__getitem__, fleet_sources=3,
                                grace_ms=WINDOW_MS, fan_out_job_wide=True))  # fmt: skip
        for channel in (0, 3):  # every source heard from: the steps move the marks on
            pair[-1].heartbeats(dict.fromkeys(range(3), 0), channel)
    pair[1].stage.oldest_judged = lambda *_: True  # type: ignore[method-assign]
    return pair[0], pair[1]


_NODE_GPUS = {"7": {"a": [0, 1], "b": [0, 1]}, "8": {"b": [2, 3], "c": [0, 1]}}
_until = st.integers(0, 8).map(lambda k: k * WINDOW_MS)
_steps = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(["7", "8"]), st.integers(0, 6),
              st.integers(0, 1), st.booleans(), st.sampled_from([0, 3])),
    st.tuples(st.just("beat"), st.sampled_from([0, 3]),
              st.dictionaries(st.integers(0, 2), _until, min_size=1)),
    st.tuples(st.just("verdict"), _until),
    st.tuples(st.just("release"), st.sampled_from(["7", "8"])),
), min_size=8, max_size=40)  # fmt: skip


def _step(stage: JobReleaser, step: tuple[Any, ...]) -> Released | None:
    if step[0] == "add":
        _, job_id, k, i, slow, channel = step
        node, gpus = sorted(_NODE_GPUS[job_id].items())[i]
        ws = [{**window(job_id, 0, k, clk_ratio=0.8 if slow else 0.9), "node": node,
               "gpu_index": g} for g in gpus]  # fmt: skip
        b = JobWindowBatch(job_id, k * WINDOW_MS, (k + 1) * WINDOW_MS, ws)
        stage.add(b, SOURCE[node], channel=channel)
        return None
    if step[0] == "beat":
        return stage.heartbeats(step[2], channel=step[1])
    if step[0] == "verdict":
        return stage.verdict({"until": step[1], "shifted": {}}, 3)
    return stage.release(step[1])


def _seen(got: Released | None) -> Any:
    if got is None:
        return None
    releases = [(r.context, r.window_start_ms, r.result.findings, r.result.windows, r.to_nodes)
                for r in got.releases]  # fmt: skip
    return releases, got.retired, dict(got.saved), got.fleet


@settings(max_examples=150, deadline=None)
@given(_steps)
def test_passing_over_unjudged_jobs_releases_what_asking_every_job_released(
    steps: list[tuple[Any, ...]],
) -> None:
    fast, every = _releaser_pair()
    for step in steps:
        assert _seen(_step(fast, step)) == _seen(_step(every, step)), step
    assert fast.stage.pending.keys() == every.stage.pending.keys()
    assert fast.stage.released == every.stage.released
