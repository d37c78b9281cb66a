"""The allocation table: ownership intervals at event time, requeues, pruning, state."""

from __future__ import annotations

import json
from typing import Any

import pytest

from peerwatch.streams.core.allocation import AllocationTable, split_by_node
from peerwatch.streams.core.model import InvalidRecordError

T0 = 1_767_225_600_000


def event(kind: str, ts_s: float, job: str = "1", allocs: dict[str, list[int]] | None = None,
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    value: dict[str, Any] = {
        "event_id": f"{job}-{kind}-{ts_s}",
        "job_id": job,
        "kind": kind,
        "ts_ms": T0 + int(ts_s * 1000),
        "user": "alice",
        "partition": "gpu",
        "account": "proj",
        "allocations": [{"node": n, "gpu_indices": g} for n, g in (allocs or {}).items()],
    }
    value.update(extra)
    return value


def ms(s: float) -> int:
    return T0 + int(s * 1000)


def test_started_and_ended_make_half_open_intervals() -> None:
    t = AllocationTable()
    assert t.apply_event(event("STARTED", 10, allocs={"n1": [0, 1], "n2": [0]})) == ["n1", "n2"]
    t.apply_event(event("ENDED", 100, allocs={"n1": [0, 1], "n2": [0]}))
    assert t.owner("n1", 0, ms(9.999)) is None
    assert t.owner("n1", 0, ms(10)) == "1"
    assert t.owner("n2", 0, ms(99.999)) == "1"
    assert t.owner("n2", 0, ms(100)) is None
    assert t.owner("n1", 2, ms(50)) is None
    meta = t.job("1")
    assert meta is not None
    assert (meta.user, meta.partition, meta.account) == ("alice", "gpu", "proj")
    assert meta.expected_gpus == 3


def test_late_sample_goes_to_the_job_that_owned_the_gpu_then() -> None:
    t = AllocationTable()
    t.apply_event(event("STARTED", 0, job="A", allocs={"n1": [0]}))
    t.apply_event(event("ENDED", 60, job="A", allocs={"n1": [0]}))
    t.apply_event(event("STARTED", 61, job="B", allocs={"n1": [0]}))
    assert t.owner("n1", 0, ms(59)) == "A"
    assert t.owner("n1", 0, ms(60.5)) is None
    assert t.owner("n1", 0, ms(70)) == "B"


def test_a_new_owner_closes_an_interval_left_open() -> None:
    t = AllocationTable()
    t.apply_event(event("STARTED", 0, job="A", allocs={"n1": [0]}))
    t.apply_event(event("STARTED", 30, job="B", allocs={"n1": [0]}))  # A's end was lost
    assert t.owner("n1", 0, ms(29)) == "A"
    assert t.owner("n1", 0, ms(31)) == "B"


def test_ended_without_allocations_closes_every_node_of_the_job() -> None:
    t = AllocationTable()
    t.apply_event(event("STARTED", 0, allocs={"n1": [0], "n2": [3]}))
    assert t.apply_event(event("ENDED", 50)) == ["n1", "n2"]
    assert t.owner("n2", 3, ms(49)) == "1"
    assert t.owner("n2", 3, ms(51)) is None


def test_requeue_and_restart() -> None:
    t = AllocationTable()
    t.apply_event(event("STARTED", 0, allocs={"n1": [0, 1]}, start_ms=ms(0)))
    t.apply_event(event("REQUEUED", 300, allocs={"n1": [0, 1]}, end_ms=ms(300)))
    assert t.owner("n1", 0, ms(350)) is None
    t.apply_event(event("STARTED", 400, allocs={"n3": [4, 5]}, start_ms=ms(400)))
    meta = t.job("1")
    assert meta is not None
    assert meta.requeue_ms == ms(300) and meta.start_ms == ms(400)
    assert meta.alloc == {"n3": [4, 5]}  # the new run's allocation only
    ctx = meta.context()
    assert ctx.expected_gpus == 2 and ctx.anchor_ms == ms(400)
    assert t.owner("n1", 0, ms(100)) == "1" and t.owner("n3", 4, ms(450)) == "1"


def test_events_are_idempotent() -> None:
    t = AllocationTable()
    started = event("STARTED", 0, allocs={"n1": [0]})
    t.apply_event(started)
    version = t.version("n1")
    assert t.apply_event(started) == []
    assert t.version("n1") == version


def test_updated_replaces_the_gpu_set_from_its_time() -> None:
    t = AllocationTable()
    t.apply_event(event("STARTED", 0, allocs={"n1": [0, 1]}))
    t.apply_event(event("UPDATED", 100, allocs={"n1": [1, 2]}))
    assert t.owner("n1", 0, ms(99)) == "1" and t.owner("n1", 0, ms(101)) is None
    assert t.owner("n1", 2, ms(99)) is None and t.owner("n1", 2, ms(101)) == "1"
    assert t.job("1").expected_gpus == 2  # type: ignore[union-attr]


def test_segment_gives_owners_and_the_span_they_hold() -> None:
    t = AllocationTable()
    t.apply_event(event("STARTED", 10, job="A", allocs={"n1": [0]}))
    t.apply_event(event("STARTED", 20, job="B", allocs={"n1": [1]}))
    t.apply_event(event("ENDED", 40, job="A", allocs={"n1": [0]}))
    owners, lo, hi = t.segment("n1", ms(25))
    assert owners == {0: "A", 1: "B"} and (lo, hi) == (ms(20), ms(40))
    owners, lo, hi = t.segment("n1", ms(45))
    assert owners == {1: "B"} and (lo, hi) == (ms(40), None)


def test_prune_forgets_old_intervals_and_jobs_but_keeps_running_ones() -> None:
    t = AllocationTable(retention_ms=60_000)
    t.apply_event(event("STARTED", 0, job="old", allocs={"n1": [0]}))
    t.apply_event(event("ENDED", 10, job="old", allocs={"n1": [0]}))
    t.apply_event(event("STARTED", 0, job="run", allocs={"n1": [1]}))
    assert t.prune(ms(50)) == 0
    assert t.prune(ms(100)) == 1
    assert t.job("old") is None and t.owner("n1", 0, ms(5)) is None
    assert t.job("run") is not None and t.owner("n1", 1, ms(5)) == "run"


def test_state_round_trips_through_json() -> None:
    t = AllocationTable()
    t.apply_event(event("STARTED", 0, allocs={"n1": [0, 1], "n2": [7]}))
    t.apply_event(event("REQUEUED", 90, allocs={"n1": [0, 1], "n2": [7]}))
    back = AllocationTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back.to_dict() == t.to_dict()
    assert back.owner("n2", 7, ms(50)) == "1" and back.owner("n2", 7, ms(95)) is None


def test_rekeying_by_node() -> None:
    t = AllocationTable()
    e = event("STARTED", 0, allocs={"n1": [0], "n2": [1, 2]})
    t.apply_event(e)
    parts = split_by_node(e)
    assert [n for n, _ in parts] == ["n1", "n2"]
    assert parts[1][1]["allocations"] == [{"node": "n2", "gpu_indices": [1, 2]}]
    # An ENDED without allocations is routed with the job-keyed table's knowledge.
    assert [n for n, _ in split_by_node(event("ENDED", 9), t)] == ["n1", "n2"]
    part = t.for_nodes(["n2"])
    assert part.nodes() == ["n2"] and part.owner("n2", 1, ms(1)) == "1"
    assert part.owner("n1", 0, ms(1)) is None
    node_table = AllocationTable()
    for node, ev in parts:
        if node == "n2":
            node_table.apply_event(ev)
    assert node_table.owner("n2", 2, ms(1)) == "1" and node_table.nodes() == ["n2"]


@pytest.mark.parametrize("missing", ["job_id", "kind", "ts_ms"])
def test_event_without_key_field_raises(missing: str) -> None:
    e = event("STARTED", 0, allocs={"n1": [0]})
    del e[missing]
    with pytest.raises(InvalidRecordError):
        AllocationTable().apply_event(e)
