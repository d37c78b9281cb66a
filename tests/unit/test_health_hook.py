"""``peerwatch health`` around the checks: exit codes for Slurm, XID cursor, bounded publishing."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml
import pytest
from fakes import FakeGpu, FakeNvml

from peerwatch.commands import health as health_command
from peerwatch.producers.delivery import DeliveryStats
from peerwatch.producers.health.run import append_xid_event
from peerwatch.producers.health_hook import (
    close_bounded,
    cursor_path,
    exit_code_for,
    new_xid_events,
    publish_outcome,
    save_cursor,
    slurm_context,
    summary_line,
)
from peerwatch.producers.spool_lock import SpoolBusyError, SpoolLock
from peerwatch.schemas.codec import AvroCodec

CODEC = AvroCodec("HealthCheckResult")


@pytest.mark.parametrize(
    ("status", "phase", "flag", "code"),
    [
        ("OK", "PROLOG", None, 0),
        ("WARNING", "PROLOG", None, 0),
        ("WARNING", "epilog", None, 0),
        ("WARNING", "PERIODIC", None, 1),
        ("WARNING", "PROLOG", 1, 1),
        ("WARNING", "PERIODIC", 0, 0),
        ("CRITICAL", "PROLOG", 0, 2),
        ("UNKNOWN", "EPILOG", 0, 3),
    ],
)
def test_exit_code_for(status: str, phase: str, flag: int | None, code: int) -> None:
    assert exit_code_for(status, phase, flag) == code


def test_slurm_context() -> None:
    env = {"SLURMD_NODENAME": "gpu017", "SLURM_JOB_ID": "4242"}
    assert slurm_context("prolog", env) == slurm_context("PROLOG", env)
    assert slurm_context("prolog", env).node == "gpu017"
    assert slurm_context("epilog", env).job_id == "4242"
    assert slurm_context("periodic", env).job_id is None
    assert slurm_context("prolog", env, node="other").node == "other"
    assert slurm_context("prolog", {}).node  # falls back to the hostname


def test_xid_cursor_reports_each_event_once_per_cursor(tmp_path: Path) -> None:
    state = tmp_path / "xid.jsonl"
    assert new_xid_events(state, "PROLOG") == ([], 0)
    append_xid_event(state, {"gpu_index": 2, "xid": 79, "ts_ms": 1000, "event_data": None})
    events, cursor = new_xid_events(state, "EPILOG")
    assert [e["xid"] for e in events] == [79] and cursor == 1000
    save_cursor(state, "EPILOG", cursor)
    # Prolog shares the epilog's cursor: the node is not drained again for the same XID.
    assert new_xid_events(state, "PROLOG") == ([], 1000)
    # The periodic run keeps its own cursor.
    assert [e["xid"] for e in new_xid_events(state, "PERIODIC")[0]] == [79]
    append_xid_event(state, {"gpu_index": 0, "xid": 48, "ts_ms": 2000, "event_data": None})
    events, cursor = new_xid_events(state, "PROLOG")
    assert [e["xid"] for e in events] == [48] and cursor == 2000
    assert cursor_path(state, "PROLOG").name == "xid.jsonl.cursor"
    cursor_path(state, "PERIODIC").write_text("garbage")
    assert len(new_xid_events(state, "PERIODIC")[0]) == 2  # unreadable cursor: report all


def test_publish_outcome() -> None:
    assert publish_outcome(None, 0) == "unknown"
    assert publish_outcome(DeliveryStats(sent=1, delivered=1), 0) == "delivered"
    assert publish_outcome(DeliveryStats(sent=1, spooled=1), 1) == "spooled"
    # spooled behind an earlier run's result, both replayed before the process ended
    assert publish_outcome(DeliveryStats(sent=1, spooled=1, delivered=2, replayed=2), 0) == (
        "delivered"
    )
    assert publish_outcome(DeliveryStats(sent=1, delivered=3, replayed=3), 1) == "spooled"
    assert publish_outcome(DeliveryStats(sent=1, refused=1), 0) == "unknown"


def test_close_bounded_gives_up_on_a_stuck_close() -> None:
    release = threading.Event()

    class Stuck:
        def close(self, timeout_s: float = 10.0) -> DeliveryStats:
            release.wait(10)
            return DeliveryStats()

    t0 = time.monotonic()
    assert close_bounded(Stuck(), timeout_s=0.2) is None  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 2.0
    release.set()


def test_summary_line_names_the_failing_checks() -> None:
    result = {
        "phase": "PROLOG", "status": "CRITICAL", "node": "gpu017", "job_id": "7",
        "duration_ms": 12,
        "checks": [
            {"name": "nvml", "status": "OK", "message": "NVML reachable", "gpu_index": None},
            {"name": "ecc_uncorrected", "status": "CRITICAL", "message": "3 errors", "gpu_index": 4},
        ],
    }  # fmt: skip
    line = summary_line(result, 2, "spooled")
    assert line.startswith("PEERWATCH PROLOG CRITICAL - ecc_uncorrected[gpu4]: 3 errors |")
    assert "exit=2" in line and "published=spooled" in line and "\n" not in line


def test_spool_lock_is_exclusive(tmp_path: Path) -> None:
    with SpoolLock(tmp_path / "spool"), pytest.raises(SpoolBusyError):
        SpoolLock(tmp_path / "spool", timeout_s=0.1).acquire()
    with SpoolLock(tmp_path / "spool"):  # released on exit
        pass


# -- the command, with Delivery replaced (no network in unit tests) ----------------------------


class FakeDelivery:
    instances: list[FakeDelivery] = []  # noqa: RUF012

    def __init__(self, kafka: Any, settings: Any) -> None:
        self.settings = settings
        self.sent: list[tuple[str, bytes | None, bytes, int]] = []
        self.closed = False
        FakeDelivery.instances.append(self)

    def start(self) -> FakeDelivery:
        return self

    def send(self, topic: str, key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes]] = (), ts_ms: int = 0) -> None:  # fmt: skip
        self.sent.append((topic, key, value, ts_ms))

    def close(self, timeout_s: float = 10.0) -> DeliveryStats:
        self.closed = True
        return DeliveryStats(sent=len(self.sent), delivered=len(self.sent))

    spooled_records = 0


@pytest.fixture
def command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[FakeNvml]:
    FakeDelivery.instances = []
    nvmls: list[FakeNvml] = []
    monkeypatch.setattr(health_command, "Delivery", FakeDelivery)
    monkeypatch.setenv("PEERWATCH_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", "t.")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu017")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setattr(health_command, "nvml_factory", lambda: nvmls[-1])
    (tmp_path / "no-ib").mkdir()
    return nvmls


def _run(tmp_path: Path, *extra: str) -> int:
    from peerwatch.cli import main

    return main(["health", *extra, "--ib-sysfs-root", str(tmp_path / "no-ib"), "--dcgm-level", "0"])


def test_health_prolog_ok_publishes_and_exits_0(
    command: list[FakeNvml], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command.append(FakeNvml([FakeGpu.h100(i) for i in range(8)]))
    assert _run(tmp_path, "prolog", "--expected-gpus", "8") == 0
    (delivery,) = FakeDelivery.instances
    assert delivery.closed and delivery.settings.spool_dir == tmp_path / "spool" / "health"
    ((topic, key, value, ts_ms),) = delivery.sent
    record = CODEC.decode(value)
    assert (topic, key) == ("t.peerwatch.health.results", b"gpu017")
    assert (record["phase"], record["status"], record["exit_code"]) == ("PROLOG", "OK", 0)
    assert record["job_id"] == "4242" and record["ts_ms"] == ts_ms
    assert capsys.readouterr().out.startswith("PEERWATCH PROLOG OK - ")


def test_health_warning_exit_code_depends_on_phase_and_flag(
    command: list[FakeNvml], tmp_path: Path
) -> None:
    # 8 GPUs where 4 are expected: WARNING (configuration out of date, not a fault).
    for phase, flag, code in [("prolog", [], 0), ("periodic", [], 1), ("epilog", ["--warn-exit-code", "1"], 1)]:  # fmt: skip
        command.append(FakeNvml([FakeGpu.h100(i) for i in range(8)]))
        assert _run(tmp_path, phase, "--expected-gpus", "4", *flag) == code
        record = CODEC.decode(FakeDelivery.instances[-1].sent[0][2])
        assert record["status"] == "WARNING" and record["exit_code"] == code


def test_health_critical_xid_from_state_file_drains_once(
    command: list[FakeNvml], tmp_path: Path
) -> None:
    state = tmp_path / "xid.jsonl"
    append_xid_event(state, {"gpu_index": 3, "xid": 79, "ts_ms": 5, "event_data": None})
    command.append(FakeNvml([FakeGpu.h100(i) for i in range(8)]))
    assert _run(tmp_path, "epilog", "--xid-state", str(state)) == 2
    command.append(FakeNvml([FakeGpu.h100(i) for i in range(8)]))
    assert _run(tmp_path, "prolog", "--xid-state", str(state)) == 0


def test_health_critical_ecc(command: list[FakeNvml], tmp_path: Path) -> None:
    ecc = {(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 2}
    command.append(FakeNvml([FakeGpu.h100(0), FakeGpu.h100(1, ecc=ecc)]))
    assert _run(tmp_path, "prolog") == 2
    record = CODEC.decode(FakeDelivery.instances[-1].sent[0][2])
    bad = [c for c in record["checks"] if c["status"] == "CRITICAL"]
    assert [(c["name"], c["gpu_index"]) for c in bad] == [("ecc_uncorrected", 1)]
