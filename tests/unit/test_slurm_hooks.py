"""Prolog/epilog events from the environment, the outbox, the sender, and the Slurm client."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from peerwatch.errors import EncodeError, SlurmCommandError
from peerwatch.producers.slurm.client import CommandSlurmClient, parse_version
from peerwatch.producers.slurm.command import CommandResult
from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.hook_sender import send_outbox
from peerwatch.producers.slurm.hooks import (
    gpu_indices_from_env,
    hook_event,
    parse_job_detail_gpus,
)
from peerwatch.producers.slurm.outbox import Outbox
from peerwatch.schemas.codec import AvroCodec

NOW_MS = 1_795_950_000_000
DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"

# What slurmd 22.05.8 really put in the Prolog's environment (recorded on the test cluster).
PROLOG_22_05 = {
    "SLURMD_NODENAME": "vm", "SLURM_CLUSTER_NAME": "peerwatch-test", "SLURM_JOBID": "29",
    "SLURM_JOB_ACCOUNT": "root", "SLURM_JOB_ID": "29", "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_RESTART_COUNT": "0", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
    "SLURM_NODELIST": "vm", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
}  # fmt: skip
EPILOG_22_05 = {
    **PROLOG_22_05, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_JOB_DERIVED_EC": "0",
    "SLURM_JOB_EXIT_CODE": "768", "SLURM_JOB_EXIT_CODE2": "3:0",
}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SLURM_JOB_GPUS": "0,1,2", "CUDA_VISIBLE_DEVICES": "5"}, ((0, 1, 2), "SLURM_JOB_GPUS")),
        ({"CUDA_VISIBLE_DEVICES": "3,7"}, ((3, 7), "CUDA_VISIBLE_DEVICES")),
        (
            {"CUDA_VISIBLE_DEVICES": "GPU-8a1b2c3d-0000", "GPU_DEVICE_ORDINAL": "4"},
            ((4,), "GPU_DEVICE_ORDINAL"),
        ),
        ({"SLURM_JOB_GPUS": "NoDevFiles"}, ((), "SLURM_JOB_GPUS")),
        ({"SLURM_JOB_GPUS": ""}, None),
        (PROLOG_22_05, None),
    ],
)
def test_gpu_indices_from_env(env: dict[str, str], expected: Any) -> None:
    assert gpu_indices_from_env(env) == expected


def test_prolog_event_on_22_05_takes_gpus_from_scontrol_detail() -> None:
    detail = parse_job_detail_gpus(
        "JobId=29 JobName=wrap JOB_GRES=gpu:3   Nodes=vm CPU_IDs=1 Mem=0 GRES=gpu:3(IDX:2-4) "
        "MinCPUsNode=1 NumNodes=1"
    )
    record = hook_event("prolog", PROLOG_22_05, NOW_MS, detail_gpus=detail)
    assert record["kind"] == "STARTED" and record["source"] == "PROLOG"
    assert record["allocations"] == [{"node": "vm", "gpu_indices": [2, 3, 4]}]
    assert (record["user"], record["partition"], record["account"]) == ("root", "gpu", "root")
    assert (record["start_ms"], record["end_ms"], record["restart_count"]) == (NOW_MS, None, 0)
    assert AvroCodec("JobEvent").decode(AvroCodec("JobEvent").encode(record)) == record


def test_epilog_event_has_the_exit_code_and_env_gpus_win() -> None:
    env = {**EPILOG_22_05, "SLURM_JOB_GPUS": "6,7"}
    record = hook_event("epilog", env, NOW_MS, detail_gpus={"vm": (0,)})
    assert record["kind"] == "ENDED" and record["source"] == "EPILOG"
    assert record["exit_code"] == 3 and record["end_ms"] == NOW_MS
    assert record["allocations"] == [{"node": "vm", "gpu_indices": [6, 7]}]


@pytest.mark.parametrize(
    ("env", "code"),
    [
        ({"SLURM_JOB_EXIT_CODE2": "0:15"}, None),
        ({"SLURM_JOB_EXIT_CODE2": "2:0"}, 2),
        ({"SLURM_JOB_EXIT_CODE": "9"}, None),
        ({"SLURM_JOB_EXIT_CODE": "256"}, 1),
        ({"SLURM_JOB_EXIT_CODE": "garbage"}, None),
        ({}, None),
    ],
)
def test_epilog_exit_codes(env: dict[str, str], code: int | None) -> None:
    base = {"SLURM_JOB_ID": "5", "SLURMD_NODENAME": "n1"}
    assert hook_event("epilog", {**base, **env}, NOW_MS)["exit_code"] == code


def test_event_ids_are_deterministic_per_job_node_kind_and_run() -> None:
    a = hook_event("prolog", PROLOG_22_05, NOW_MS)["event_id"]
    assert a == hook_event("prolog", PROLOG_22_05, NOW_MS + 5)["event_id"]
    assert a != hook_event("epilog", PROLOG_22_05, NOW_MS)["event_id"]
    assert a != hook_event("prolog", {**PROLOG_22_05, "SLURMD_NODENAME": "vm2"}, NOW_MS)["event_id"]
    requeued = {**PROLOG_22_05, "SLURM_JOB_RESTART_COUNT": "1"}
    assert a != hook_event("prolog", requeued, NOW_MS)["event_id"]


def test_node_falls_back_to_the_given_name_and_missing_job_is_an_error() -> None:
    env = {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "1"}
    assert hook_event("prolog", env, NOW_MS, node="gpu07")["allocations"][0]["node"] == "gpu07"
    with pytest.raises(SlurmParseError, match="SLURMD_NODENAME"):
        hook_event("prolog", env, NOW_MS)
    with pytest.raises(SlurmParseError, match="SLURM_JOB_ID"):
        hook_event("prolog", {"SLURMD_NODENAME": "n"}, NOW_MS)
    with pytest.raises(SlurmParseError, match="unknown hook"):
        hook_event("task-prolog", env, NOW_MS, node="n")


def test_parse_job_detail_multi_node_and_multiline() -> None:
    text = """JobId=1001 JobName=train
   NumNodes=3 NumCPUs=96
   JOB_GRES=gpu:h100:16
     Nodes=gpu[01-02] CPU_IDs=0-31 Mem=0 GRES=gpu:h100:8(IDX:0-7)
     Nodes=gpu03 CPU_IDs=0-3 Mem=1024 GRES=gpu:h100:2(IDX:2,5),nic:1
     Nodes=gpu04 CPU_IDs=0 Mem=0 GRES=
"""
    assert parse_job_detail_gpus(text) == {
        "gpu01": tuple(range(8)), "gpu02": tuple(range(8)), "gpu03": (2, 5),
    }  # fmt: skip


# -- outbox and sender ----------------------------------------------------------------------------
class FakeProducer:
    """Acknowledges (or fails, or never answers) every produced record on flush."""

    def __init__(self, mode: str = "ack") -> None:
        self.mode = mode
        self.produced: list[tuple[str, bytes, bytes]] = []
        self._callbacks: list[Any] = []
        self.purged = False

    def produce(self, topic: str, value: bytes, key: bytes, **kwargs: Any) -> None:
        self.produced.append((topic, key, value))
        self._callbacks.append(kwargs["on_delivery"])

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        if self.mode == "silent":
            return len(self._callbacks)
        for cb in self._callbacks:
            cb(None if self.mode == "ack" else "broker down", None)
        self._callbacks = []
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True) -> None:
        self.purged = True


def encode(schema: str, record: dict[str, Any]) -> bytes:
    return AvroCodec(schema).encode(record)


def put_events(outbox: Outbox, n: int) -> list[dict[str, Any]]:
    records = []
    for i in range(n):
        env = {**PROLOG_22_05, "SLURM_JOB_ID": str(100 + i), "SLURM_JOB_GPUS": str(i)}
        record = hook_event("prolog", env, NOW_MS + i)
        outbox.put("t.jobs", record["job_id"], "JobEvent", record)
        records.append(record)
    return records


def test_sender_delivers_oldest_first_and_empties_the_outbox(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox")
    records = put_events(outbox, 3)
    assert len(outbox) == 3
    producer = FakeProducer()
    result = send_outbox(outbox, lambda: producer, encode, timeout_s=2)
    assert (result.delivered, result.left) == (3, 0)
    assert [k for _, k, _ in producer.produced] == [b"100", b"101", b"102"]
    assert [AvroCodec("JobEvent").decode(v) for _, _, v in producer.produced] == records
    assert len(outbox) == 0


@pytest.mark.parametrize("mode", ["fail", "silent"])
def test_sender_keeps_records_kafka_did_not_acknowledge(tmp_path: Path, mode: str) -> None:
    outbox = Outbox(tmp_path)
    put_events(outbox, 2)
    producer = FakeProducer(mode)
    result = send_outbox(outbox, lambda: producer, encode, timeout_s=0.2)
    assert (result.delivered, result.left) == (0, 2)
    assert producer.purged == (mode == "silent")
    assert send_outbox(outbox, FakeProducer, encode, timeout_s=1).delivered == 2


def test_sender_with_empty_outbox_creates_no_producer(tmp_path: Path) -> None:
    def no_producer() -> FakeProducer:
        raise AssertionError("no producer needed")

    assert send_outbox(Outbox(tmp_path / "none"), no_producer, encode, 1).delivered == 0


def test_unreadable_and_unencodable_records_are_set_aside(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    put_events(outbox, 1)
    (tmp_path / "0000000000001-broken.json").write_text("{")
    outbox.put("t.jobs", "9", "JobEvent", {"event_id": "x", "ts_ms": 5, "kind": "NOPE"})
    result = send_outbox(outbox, FakeProducer, encode, timeout_s=1)
    assert (result.delivered, result.bad, result.left) == (1, 1, 0)
    assert sorted(p.suffix for p in tmp_path.iterdir() if p.suffix == ".bad") == [".bad", ".bad"]
    with pytest.raises(EncodeError):
        encode("JobEvent", {"kind": "NOPE"})


def test_a_second_sender_waits_for_the_lock(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    put_events(outbox, 1)
    with outbox.locked(1) as got:
        assert got
        result = send_outbox(Outbox(tmp_path), FakeProducer, encode, timeout_s=0.1)
    assert result.locked_out and result.left == 1


# -- the Slurm client -----------------------------------------------------------------------------
class FakeRunner:
    def __init__(self, answers: dict[str, CommandResult | Exception]) -> None:
        self.answers = answers
        self.calls: list[tuple[list[str], float]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append((list(argv), timeout_s))
        answer = self.answers[" ".join(argv[1:3]) if len(argv) > 2 else argv[1]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(text: str) -> CommandResult:
    return CommandResult(0, text, "")


def test_client_runs_argument_vectors_from_bin_dir() -> None:
    squeue = (DATA / "22.05/squeue-one-running.json").read_text()
    runner = FakeRunner(
        {"--json --states=all": ok(squeue), "--json --allusers": ok('{"jobs": []}')}
    )
    client = CommandSlurmClient(Path("/opt/slurm/bin"), timeout_s=7, runner=runner)
    assert client.squeue_json()["jobs"][0]["job_id"] == 1
    client.sacct_json(NOW_MS)
    (argv, timeout_s), (sacct_argv, _) = runner.calls
    assert argv == ["/opt/slurm/bin/squeue", "--json", "--states=all"] and timeout_s == 7
    assert sacct_argv[:4] == ["/opt/slurm/bin/sacct", "--json", "--allusers", "--starttime"]
    assert len(sacct_argv[4]) == 19 and sacct_argv[4][10] == "T"


def test_client_picks_sinfo_on_22_05_and_scontrol_on_newer() -> None:
    sinfo = (DATA / "22.05/sinfo-idle.json").read_text()
    nodes = (DATA / "25.11/scontrol-show-nodes.json").read_text()
    old = FakeRunner({"--version": ok("slurm-wlm 22.05.8\n"), "--json": ok(sinfo)})
    assert CommandSlurmClient(runner=old).nodes_json()["nodes"][0]["name"] == "vm"
    assert [c[0] for c in old.calls] == [["sinfo", "--version"], ["sinfo", "--json"]]
    new = FakeRunner({"--version": ok("slurm 25.11.0\n"), "show nodes": ok(nodes)})
    assert len(CommandSlurmClient(runner=new).nodes_json()["nodes"]) == 4
    assert new.calls[-1][0] == ["scontrol", "show", "nodes", "--json"]
    # A version string we cannot trust: the aggregated sinfo shape sends us to scontrol.
    odd = FakeRunner(
        {"--version": ok("slurm 22.05\n"), "--json": ok('{"sinfo": []}'), "show nodes": ok(nodes)}
    )
    client = CommandSlurmClient(runner=odd)
    assert len(client.nodes_json()["nodes"]) == 4
    assert len(client.nodes_json()["nodes"]) == 4
    assert [c[0][0] for c in odd.calls] == ["sinfo", "sinfo", "scontrol", "scontrol"]


@pytest.mark.parametrize(
    ("answer", "error", "match"),
    [
        (subprocess.TimeoutExpired(["squeue"], 3), SlurmCommandError, "within 3 s"),
        (FileNotFoundError(2, "No such file or directory"), SlurmCommandError, "cannot run"),
        (CommandResult(1, "", "squeue: error: slurm_load_jobs: Unable to contact"), SlurmCommandError,
         "exited 1: squeue: error"),
        (ok("not json"), SlurmParseError, "printed no JSON"),
        (ok("[1]"), SlurmParseError, "printed list"),
    ],
)  # fmt: skip
def test_client_translates_failures(answer: Any, error: type[Exception], match: str) -> None:
    client = CommandSlurmClient(timeout_s=3, runner=FakeRunner({"--json --states=all": answer}))
    with pytest.raises(error, match=match):
        client.squeue_json()


def test_parse_version() -> None:
    assert parse_version("slurm-wlm 22.05.8") == (22, 5)
    assert parse_version("slurm 25.11.0-1") == (25, 11)
    with pytest.raises(SlurmParseError):
        parse_version("sinfo: command not found")


def test_sender_active_sees_a_held_lock(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path)
    assert not outbox.sender_active()
    with outbox.locked(1) as got:
        assert got and outbox.sender_active()
    assert not outbox.sender_active()
