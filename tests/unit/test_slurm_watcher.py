"""The watcher's diffing on recorded Slurm 22.05 output and constructed 23.11-25.11 shapes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from peerwatch.producers.slurm.parse import (
    SlurmJob,
    SlurmNode,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
)
from peerwatch.producers.slurm.watch_loop import JsonLinesSink, StateFile, poll_once, run_watch
from peerwatch.producers.slurm.watcher import (
    WatchEvent,
    WatchState,
    diff,
    restart_counts,
    vanished_jobs,
)
from peerwatch.schemas.codec import AvroCodec

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
NOW_MS = 1_795_949_900_000


def doc(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def jobs(name: str) -> list[SlurmJob]:
    return parse_squeue(doc(name))


def nodes(name: str) -> list[SlurmNode]:
    return parse_sinfo(doc(name))


def kinds(events: Sequence[WatchEvent]) -> list[tuple[str, str]]:
    return [(e.key, e.record["kind"]) for e in events if e.schema == "JobEvent"]


def by_kind(events: Sequence[WatchEvent], kind: str) -> dict[str, dict[str, Any]]:
    return {e.key: e.record for e in events if e.record.get("kind") == kind}


def node_events(events: Sequence[WatchEvent]) -> list[dict[str, Any]]:
    return [e.record for e in events if e.schema == "NodeStateEvent"]


def replay_22_05() -> list[tuple[WatchState, list[WatchEvent]]]:
    """The recorded 22.05 session: one job, then five jobs sharing the node, then all ended."""
    steps = [
        ("22.05/squeue-one-running.json", "22.05/sinfo-mixed.json"),
        ("22.05/squeue-running-pending.json", "22.05/sinfo-allocated.json"),
        ("22.05/squeue-running-pending.json", "22.05/sinfo-draining.json"),
        ("22.05/squeue-finished.json", "22.05/sinfo-drained.json"),
        ("22.05/squeue-finished.json", "22.05/sinfo-idle.json"),
    ]
    state = WatchState()
    out = []
    for i, (squeue, sinfo) in enumerate(steps):
        state, events = diff(state, jobs(squeue), nodes(sinfo), NOW_MS + i * 10_000)
        out.append((state, events))
    return out


def test_22_05_session_reports_each_transition_once() -> None:
    steps = replay_22_05()
    first, second, third, fourth, fifth = (events for _, events in steps)
    assert kinds(first) == [("1", "SUBMITTED"), ("1", "STARTED")]
    assert by_kind(first, "STARTED")["1"]["allocations"] == [
        {"node": "vm", "gpu_indices": [0, 1, 2]}
    ]
    assert sorted(kinds(second)) == sorted(
        [("2_0", "SUBMITTED"), ("2_0", "STARTED"), ("3", "SUBMITTED"), ("3", "STARTED"),
         ("4", "SUBMITTED"), ("2_1", "SUBMITTED"), ("2_1", "STARTED"), ("2_2", "SUBMITTED")]
    )  # fmt: skip
    assert kinds(third) == []
    ended = by_kind(fourth, "ENDED")
    assert set(ended) == {"1", "2_0", "2_1", "2_2", "3", "4", "7", "8", "9"}
    assert (ended["8"]["state"], ended["8"]["exit_code"]) == ("FAILED", 3)
    assert (ended["9"]["state"], ended["9"]["exit_code"]) == ("CANCELLED", None)
    assert (ended["7"]["state"], ended["7"]["exit_code"]) == ("COMPLETED", 0)
    # Finished jobs lose their GRES detail in squeue: ENDED keeps what the running job had.
    assert ended["1"]["allocations"] == [{"node": "vm", "gpu_indices": [0, 1, 2]}]
    assert ended["3"]["allocations"] == [{"node": "vm", "gpu_indices": [5, 6]}]
    # A job cancelled while pending never started and owns nothing.
    assert ended["4"]["start_ms"] is None and ended["4"]["allocations"] == []
    assert ended["8"]["end_ms"] == 1_795_949_816_000
    assert kinds(fifth) == []


def test_jobs_sharing_the_node_have_disjoint_gpus() -> None:
    _, second = replay_22_05()[1]
    started = {**by_kind(replay_22_05()[0][1], "STARTED"), **by_kind(second, "STARTED")}
    owned = [i for r in started.values() for a in r["allocations"] for i in a["gpu_indices"]]
    assert sorted(owned) == [0, 1, 2, 3, 4, 5, 6] == sorted(set(owned))


def test_node_events_on_drain_only() -> None:
    steps = replay_22_05()
    per_step = [node_events(events) for _, events in steps]
    # First sight publishes the baseline; MIXED -> ALLOCATED is not a node-state change.
    assert [r["state"] for r in per_step[0]] == ["MIXED"]
    assert per_step[1] == []
    [drain] = per_step[2]
    assert drain["flags"] == ["DRAIN"]
    assert drain["reason"] == "peerwatch: sm clock 12% below peers"
    assert drain["reason_user"] == "root" and drain["reason_set_ms"] == 1_795_949_814_000
    assert per_step[3] == []  # draining -> drained: same drain, same reason
    [resume] = per_step[4]
    assert (resume["state"], resume["flags"], resume["reason"]) == ("IDLE", [], None)
    ids = [per_step[0][0]["event_id"], drain["event_id"], resume["event_id"]]
    assert len(set(ids)) == 3


def test_same_slurm_state_gives_the_same_ids_and_nothing_after_a_restart(tmp_path: Path) -> None:
    a = replay_22_05()
    b = replay_22_05()
    ids_a = [e.record["event_id"] for _, events in a for e in events]
    assert ids_a == [e.record["event_id"] for _, events in b for e in events]
    assert len(ids_a) == len(set(ids_a))
    state_file = StateFile(tmp_path / "state.json")
    state_file.save(a[1][0])
    reloaded = state_file.load()
    assert reloaded == a[1][0]
    again, events = diff(
        reloaded, jobs("22.05/squeue-running-pending.json"), nodes("22.05/sinfo-allocated.json"), 1
    )
    assert events == []
    assert {k: replace(m, last_seen_ms=0) for k, m in again.jobs.items()} == {
        k: replace(m, last_seen_ms=0) for k, m in reloaded.jobs.items()
    }


def test_corrupt_state_file_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    assert StateFile(path).load() == WatchState()
    assert (tmp_path / "state.json.corrupt").exists()


def test_vanished_job_is_closed_from_sacct() -> None:
    state, _ = diff(WatchState(), jobs("22.05/squeue-running-pending.json"), None, NOW_MS)
    assert vanished_jobs(state, []) == ["1", "2_0", "2_1", "2_2", "3", "4"]
    accounted = parse_sacct(doc("22.05/sacct.json"))
    state, events = diff(state, [], None, NOW_MS + 1000, accounted=accounted)
    ended = by_kind(events, "ENDED")
    assert set(ended) == {"1", "2_0", "2_1", "3", "4"}  # 2_2 is only a bitmap record in sacct
    assert ended["3"]["state"] == "CANCELLED"
    assert ended["3"]["end_ms"] == 1_795_949_814_000
    assert ended["3"]["allocations"] == [{"node": "vm", "gpu_indices": [5, 6]}]
    assert list(state.jobs) == ["2_2"]


def test_sacct_zero_exit_code_of_a_failed_job_is_not_trusted() -> None:
    running = replace(jobs("22.05/squeue-one-running.json")[0], job_id="8")
    state, _ = diff(WatchState(), [running], None, NOW_MS)
    [failed] = [j for j in parse_sacct(doc("22.05/sacct.json")) if j.job_id == "8"]
    _, events = diff(state, [], None, NOW_MS, accounted=[failed])
    assert (by_kind(events, "ENDED")["8"]["state"], by_kind(events, "ENDED")["8"]["exit_code"]) == (
        "FAILED",
        None,
    )


def test_vanished_job_unknown_to_sacct_waits_then_closes() -> None:
    state, _ = diff(WatchState(), jobs("22.05/squeue-one-running.json"), None, NOW_MS)
    state, events = diff(state, [], None, NOW_MS + 1000, accounted=[], vanish_grace_ms=60_000)
    assert events == [] and "1" in state.jobs
    state, events = diff(state, [], None, NOW_MS + 61_000, accounted=[], vanish_grace_ms=60_000)
    [ended] = by_kind(events, "ENDED").values()
    assert ended["state"] is None and ended["ts_ms"] == NOW_MS
    assert state.jobs == {}


def test_requeue_reports_requeued_and_a_new_start() -> None:
    [job] = jobs("22.05/squeue-one-running.json")
    state, _ = diff(WatchState(), [job], None, NOW_MS, restarts={"1": 0})
    pending = replace(job, state="PENDING", nodes=(), gpu_indices={}, start_ts_ms=None)
    state, events = diff(state, [pending], None, NOW_MS + 1000, restarts={"1": 1})
    assert kinds(events) == [("1", "REQUEUED")]
    assert by_kind(events, "REQUEUED")["1"]["restart_count"] == 1
    rerun = replace(job, start_ts_ms=job.start_ts_ms + 60_000, gpu_indices={"vm": (4, 5, 6)})  # type: ignore[operator]
    state, events = diff(state, [rerun], None, NOW_MS + 2000, restarts={"1": 1})
    [started] = by_kind(events, "STARTED").values()
    assert started["restart_count"] == 1
    assert started["allocations"] == [{"node": "vm", "gpu_indices": [4, 5, 6]}]
    assert diff(state, [rerun], None, NOW_MS + 3000, restarts={"1": 1})[1] == []


def test_restart_counts_from_raw_squeue() -> None:
    counts = restart_counts(doc("22.05/squeue-running-pending.json"))
    assert counts == {"1": 0, "2_0": 0, "3": 0, "4": 0, "2_1": 0, "2_2": 0}
    assert restart_counts(doc("25.11/squeue.json")) == {}


@pytest.mark.parametrize("version", ["23.11", "24.05", "25.11"])
def test_newer_shapes(version: str) -> None:
    state, events = diff(
        WatchState(),
        jobs(f"{version}/squeue.json"),
        nodes(f"{version}/scontrol-show-nodes.json"),
        NOW_MS,
    )
    started = by_kind(events, "STARTED")
    assert started["1001"]["allocations"] == [
        {"node": "gpu01", "gpu_indices": list(range(8))},
        {"node": "gpu02", "gpu_indices": list(range(8))},
    ]
    assert started["1006"]["allocations"] == [{"node": "gpu03", "gpu_indices": [2, 5]}]
    assert "1002_[4-7]" not in {e.key for e in events}
    ended = by_kind(events, "ENDED")
    assert (ended["1003"]["state"], ended["1003"]["exit_code"]) == ("FAILED", 3)
    assert (ended["1004"]["state"], ended["1004"]["exit_code"]) == ("CANCELLED", None)
    by_node = {r["node"]: r for r in node_events(events)}
    assert by_node["gpu02"]["flags"] == ["DRAIN"]
    assert by_node["gpu04"]["state"] == "DOWN" and by_node["gpu04"]["reason"] == "Not responding"
    # The vanished 1001 is closed from accounting? No: sacct says it still runs.
    state, events = diff(
        state, [], None, NOW_MS + 1, accounted=parse_sacct(doc(f"{version}/sacct.json"))
    )
    ended = by_kind(events, "ENDED")
    assert "1001" not in ended and "1001" in state.jobs
    assert ended["1002_3"]["state"] == "COMPLETED"


def test_every_event_encodes_with_the_schemas() -> None:
    codecs = {"JobEvent": AvroCodec("JobEvent"), "NodeStateEvent": AvroCodec("NodeStateEvent")}
    for _, events in replay_22_05():
        for e in events:
            assert codecs[e.schema].decode(codecs[e.schema].encode(e.record)) == e.record


class FakeClient:
    """Serves recorded documents; counts sacct calls."""

    def __init__(self, squeue: str, sinfo: str, sacct: str | None = None) -> None:
        self.squeue, self.sinfo, self.sacct = squeue, sinfo, sacct
        self.sacct_since: list[int] = []

    def squeue_json(self) -> dict[str, Any]:
        return doc(self.squeue)

    def sacct_json(self, since_ms: int) -> dict[str, Any]:
        self.sacct_since.append(since_ms)
        if self.sacct is None:
            from peerwatch.errors import SlurmCommandError

            raise SlurmCommandError("sacct: accounting storage is disabled")
        return doc(self.sacct)

    def nodes_json(self) -> dict[str, Any]:
        return doc(self.sinfo)


def test_poll_once_asks_sacct_only_for_vanished_jobs() -> None:
    client = FakeClient(
        "22.05/squeue-one-running.json", "22.05/sinfo-mixed.json", "22.05/sacct.json"
    )
    state, events = poll_once(client, WatchState(), NOW_MS)
    assert client.sacct_since == [] and kinds(events) == [("1", "SUBMITTED"), ("1", "STARTED")]
    client.squeue = "25.11/squeue.json"  # job 1 vanished
    state, events = poll_once(client, state, NOW_MS + 1000)
    assert client.sacct_since == [1_795_949_807_000 - 3_600_000]
    assert by_kind(events, "ENDED")["1"]["state"] == "CANCELLED"


def test_run_watch_once_dry_run_prints_json_lines(tmp_path: Path) -> None:
    import io

    out = io.StringIO()
    client = FakeClient("22.05/squeue-finished.json", "22.05/sinfo-idle.json")
    topics = {"JobEvent": "p.jobs", "NodeStateEvent": "p.nodes"}
    run_watch(client, JsonLinesSink(out, topics), None, once=True, clock_ms=lambda: NOW_MS)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert {(x["topic"], x["value"]["kind"]) for x in lines if x["topic"] == "p.jobs"} == {
        ("p.jobs", "SUBMITTED"), ("p.jobs", "STARTED"), ("p.jobs", "ENDED")
    }  # fmt: skip
    assert [x["key"] for x in lines if x["topic"] == "p.nodes"] == ["vm"]


def test_run_watch_persists_state_after_publishing(tmp_path: Path) -> None:
    published: list[WatchEvent] = []

    class ListSink:
        def publish(self, event: WatchEvent) -> None:
            published.append(event)

    client = FakeClient("22.05/squeue-running-pending.json", "22.05/sinfo-allocated.json")
    state_file = StateFile(tmp_path / "w" / "state.json")
    run_watch(client, ListSink(), state_file, once=True, clock_ms=lambda: NOW_MS)
    first = len(published)
    assert first > 0
    run_watch(client, ListSink(), state_file, once=True, clock_ms=lambda: NOW_MS + 10_000)
    assert len(published) == first  # a restarted watcher publishes nothing new
