"""Stage 3's network comparison in the live worker (streams/live/job_network.py, called by the
jobs handler): network messages of the window-batches topic held per job, compared at each
released window as offline, each job's memory in the job table across a rebalance; hostile
network messages refused with a record error (the agent dead-letters them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from peerwatch.streams.core.detector import DetectionResult
from peerwatch.streams.core.job_stage import Release
from peerwatch.streams.core.model import JobContext
from peerwatch.streams.core.network_jobs import (
    JobNetwork,
    JobPorts,
    job_ports_json,
    job_ports_messages,
    job_ports_of_json,
)
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.handlers import RECORD_ERRORS
from peerwatch.streams.live.job_network import NETWORK_KEY, LiveJobNetwork
from tests.unit.test_network_peers import WAITING, W, job, named
from tests.unit.test_stream_handlers import jobs_handler


def message(k: int, **odd: dict[str, float]) -> dict[str, Any]:
    nodes = job(32, start=k * W, seed=k, **odd)
    jp = JobPorts("j1", k * W, (k + 1) * W, {n: tuple(p) for n, p in nodes.items()})
    return json.loads(json.dumps(job_ports_json(jp)))


def release(k: int, sm: float) -> Release:
    return Release(JobContext("j1"), k * W, DetectionResult(job_sm=sm), [])


SMS = [0.8] * 5 + [0.5] * 5


def run(live: LiveJobNetwork, first: int, last: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(first, last):
        live.add(message(k, n17=WAITING))
        out += live.release(release(k, SMS[k]), W)
    return out


def test_live_names_what_the_offline_job_network_names() -> None:
    offline = JobNetwork()
    want = []
    for k, sm in enumerate(SMS):
        offline.add(JobPorts(**_ports(k)))
        want += offline.release("j1", k * W, (k + 1) * W, False, sm, None)
    got = run(LiveJobNetwork(JobNetwork(), {}, StreamCounters()), 0, len(SMS))
    assert got == want and named(got) == [("n17", "mlx5_0/1", "CONFIRMED")]


def _ports(k: int) -> dict[str, Any]:
    nodes = job(32, start=k * W, seed=k, n17=WAITING)
    return {"job_id": "j1", "start_ms": k * W, "end_ms": (k + 1) * W,
            "nodes": {n: tuple(p) for n, p in nodes.items()}}  # fmt: skip


def test_a_rebalance_mid_episode_restores_the_job_from_the_table() -> None:
    whole = run(LiveJobNetwork(JobNetwork(), {}, StreamCounters()), 0, len(SMS))
    table: dict[bytes, Any] = {}
    live = LiveJobNetwork(JobNetwork(), table, StreamCounters())
    head = run(live, 0, 6)
    assert NETWORK_KEY.format(job="j1").encode() in table
    live.forget()  # partitions revoked: memory gone, the table stays
    assert live.network.paces == {}
    assert head + run(live, 6, len(SMS)) == whole


def test_a_damaged_saved_memory_is_counted_dropped_and_the_job_goes_on() -> None:
    counters = StreamCounters()
    table: dict[bytes, Any] = {NETWORK_KEY.format(job="j1").encode(): {"peers": 5}}
    live = LiveJobNetwork(JobNetwork(), table, counters)
    run(live, 0, 2)
    assert counters.state_damaged == 1
    assert table[NETWORK_KEY.format(job="j1").encode()]["last_window"] == W


def test_a_job_without_nic_data_writes_nothing_to_the_table() -> None:
    table: dict[bytes, Any] = {}
    live = LiveJobNetwork(JobNetwork(), table, StreamCounters())
    for k in range(6):
        assert live.release(release(k, 0.8), W) == []
    assert table == {}


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "network"},
        {**message(0), "start": "0"},
        {**message(0), "nodes": {"n00": [{"name": "mlx5_0/1"}]}},
        {**message(0), "job_id": None},
    ],
)
def test_a_hostile_network_message_is_refused_with_a_record_error(value: dict[str, Any]) -> None:
    handler, job_table, _ = jobs_handler()
    with pytest.raises(RECORD_ERRORS):
        handler.handle("b", 0, b"j1", json.dumps(value).encode())
    assert job_table == {}


def test_the_jobs_handler_holds_a_network_message_for_its_window() -> None:
    handler, job_table, _ = jobs_handler()
    sent = job_ports_messages(job_ports_of_json(message(3)))  # as the hot stage sends them
    assert [handler.handle("b", 0, b"j1", m) for m in sent] == [[]]
    # held in memory until the window's release; the job table is written at the comparison
    assert ("j1", 3 * W) in handler.network.network.held and job_table == {}
