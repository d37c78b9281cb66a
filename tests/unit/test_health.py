"""Health checks: each failing condition gives the right status, and the run its exit code."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pynvml
import pytest
from fakes import FakeClock, FakeGpu, FakeNvml
from fastavro import parse_schema
from fastavro.validation import validate

from peerwatch.producers.health.checks import check_xids
from peerwatch.producers.health.dcgm import CommandResult, check_dcgm_diag, parse_diag
from peerwatch.producers.health.infiniband import check_ib_ports
from peerwatch.producers.health.outcome import worst
from peerwatch.producers.health.run import (
    HealthDeps,
    HealthSettings,
    append_xid_event,
    read_xid_events,
    run_health,
)
from peerwatch.producers.health_hook import exit_code_for

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "HealthCheckResult.avsc"
PARSED = parse_schema(json.loads(SCHEMA_PATH.read_text()))
UNCORRECTED_VOLATILE = (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)


def make_ib(root: Path, ports: dict[str, tuple[str, str]]) -> Path:
    """A sysfs tree: {"mlx5_0/1": ("4: ACTIVE", "5: LinkUp")} -> <root>/mlx5_0/ports/1/state..."""
    for name, (state, phys) in ports.items():
        hca, port = name.split("/")
        d = root / hca / "ports" / port
        d.mkdir(parents=True)
        (d / "state").write_text(state + "\n")
        (d / "phys_state").write_text(phys + "\n")
    return root


class RecordingRunner:
    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(list(argv))
        return self.result


def diag_json(statuses: dict[str, str]) -> str:
    """A ``dcgmi diag -j`` document in the 3.x layout (written for these tests)."""
    tests = [
        {"name": name, "results": [{"gpu_id": "0", "status": s}, {"gpu_id": "1", "status": "Pass"}]}
        for name, s in statuses.items()
    ]
    doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]}}
    return json.dumps(doc)


@pytest.fixture
def healthy_ib(tmp_path: Path) -> Path:
    return make_ib(tmp_path / "ib", {"mlx5_0/1": ("4: ACTIVE", "5: LinkUp")})


def run(
    nvml: FakeNvml,
    ib_root: Path,
    phase: str = "PROLOG",
    *,
    expected: int | None = 2,
    xids: Sequence[dict[str, Any]] = (),
    runner: RecordingRunner | None = None,
    dcgmi_on_path: bool = False,
    **settings: Any,
) -> tuple[dict[str, Any], int]:
    deps = HealthDeps(
        nvml=nvml,
        runner=runner or RecordingRunner(CommandResult(0, diag_json({}), "")),
        which=lambda name: f"/usr/bin/{name}" if dcgmi_on_path else None,
        clock=FakeClock(1_700_000_000_000, step_ms=25),
        new_id=lambda: "run-1",
    )
    s = HealthSettings(expected_gpus=expected, ib_sysfs_root=ib_root, **settings)
    result, code = run_health(phase, node="gpu-a01", settings=s, xids=xids, job_id="42", deps=deps)
    assert validate(result, PARSED, raise_errors=True)
    assert result["exit_code"] == code
    return result, code


def statuses(result: dict[str, Any], name: str) -> list[str]:
    return [c["status"] for c in result["checks"] if c["name"] == name]


def two_gpus(**overrides: Any) -> FakeNvml:
    return FakeNvml([FakeGpu.h100(0), FakeGpu.h100(1, **overrides)])


def test_healthy_node_is_ok(healthy_ib: Path) -> None:
    nvml = two_gpus()
    result, code = run(nvml, healthy_ib)
    assert (result["status"], code) == ("OK", 0)
    assert {c["name"] for c in result["checks"]} == {
        "nvml",
        "gpu_count",
        "ecc_uncorrected",
        "remap",
        "pcie_width",
        "xid",
        "ib_port",
    }
    assert result["phase"] == "PROLOG" and result["job_id"] == "42"
    assert result["duration_ms"] == 25 and result["event_id"] == "run-1"
    assert nvml.count("nvmlShutdown") == 1  # NVML released after the run


def test_nvml_unreachable_is_critical(healthy_ib: Path) -> None:
    result, code = run(FakeNvml([], library_missing=True), healthy_ib)
    assert code == 2
    [nvml_check] = [c for c in result["checks"] if c["name"] == "nvml"]
    assert nvml_check["status"] == "CRITICAL"
    assert "libnvidia-ml.so.1 not found" in nvml_check["message"]


def test_cpu_node_without_nvml_is_ok(healthy_ib: Path) -> None:
    result, code = run(FakeNvml([], library_missing=True), healthy_ib, expected=0)
    assert code == 0 and statuses(result, "gpu_count") == ["OK"]


@pytest.mark.parametrize(("count", "status", "code"), [(1, "CRITICAL", 2), (3, "WARNING", 1)])
def test_gpu_count_against_expected(healthy_ib: Path, count: int, status: str, code: int) -> None:
    nvml = FakeNvml([FakeGpu.h100(i) for i in range(count)])
    result, rc = run(nvml, healthy_ib, expected=2)
    assert rc == code and statuses(result, "gpu_count") == [status]


def test_lost_gpu_is_critical(healthy_ib: Path) -> None:
    nvml = two_gpus()
    nvml.lose_gpu(1, xid=None)
    result, code = run(nvml, healthy_ib)
    assert code == 2
    lost = [c for c in result["checks"] if c["status"] == "CRITICAL"]
    assert lost[0]["gpu_index"] == 1 and "lost" in lost[0]["message"]


def test_uncorrectable_ecc_is_critical(healthy_ib: Path) -> None:
    nvml = two_gpus(ecc={UNCORRECTED_VOLATILE: 2})
    result, code = run(nvml, healthy_ib)
    assert code == 2
    bad = [c for c in result["checks"] if c["name"] == "ecc_uncorrected" and c["status"] != "OK"]
    assert [(c["gpu_index"], c["status"]) for c in bad] == [(1, "CRITICAL")]


def test_ecc_not_supported_is_ok(healthy_ib: Path) -> None:
    nvml = two_gpus(unsupported={"nvmlDeviceGetTotalEccErrors"})
    result, code = run(nvml, healthy_ib)
    assert code == 0 and statuses(result, "ecc_uncorrected") == ["OK", "OK"]


@pytest.mark.parametrize(
    ("rows", "status"),
    [((0, 0, 1, 0), "CRITICAL"), ((0, 2, 0, 1), "CRITICAL"), ((5, 1, 0, 0), "OK")],
    ids=["pending", "failed", "history-only"],
)
def test_row_remapping(healthy_ib: Path, rows: tuple[int, ...], status: str) -> None:
    result, _ = run(two_gpus(remapped_rows=rows), healthy_ib)
    assert statuses(result, "remap") == ["OK", status]


def test_pcie_width_below_max_is_critical(healthy_ib: Path) -> None:
    result, code = run(two_gpus(pcie_link_width=8), healthy_ib)
    assert code == 2
    [bad] = [c for c in result["checks"] if c["name"] == "pcie_width" and c["status"] != "OK"]
    assert bad["gpu_index"] == 1 and "x8" in bad["message"] and "x16" in bad["message"]


def test_pcie_gen_drop_alone_is_fine(healthy_ib: Path) -> None:
    _, code = run(two_gpus(pcie_link_gen=1), healthy_ib)
    assert code == 0


@pytest.mark.parametrize(
    ("xids", "status", "code"),
    [([79], "CRITICAL", 2), ([48, 13], "CRITICAL", 2), ([13, 31], "OK", 0), ([119], "WARNING", 1)],
)
def test_xids_since_last_check(healthy_ib: Path, xids: list[int], status: str, code: int) -> None:
    events = [{"gpu_index": 1, "xid": x, "ts_ms": 1, "event_data": None} for x in xids]
    result, rc = run(two_gpus(), healthy_ib, xids=events)
    assert rc == code and statuses(result, "xid") == [status]


def test_xid_outcomes_per_gpu() -> None:
    events = [{"gpu_index": 0, "xid": 94}, {"gpu_index": 3, "xid": 13}, {"gpu_index": 0, "xid": 94}]
    out = check_xids(events)
    assert [(o["gpu_index"], o["status"]) for o in out] == [(0, "CRITICAL"), (3, "OK")]
    assert "94" in out[0]["message"] and "2 events" in out[0]["message"]


def test_xid_state_file_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "xids.jsonl"
    assert read_xid_events(path) == []
    for ts, code in ((100, 13), (200, 79)):
        append_xid_event(path, {"gpu_index": 0, "xid": code, "ts_ms": ts, "event_data": None})
    with path.open("a") as fh:
        fh.write("not json\n\n")
    assert [e["xid"] for e in read_xid_events(path, since_ms=150)] == [79]
    assert len(read_xid_events(path)) == 2


def test_ib_ports(tmp_path: Path) -> None:
    root = make_ib(
        tmp_path / "ib",
        {
            "mlx5_0/1": ("4: ACTIVE", "5: LinkUp"),
            "mlx5_1/1": ("1: DOWN", "3: Disabled"),
            "mlx5_2/1": ("2: INIT", "5: LinkUp"),
        },
    )
    out = check_ib_ports(root)
    assert [(o["status"], o["message"]) for o in out] == [
        ("OK", "mlx5_0/1: ACTIVE, LinkUp"),
        ("CRITICAL", "mlx5_1/1: DOWN, Disabled"),
        ("CRITICAL", "mlx5_2/1: INIT, LinkUp"),
    ]
    assert [o["status"] for o in check_ib_ports(root, ignore={"mlx5_1/1", "mlx5_2/1"})] == ["OK"]


def test_ib_port_down_fails_the_run(tmp_path: Path) -> None:
    root = make_ib(tmp_path / "ib", {"mlx5_0/1": ("1: DOWN", "2: Polling")})
    result, code = run(two_gpus(), root)
    assert code == 2 and statuses(result, "ib_port") == ["CRITICAL"]


def test_ib_absent_is_ok_and_unreadable_is_unknown(tmp_path: Path) -> None:
    assert [o["status"] for o in check_ib_ports(tmp_path / "none")] == ["OK"]
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")  # phys_state missing
    result, code = run(two_gpus(), tmp_path / "ib")
    assert statuses(result, "ib_port") == ["UNKNOWN"] and code == 3


@pytest.mark.parametrize(
    ("diag", "status", "code"),
    [
        ({"Memory": "Pass", "PCIe": "Pass"}, "OK", 0),
        ({"Memory": "Pass", "PCIe": "Warn"}, "WARNING", 1),
        ({"Memory": "Fail", "PCIe": "Pass"}, "CRITICAL", 2),
        ({"Memory": "Skip"}, "OK", 0),
    ],
)
def test_dcgm_diag_in_epilog(
    healthy_ib: Path, diag: dict[str, str], status: str, code: int
) -> None:
    runner = RecordingRunner(CommandResult(0 if code == 0 else 226, diag_json(diag), ""))
    result, rc = run(two_gpus(), healthy_ib, "epilog", runner=runner, dcgmi_on_path=True)
    assert runner.calls == [["dcgmi", "diag", "-r", "1", "-j"]]
    assert rc == code and statuses(result, "dcgm_diag") == [status]
    if status == "CRITICAL":
        assert "Memory (GPU 0)" in result["checks"][-1]["message"]


def test_dcgm_level_is_a_setting_and_prolog_skips_it(healthy_ib: Path) -> None:
    runner = RecordingRunner(CommandResult(0, diag_json({"Memory": "Pass"}), ""))
    run(two_gpus(), healthy_ib, "EPILOG", runner=runner, dcgmi_on_path=True, dcgm_level=3)
    assert runner.calls == [["dcgmi", "diag", "-r", "3", "-j"]]
    result, _ = run(two_gpus(), healthy_ib, "PROLOG", runner=runner, dcgmi_on_path=True)
    assert len(runner.calls) == 1 and statuses(result, "dcgm_diag") == []


def test_dcgm_absent_is_skipped(healthy_ib: Path) -> None:
    runner = RecordingRunner(CommandResult(0, "", ""))
    result, code = run(two_gpus(), healthy_ib, "EPILOG", runner=runner, dcgmi_on_path=False)
    assert runner.calls == [] and code == 0
    assert statuses(result, "dcgm_diag") == ["OK"]


@pytest.mark.parametrize(
    "broken",
    [
        CommandResult(255, "", "Error: unable to connect to host engine"),  # nv-hostengine down
        CommandResult(124, "", "timed out after 900 s"),  # subprocess_runner's timeout
        CommandResult(0, "garbage, not a diag", ""),  # no test status in the output
    ],
)
def test_dcgm_that_cannot_run_warns_and_does_not_drain(
    healthy_ib: Path, broken: CommandResult
) -> None:
    # A monitor's own missing tool must not drain a fleet: WARNING (exit 1 from run_health,
    # 0 in the epilog through exit_code_for), never UNKNOWN (3, which Slurm drains on).
    runner = RecordingRunner(broken)
    result, code = run(two_gpus(), healthy_ib, "EPILOG", runner=runner, dcgmi_on_path=True)
    assert statuses(result, "dcgm_diag") == ["WARNING"] and code == 1
    assert "could not run" in result["checks"][-1]["message"]
    assert f"exit {broken.returncode}" in result["checks"][-1]["message"]
    assert exit_code_for(result["status"], "EPILOG", None) == 0


@pytest.mark.parametrize("status, code", [("UNKNOWN", 3), ("CRITICAL", 2), ("OK", 0)])
def test_dcgm_unavailable_status_is_configurable(healthy_ib: Path, status: str, code: int) -> None:
    runner = RecordingRunner(CommandResult(255, "", "Error: unable to connect to host engine"))
    result, rc = run(
        two_gpus(),
        healthy_ib,
        "EPILOG",
        runner=runner,
        dcgmi_on_path=True,
        dcgm_unavailable_status=status,
    )
    assert statuses(result, "dcgm_diag") == [status] and rc == code
    assert "unable to connect" in result["checks"][-1]["message"]


def test_dcgm_unavailable_status_must_be_a_nagios_status() -> None:
    runner = RecordingRunner(CommandResult(255, "", ""))
    with pytest.raises(ValueError, match="BROKEN"):
        check_dcgm_diag(runner, 1, unavailable_status="BROKEN")
    assert runner.calls == []


def test_dcgm_failed_test_stays_critical_whatever_the_unavailable_status(
    healthy_ib: Path,
) -> None:
    runner = RecordingRunner(CommandResult(226, diag_json({"Memory": "Fail"}), ""))
    result, code = run(
        two_gpus(),
        healthy_ib,
        "EPILOG",
        runner=runner,
        dcgmi_on_path=True,
        dcgm_unavailable_status="OK",
    )
    assert statuses(result, "dcgm_diag") == ["CRITICAL"] and code == 2


def test_dcgm_text_table_is_parsed() -> None:
    text = (
        "+---------------------------+------------------------------------------------+\n"
        "| Deployment                |                                                |\n"
        "| Denylist                  | Pass                                           |\n"
        "| PCIe                      | Fail - GPU: 1                                  |\n"
    )
    assert parse_diag(text) == [("Denylist", "Pass"), ("PCIe", "Fail")]


def test_crashing_check_is_unknown_not_a_crash(healthy_ib: Path) -> None:
    def runner(argv: Sequence[str], timeout_s: float) -> CommandResult:
        raise RuntimeError("runner exploded")

    deps = HealthDeps(nvml=two_gpus(), runner=runner, which=lambda _: "/usr/bin/dcgmi")
    s = HealthSettings(expected_gpus=2, ib_sysfs_root=healthy_ib)
    result, code = run_health("EPILOG", node="n", settings=s, deps=deps)
    assert code == 3 and statuses(result, "dcgm_diag") == ["UNKNOWN"]


def test_worst_status_order() -> None:
    assert worst([]) == "OK"
    assert worst(["OK", "WARNING"]) == "WARNING"
    assert worst(["UNKNOWN", "WARNING"]) == "UNKNOWN"
    assert worst(["UNKNOWN", "CRITICAL", "OK"]) == "CRITICAL"


def test_unknown_phase_is_rejected(healthy_ib: Path) -> None:
    with pytest.raises(ValueError, match="unknown health phase"):
        run_health("SOMETIME", node="n", deps=HealthDeps(nvml=two_gpus()))
