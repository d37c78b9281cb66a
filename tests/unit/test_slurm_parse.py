"""Slurm JSON parsers (peerwatch.producers.slurm.parse) on recorded 22.05 output and on
documents constructed from the published OpenAPI descriptions of newer versions."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest

from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.parse import (
    SlurmJob,
    data_parser_version,
    parse_sacct,
    parse_sacct_job,
    parse_sinfo,
    parse_squeue,
    parse_squeue_job,
)

NEWER = ["23.11", "24.05", "25.11"]


def load(data_dir: pathlib.Path, version: str, name: str) -> Any:
    return json.loads((data_dir / "slurm" / version / name).read_text())


def by_id(jobs: list[SlurmJob]) -> dict[str, SlurmJob]:
    return {j.job_id: j for j in jobs}


# ---- recorded Slurm 22.05.8 ---------------------------------------------------------------


def test_recorded_squeue_running_and_pending(data_dir: pathlib.Path) -> None:
    doc = load(data_dir, "22.05", "squeue-running-pending.json")
    assert data_parser_version(doc) == "v0.0.38"
    jobs = by_id(parse_squeue(doc))
    assert set(jobs) == {"1", "2_0", "2_1", "2_2", "3", "4"}
    big = jobs["1"]
    assert (big.state, big.user, big.partition, big.account, big.name) == (
        "RUNNING",
        "root",
        "gpu",
        "root",
        "train-big",
    )
    assert big.gpu_indices == {"vm": (0, 1, 2)} and big.gpu_count == 3
    assert big.start_ts_ms is not None and big.start_ts_ms % 1000 == 0
    assert big.exit_code is None  # still running
    owned = [i for j in jobs.values() for i in j.gpu_indices.get("vm", ())]
    assert sorted(owned) == sorted(set(owned)) == list(range(7))
    assert jobs["4"].state == "PENDING" and jobs["4"].nodes == () and jobs["4"].start_ts_ms is None
    assert jobs["2_2"].state == "PENDING" and jobs["2_2"].gpu_indices == {}


def test_recorded_squeue_finished_exit_codes(data_dir: pathlib.Path) -> None:
    jobs = by_id(parse_squeue(load(data_dir, "22.05", "squeue-finished.json")))
    # 22.05 squeue prints raw wait statuses: 768 = exit 3, 15 = killed by SIGTERM.
    assert (jobs["8"].state, jobs["8"].exit_code, jobs["8"].exit_signal) == ("FAILED", 3, None)
    assert (jobs["9"].state, jobs["9"].exit_code, jobs["9"].exit_signal) == ("CANCELLED", None, 15)
    assert (jobs["7"].state, jobs["7"].exit_code) == ("COMPLETED", 0)
    assert jobs["7"].end_ts_ms is not None and jobs["7"].start_ts_ms is not None
    assert jobs["7"].end_ts_ms >= jobs["7"].start_ts_ms


def test_recorded_sacct(data_dir: pathlib.Path) -> None:
    doc = load(data_dir, "22.05", "sacct.json")
    assert data_parser_version(doc) == "v0.0.38"
    jobs = by_id(parse_sacct(doc))
    assert {j: jobs[j].state for j in ("7", "8", "9", "1")} == {
        "7": "COMPLETED",
        "8": "FAILED",
        "9": "CANCELLED",
        "1": "CANCELLED",
    }
    # The pending rest of array 2 is stored as a bitmap of task ids (0x7 = tasks 0-2).
    assert "2_[0-2]" in jobs and jobs["2_[0-2]"].nodes == ()
    assert jobs["2_0"].gpu_count == 1 and jobs["8"].gpu_count == 2
    assert jobs["4"].nodes == ()  # "None assigned"
    # Slurm 22.05's sacct JSON reports return code 0 even for the failed job (its text
    # output says 3:0): the parser passes on what Slurm says.
    assert jobs["8"].exit_code == 0


@pytest.mark.parametrize(
    ("name", "state", "flags", "reason"),
    [
        ("sinfo-idle.json", "IDLE", (), None),
        ("sinfo-mixed.json", "MIXED", (), None),
        ("sinfo-allocated.json", "ALLOCATED", (), None),
        ("sinfo-draining.json", "ALLOCATED", ("DRAIN",), "peerwatch: sm clock 12% below peers"),
        ("sinfo-drained.json", "IDLE", ("DRAIN",), "peerwatch: sm clock 12% below peers"),
    ],
)
def test_recorded_sinfo(
    data_dir: pathlib.Path, name: str, state: str, flags: tuple[str, ...], reason: str | None
) -> None:
    [node] = parse_sinfo(load(data_dir, "22.05", name))
    assert (node.name, node.state, node.state_flags, node.reason) == ("vm", state, flags, reason)
    assert node.partitions == ("gpu",) and node.gres == "gpu:8"
    if reason:
        assert node.reason_set_by_user == "root"
        assert node.reason_changed_ts_ms is not None and node.reason_changed_ts_ms > 0
    else:
        assert node.reason_set_by_user is None and node.reason_changed_ts_ms is None


# ---- constructed newer versions -----------------------------------------------------------


@pytest.mark.parametrize("version", NEWER)
def test_newer_squeue(data_dir: pathlib.Path, version: str) -> None:
    doc = load(data_dir, version, "squeue.json")
    assert data_parser_version(doc) in {"v0.0.40", "v0.0.41", "v0.0.44"}
    jobs = by_id(parse_squeue(doc))
    train = jobs["1001"]
    assert train.nodes == ("gpu01", "gpu02")
    assert train.gpu_indices == {"gpu01": tuple(range(8)), "gpu02": tuple(range(8))}
    assert train.gpu_count == 16
    assert train.start_ts_ms == 1_767_225_660_000
    assert jobs["1002_3"].gpu_indices == {"gpu03": (0, 1)}  # typed gpu + a nic entry
    pending = jobs["1002_[4-7]"]
    assert (pending.state, pending.start_ts_ms, pending.end_ts_ms) == ("PENDING", None, None)
    assert (jobs["1006"].state, jobs["1006"].state_flags) == ("RUNNING", ("COMPLETING",))
    assert jobs["1006"].gpu_indices == {"gpu03": (2, 5)}
    assert (jobs["1003"].exit_code, jobs["1003"].exit_signal) == (3, None)
    assert jobs["1003"].gpu_indices == {}  # gpu(IDX:N/A)
    assert (jobs["1004"].exit_code, jobs["1004"].exit_signal) == (None, 15)


@pytest.mark.parametrize("version", NEWER)
def test_newer_sacct(data_dir: pathlib.Path, version: str) -> None:
    jobs = by_id(parse_sacct(load(data_dir, version, "sacct.json")))
    assert jobs["1001"].end_ts_ms is None and jobs["1001"].exit_code is None
    assert jobs["1001"].nodes == ("gpu01", "gpu02") and jobs["1001"].gpu_count == 16
    assert (jobs["1003"].state, jobs["1003"].exit_code) == ("FAILED", 3)
    assert (jobs["1004"].state, jobs["1004"].exit_signal) == ("CANCELLED", 15)
    assert (jobs["1007"].state, jobs["1007"].exit_code) == ("OUT_OF_MEMORY", 137)
    assert jobs["1002_[4-7]"].state == "PENDING"  # bitmap 0xf0
    assert jobs["1002_3"].user == "bob" and jobs["1002_3"].account == "ml"


@pytest.mark.parametrize("version", NEWER)
def test_newer_nodes(data_dir: pathlib.Path, version: str) -> None:
    nodes = {n.name: n for n in parse_sinfo(load(data_dir, version, "scontrol-show-nodes.json"))}
    assert (nodes["gpu01"].state, nodes["gpu01"].state_flags) == ("MIXED", ())
    drained = nodes["gpu02"]
    assert (drained.state, drained.state_flags) == ("MIXED", ("DRAIN",))
    assert drained.reason == "peerwatch: sm clock 12% below peers"
    assert drained.reason_changed_ts_ms == 1_767_226_100_000
    assert nodes["gpu01"].reason_changed_ts_ms is None  # {"set": false}
    assert (nodes["gpu04"].state, nodes["gpu04"].state_flags) == ("DOWN", ("NOT_RESPONDING",))
    assert nodes["gpu04"].reason_set_by_user == "slurm"


def test_allocation_order_follows_the_index(data_dir: pathlib.Path) -> None:
    job = copy.deepcopy(load(data_dir, "24.05", "squeue.json")["jobs"][0])
    job["job_resources"]["nodes"]["allocation"].reverse()
    job["gres_detail"] = ["gpu:h100:1(IDX:3)", "gpu:h100:1(IDX:5)"]
    assert parse_squeue_job(job).gpu_indices == {"gpu01": (3,), "gpu02": (5,)}


def test_nodes_hostlist_is_used_without_job_resources(data_dir: pathlib.Path) -> None:
    job = copy.deepcopy(load(data_dir, "24.05", "squeue.json")["jobs"][0])
    del job["job_resources"]
    job["nodes"] = "gpu[07,10]"
    job["gres_detail"] = ["gpu:2(IDX:0-1)", "gpu:1(IDX:7)"]
    assert parse_squeue_job(job).gpu_indices == {"gpu07": (0, 1), "gpu10": (7,)}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"set": True, "infinite": False, "number": 5}, 5_000),
        ({"set": False, "infinite": False, "number": 5}, None),
        ({"set": True, "infinite": True, "number": 0}, None),
        (0, None),
        (7, 7_000),
    ],
)
def test_time_shapes(data_dir: pathlib.Path, value: Any, expected: int | None) -> None:
    job = copy.deepcopy(load(data_dir, "25.11", "squeue.json")["jobs"][0])
    job["start_time"] = value
    assert parse_squeue_job(job).start_ts_ms == expected


@pytest.mark.parametrize(
    ("state", "main", "flags"),
    [
        ("RUNNING", "RUNNING", ()),
        ("CANCELLED+", "CANCELLED", ()),
        (["COMPLETING", "RUNNING"], "RUNNING", ("COMPLETING",)),
        (["PENDING", "REQUEUED"], "PENDING", ("REQUEUED",)),
        (["COMPLETING"], "COMPLETING", ()),
    ],
)
def test_job_state_shapes(data_dir: pathlib.Path, state: Any, main: str, flags: tuple) -> None:
    job = copy.deepcopy(load(data_dir, "25.11", "squeue.json")["jobs"][0])
    job["job_state"] = state
    parsed = parse_squeue_job(job)
    assert (parsed.state, parsed.state_flags) == (main, flags)


# ---- malformed input ----------------------------------------------------------------------


def _job(data_dir: pathlib.Path) -> dict[str, Any]:
    return copy.deepcopy(load(data_dir, "24.05", "squeue.json")["jobs"][0])


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda j: j.pop("job_id"), "'job_id': missing"),
        (lambda j: j.update(job_id="12"), "job_id"),
        (lambda j: j.pop("job_state"), "job_state"),
        (lambda j: j.update(job_state=7), "job_state"),
        (lambda j: j.update(job_state=[]), "empty state"),
        (lambda j: j.update(start_time="soon"), "start_time"),
        (lambda j: j.update(start_time={"set": True, "number": "x"}), "start_time"),
        (lambda j: j.update(exit_code="3"), "exit_code"),
        (lambda j: j.update(gres_detail=["gpu:8(IDX:0-7)"]), "1 entries for 2 nodes"),
        (lambda j: j.update(gres_detail=["gpu:8(IDX:0-7", "gpu:1"]), "gres_detail"),
        (lambda j: j.update(user_name=5), "user_name"),
        (lambda j: j["job_resources"]["nodes"]["allocation"][0].pop("name"), "allocation"),
    ],
)
def test_malformed_squeue_job(data_dir: pathlib.Path, mutate: Any, match: str) -> None:
    job = _job(data_dir)
    mutate(job)
    with pytest.raises(SlurmParseError, match=match):
        parse_squeue_job(job)


def test_malformed_hostlist_in_nodes(data_dir: pathlib.Path) -> None:
    job = _job(data_dir)
    del job["job_resources"]
    job["nodes"] = "gpu[01-"
    with pytest.raises(SlurmParseError, match="'nodes'"):
        parse_squeue_job(job)


@pytest.mark.parametrize(
    "doc",
    [None, [], {"jobs": None}, {"jobs": [1]}, {"jobs": [], "errors": [{"error": "boom"}]}],
)
def test_malformed_documents(doc: Any) -> None:
    with pytest.raises(ValueError):
        parse_squeue(doc)
    with pytest.raises(ValueError):
        parse_sacct(doc)


def test_malformed_sacct_job(data_dir: pathlib.Path) -> None:
    job = copy.deepcopy(load(data_dir, "24.05", "sacct.json")["jobs"][0])
    job["state"] = "RUNNING"
    with pytest.raises(SlurmParseError, match="'state'"):
        parse_sacct_job(job)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"sinfo": []}, "scontrol show nodes --json"),
        ({"nodes": [{"state": ["IDLE"]}]}, "'name': missing"),
        ({"nodes": [{"name": "n1"}]}, "'state': missing"),
        ({"nodes": [{"name": "n1", "state": ["IDLE"], "reason_changed_at": []}]}, "reason"),
        ({"nodes": []} | {"errors": ["x"]}, "errors"),
    ],
)
def test_malformed_sinfo(doc: Any, match: str) -> None:
    with pytest.raises(SlurmParseError, match=match):
        parse_sinfo(doc)
