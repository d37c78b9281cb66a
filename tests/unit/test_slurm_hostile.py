"""Odd Slurm output (issue 12 item 6): each job or node entry that cannot be read is skipped with
a warning naming it and counted, the others are read, and the watcher loop keeps running."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from peerwatch.errors import SlurmCommandError
from peerwatch.producers.slurm.command import CommandResult, SlurmCommands, decode_output
from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.gres import parse_index_list
from peerwatch.producers.slurm.parse import (
    parse_sacct_jobs,
    parse_sinfo_nodes,
    parse_squeue,
    parse_squeue_jobs,
)
from peerwatch.producers.slurm.watch_loop import KafkaSink, WatchStats, poll_once, run_watch
from peerwatch.producers.slurm.watcher import WatchEvent, WatchState
from peerwatch.reasons import reason_is_clean, slurm_reason
from peerwatch.schemas.codec import AvroCodec

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
NOW_MS = 1_795_949_900_000


def doc(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / name).read_text())
    return loaded


def deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def hostile_jobs(base: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(what, job) for jobs that cannot be read, each a copy of ``base`` with one field made
    hostile and a job id of its own."""
    cases: list[tuple[str, dict[str, Any]]] = [
        ("exit_code.status as an int", {"exit_code": {"status": 3, "return_code": 1}}),
        ("job_state as an int", {"job_state": 7}),
        ("name as an int", {"name": 12}),
        ("submit_time beyond a long", {"submit_time": {"set": True, "number": 2**70}}),
        ("start_time beyond year 9999", {"start_time": 10**15}),
        ("GRES index beyond an int", {"gres_detail": ["gpu:1(IDX:99999999999999999999)"]}),
        ("a 5000-digit GRES index", {"gres_detail": ["gpu:1(IDX:" + "9" * 5000 + ")"]}),
        ("deeply nested name", {"name": deep(500)}),
        ("user_name as a list", {"user_name": ["root"]}),
    ]
    out = []
    for i, (what, change) in enumerate(cases):
        job = copy.deepcopy(base)
        job.update(change)
        job["job_id"] = 9000 + i
        out.append((what, job))
    return out


def test_each_hostile_squeue_job_is_skipped_alone_and_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = doc("25.11/squeue.json")
    good = parse_squeue(d)
    bad = hostile_jobs(d["jobs"][0])
    d["jobs"][1:1] = [job for _, job in bad]  # among the good ones
    jobs, skipped = parse_squeue_jobs(d)
    assert [j.job_id for j in jobs] == [j.job_id for j in good]
    assert [s.ident for s in skipped] == [str(9000 + i) for i in range(len(bad))]
    for (what, _), s in zip(bad, skipped, strict=True):
        assert f"squeue job {s.ident}" in s.reason, what
        assert len(s.reason) <= 500, what
    with pytest.raises(SlurmParseError):  # the strict reader still refuses the document
        parse_squeue(d)


def test_a_job_without_a_readable_id_is_skipped_with_no_name() -> None:
    d = doc("25.11/squeue.json")
    d["jobs"].append({"job_id": "x" * 10_000, "job_state": "RUNNING"})
    d["jobs"].append("not an object")
    d["jobs"].append({"job_id": {"number": True}})
    jobs, skipped = parse_squeue_jobs(d)
    assert len(jobs) == 6 and [s.ident for s in skipped] == [None, None, None]
    assert all(len(s.reason) <= 500 for s in skipped)


def test_user_text_with_control_characters_and_bad_bytes_is_kept_as_data() -> None:
    # Job names are set by users: newlines, escapes, NUL and bytes that are not UTF-8 (read as
    # U+FFFD) are data of the job, published as they are (the record is a string); a JSON
    # escape of a lone surrogate becomes U+FFFD (no record could carry it).
    raw = (DATA / "25.11/squeue.json").read_bytes()
    raw = raw.replace(b'"train-llm"', b'"train\\n\\u0000\\u001b[31m\xff\xfe\\ud800-llm"', 1)
    jobs, skipped = parse_squeue_jobs(json.loads(decode_output(raw)))
    assert not skipped
    name = next(j.name for j in jobs if j.job_id == "1001")
    assert name == "train\n\x00\x1b[31m\ufffd\ufffd\ufffd-llm"
    record = {"event_id": "e", "job_id": "1001", "kind": "SUBMITTED", "ts_ms": NOW_MS,
              "source": "WATCHER", "job_name": name}  # fmt: skip
    assert AvroCodec("JobEvent").decode(AvroCodec("JobEvent").encode(record))["job_name"] == name
    # What reaches scontrol's Reason= goes through the one sanitiser: none of it survives.
    reason = slurm_reason(f"job {name} on gpu1")
    assert reason == "peerwatch: job train [31m -llm on gpu1" and reason_is_clean(reason)


def test_deep_or_huge_json_is_a_parse_error_not_a_crash() -> None:
    outputs = {
        "squeue": "[" * 200_000 + "]" * 200_000,  # RecursionError inside json
        "sacct": '{"jobs": [' + "9" * 10_000 + "]}",  # int beyond Python's digit limit
        "sinfo": "\xff\xfe not json",
    }

    def runner(argv: Any, timeout_s: float) -> CommandResult:
        return CommandResult(0, outputs[Path(argv[0]).name], "")

    commands = SlurmCommands(None, 5.0, runner)
    for name in outputs:
        with pytest.raises(SlurmParseError, match="printed no JSON"):
            commands.run_json(name, "--json")


def test_hostile_sacct_jobs_and_nodes_are_skipped_alone() -> None:
    d = doc("25.11/sacct.json")
    n = len(d["jobs"])
    extra = copy.deepcopy(d["jobs"][0])
    extra["job_id"] = 777
    extra["exit_code"] = {"status": {"nested": 1}}
    d["jobs"].append(extra)
    jobs, skipped = parse_sacct_jobs(d)
    assert len(jobs) == n and [s.ident for s in skipped] == ["777"]
    nodes_doc = doc("25.11/scontrol-show-nodes.json")
    count = len(nodes_doc["nodes"])
    odd = copy.deepcopy(nodes_doc["nodes"][0])
    odd["name"] = "gpu-odd"
    odd["reason_changed_at"] = {"set": True, "number": 2**64}
    nodes_doc["nodes"].insert(0, odd)
    nodes_doc["nodes"].append({"name": 5})
    nodes, bad = parse_sinfo_nodes(nodes_doc)
    assert len(nodes) == count and [b.ident for b in bad] == ["gpu-odd", None]
    with pytest.raises(SlurmParseError, match="'nodes' list"):
        parse_sinfo_nodes({"nodes": "all"})


def test_gres_index_limits() -> None:
    assert parse_index_list("0-3,65535") == (0, 1, 2, 3, 65535)
    for text in ("65536", "1-99999999", "9" * 5000):
        with pytest.raises(SlurmParseError, match="beyond 65535"):
            parse_index_list(text)


class DocClient:
    """Serves documents held in memory (changed between polls by the test)."""

    def __init__(self, squeue: dict[str, Any], nodes: dict[str, Any]) -> None:
        self.squeue, self.nodes = squeue, nodes
        self.sacct_asked = 0

    def squeue_json(self) -> dict[str, Any]:
        return copy.deepcopy(self.squeue)

    def sacct_json(self, since_ms: int) -> dict[str, Any]:
        self.sacct_asked += 1
        raise SlurmCommandError("sacct: not in this test")

    def nodes_json(self) -> dict[str, Any]:
        return copy.deepcopy(self.nodes)


def test_a_job_that_turns_unreadable_is_held_not_closed(caplog: pytest.LogCaptureFixture) -> None:
    squeue, nodes = doc("25.11/squeue.json"), doc("25.11/scontrol-show-nodes.json")
    client = DocClient(squeue, nodes)
    stats = WatchStats()
    state, _ = poll_once(client, WatchState(), NOW_MS, stats=stats)
    assert "1001" in state.jobs and stats.skipped_jobs == 0
    # Poll 2: job 1001's exit code is an int-status object now; its node's record is odd.
    squeue["jobs"][0]["exit_code"] = {"status": 1}
    nodes["nodes"][0]["state"] = 17
    with caplog.at_level(logging.WARNING):
        state2, events2 = poll_once(client, state, NOW_MS + 10_000, stats=stats)
    assert stats.skipped_jobs == 1 and stats.skipped_nodes == 1
    assert "squeue job '1001' skipped" in caplog.text
    assert events2 == [] and client.sacct_asked == 0  # not vanished: nothing closed
    assert state2.jobs["1001"] == state.jobs["1001"]
    assert state2.nodes == state.nodes
    # Readable again: nothing new to say.
    squeue["jobs"][0] = doc("25.11/squeue.json")["jobs"][0]
    nodes["nodes"][0] = doc("25.11/scontrol-show-nodes.json")["nodes"][0]
    _, events3 = poll_once(client, state2, NOW_MS + 20_000, stats=stats)
    assert events3 == []


def test_an_event_no_record_holds_is_counted_and_the_rest_published() -> None:
    # A job's node list holding a JSON-escaped lone surrogate: its events cannot be encoded
    # (EncodeError, raised where the loop did not catch it); every other event is published.
    squeue, nodes = doc("25.11/squeue.json"), doc("25.11/scontrol-show-nodes.json")
    odd = copy.deepcopy(squeue["jobs"][0])
    odd.update({"job_id": 4242, "job_resources": {}, "gres_detail": [], "nodes": "gpu\ud800"})
    plain = copy.deepcopy(squeue)
    squeue["jobs"].append(odd)
    sent: list[tuple[str, bytes]] = []
    codecs = {"JobEvent": AvroCodec("JobEvent"), "NodeStateEvent": AvroCodec("NodeStateEvent")}
    sink = KafkaSink(lambda topic, key, value, ts_ms: sent.append((topic, key)),
                     lambda s, r: codecs[s].encode(r),
                     {"JobEvent": "jobs", "NodeStateEvent": "nodes"})  # fmt: skip
    expected: list[WatchEvent] = poll_once(DocClient(plain, nodes), WatchState(), NOW_MS)[1]
    stats = WatchStats()
    run_watch(DocClient(squeue, nodes), sink, None, once=True, clock_ms=lambda: NOW_MS,
              stats=stats)  # fmt: skip
    assert stats.unpublishable == 1 and stats.failed_polls == 0  # its STARTED event
    assert sorted(sent) == sorted(
        [
            *((("jobs" if e.schema == "JobEvent" else "nodes"), e.key.encode()) for e in expected),
            ("jobs", b"4242"),
        ]
    )
    # A node whose name is not a name: that node is skipped and counted.
    nodes["nodes"][0]["name"] = "gpu\ud800"
    stats = WatchStats()
    poll_once(DocClient(plain, nodes), WatchState(), NOW_MS, stats=stats)
    assert stats.skipped_nodes == 1


def test_drain_controller_reads_the_nodes_around_an_odd_one() -> None:
    from peerwatch.exporters.drain.slurm_ops import ScontrolSlurm

    nodes = doc("22.05/sinfo-idle.json")
    odd = copy.deepcopy(nodes["nodes"][0])
    odd["name"] = "gpu-odd"
    odd["reason_changed_at"] = 2**70
    nodes["nodes"].append(odd)

    def runner(argv: Any, timeout_s: float) -> CommandResult:
        return CommandResult(0, json.dumps(nodes), "")

    slurm = ScontrolSlurm(runner=runner)
    assert [n.name for n in slurm.nodes()] == [n["name"] for n in nodes["nodes"][:-1]]
    assert slurm.skipped_nodes == 1


def test_hook_events_from_hostile_environments_still_encode() -> None:
    from peerwatch.producers.slurm.hooks import hook_event

    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "gpu1",
           "SLURM_JOB_GPUS": "0,99999999999999999999", "CUDA_VISIBLE_DEVICES": "2,3",
           "SLURM_JOB_RESTART_COUNT": "9" * 30, "SLURM_JOB_EXIT_CODE2": "4294967296:0",
           "SLURM_JOB_NAME": "x\n\x1b[0m\udcff"}  # fmt: skip
    record = hook_event("epilog", env, NOW_MS)
    assert record["allocations"] == [{"node": "gpu1", "gpu_indices": [2, 3]}]
    assert record["restart_count"] is None and record["exit_code"] is None
    # The surrogate escape of a byte that is not UTF-8 in the job name: not encodable, so the
    # hook's sender sets the record aside (tested with the sender); the numbers never are why.
    record["job_name"] = "x"
    AvroCodec("JobEvent").encode(record)
