"""The prolog/epilog IB counter check: rates between runs from a state file, never totals.

Runs on a copy of the recorded tree tests/data/sysfs/hgx whose counters are changed between runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeClock, FakeGpu, FakeNvml

from peerwatch.producers.health.infiniband import IbThresholds, check_ib_counters
from peerwatch.producers.health.run import HealthDeps, HealthSettings, run_health

HGX = Path(__file__).parents[1] / "data" / "sysfs" / "hgx"
T0 = 1_700_000_000_000
NDR = "mlx5_0/1"


@pytest.fixture
def ib(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(HGX, root, symlinks=True)
    return root / "class" / "infiniband"


def setc(ib: Path, port: str, counter: str, value: int | bytes, hw: bool = False) -> None:
    hca, n = port.split("/")
    path = ib / hca / "ports" / n / ("hw_counters" if hw else "counters") / counter
    path.write_bytes(value if isinstance(value, bytes) else f"{value}\n".encode())


def add(ib: Path, port: str, counter: str, by: int, hw: bool = False) -> None:
    hca, n = port.split("/")
    path = ib / hca / "ports" / n / ("hw_counters" if hw else "counters") / counter
    setc(ib, port, counter, int(path.read_text()) + by, hw)


def run(ib: Path, state: Path, at_ms: int, **kw: Any) -> dict[tuple[str, str], dict[str, Any]]:
    out = check_ib_counters(ib, state_path=state, now_ms=at_ms, **kw)
    return {(o["name"], o["message"].split(":")[0]): o for o in out}


def test_first_run_takes_a_baseline_and_totals_since_boot_are_never_judged(
    ib: Path, tmp_path: Path
) -> None:
    # 60000 symbol errors since boot on a PAM4 link: normal, nothing to say without a rate.
    setc(ib, NDR, "symbol_error", 60000)
    out = run(ib, tmp_path / "ib.json", T0)
    assert out[("ib_errors", NDR)]["status"] == "OK"
    assert "baseline" in out[("ib_errors", NDR)]["message"]
    state = json.loads((tmp_path / "ib.json").read_text())
    assert state["ts_ms"] == T0 and state["ports"][NDR]["counters"]["symbol_error"] == 60000
    # mlx5_3 is down: its counters are kept but judged by the state check, not here.
    assert ("ib_errors", "mlx5_3/1") not in out and "mlx5_3/1" in state["ports"]


def test_slow_errors_between_runs_are_fine(ib: Path, tmp_path: Path) -> None:
    state = tmp_path / "ib.json"
    run(ib, state, T0)
    add(ib, NDR, "symbol_error", 500)  # 500 in an hour: 0.14/s
    out = run(ib, state, T0 + 3_600_000)
    assert out[("ib_errors", NDR)]["status"] == "OK"


@pytest.mark.parametrize(
    ("counter", "by", "seconds", "hw", "port"),
    [
        ("symbol_error", 1_100, 100, False, NDR),  # 11/s > 10/s
        ("link_error_recovery", 6, 60, False, NDR),  # 6/min > 5/min
        ("port_rcv_errors", 2_000, 100, False, NDR),
        ("port_xmit_discards", 20_000, 100, False, NDR),
        ("local_ack_timeout_err", 150, 100, True, "mlx5_2/1"),
        ("roce_slow_restart", 1_500, 100, True, "mlx5_2/1"),
    ],
)  # fmt: skip
def test_error_rates_above_the_thresholds_are_critical(
    ib: Path, tmp_path: Path, counter: str, by: int, seconds: int, hw: bool, port: str
) -> None:
    state = tmp_path / "ib.json"
    run(ib, state, T0)
    add(ib, port, counter, by, hw)
    out = run(ib, state, T0 + seconds * 1000)
    assert out[("ib_errors", port)]["status"] == "CRITICAL"
    assert counter in out[("ib_errors", port)]["message"]


def test_thresholds_are_configurable(ib: Path, tmp_path: Path) -> None:
    state = tmp_path / "ib.json"
    run(ib, state, T0)
    add(ib, NDR, "symbol_error", 1_100)
    out = run(ib, state, T0 + 100_000, thresholds=IbThresholds(symbol_error_per_s=20.0))
    assert out[("ib_errors", NDR)]["status"] == "OK"


@pytest.mark.parametrize(
    ("counter", "hw", "port"),
    [("link_downed", False, NDR), ("local_link_integrity_errors", False, NDR),
     ("excessive_buffer_overrun_errors", False, NDR), ("rnr_nak_retry_err", True, "mlx5_2/1")],
)  # fmt: skip
def test_any_rise_of_a_link_loss_counter_is_critical(
    ib: Path, tmp_path: Path, counter: str, hw: bool, port: str
) -> None:
    state = tmp_path / "ib.json"
    run(ib, state, T0)
    add(ib, port, counter, 1, hw)
    out = run(ib, state, T0 + 86_400_000)  # one in a day
    assert out[("ib_errors", port)]["status"] == "CRITICAL"
    assert f"{counter} rose by 1" in out[("ib_errors", port)]["message"]


def test_a_counter_reset_restarts_the_baseline_without_alarm(ib: Path, tmp_path: Path) -> None:
    state = tmp_path / "ib.json"
    setc(ib, NDR, "symbol_error", 40_000)
    setc(ib, NDR, "link_downed", 5)
    run(ib, state, T0)
    setc(ib, NDR, "symbol_error", 0)  # perfquery -x
    setc(ib, NDR, "link_downed", 0)
    out = run(ib, state, T0 + 10_000)
    assert out[("ib_errors", NDR)]["status"] == "OK"
    assert "symbol_error reset" in out[("ib_errors", NDR)]["message"]
    add(ib, NDR, "link_downed", 1)  # measured from the new baseline
    assert run(ib, state, T0 + 20_000)[("ib_errors", NDR)]["status"] == "CRITICAL"


def test_saturated_counters_give_no_rate_but_reaching_the_top_is_a_rise(
    ib: Path, tmp_path: Path
) -> None:
    state = tmp_path / "ib.json"
    setc(ib, NDR, "symbol_error", 65_535)  # 16-bit, stuck: no rate, no alarm
    setc(ib, NDR, "link_downed", 250)
    run(ib, state, T0)
    setc(ib, NDR, "link_downed", 255)  # 8-bit maximum
    out = run(ib, state, T0 + 1000)
    msg = out[("ib_errors", NDR)]["message"]
    assert out[("ib_errors", NDR)]["status"] == "CRITICAL"
    assert "link_downed rose to its maximum 255" in msg and "symbol_error" not in msg.split("(")[0]
    out = run(ib, state, T0 + 2000)  # both still saturated: unknown, not a new rise
    assert out[("ib_errors", NDR)]["status"] == "OK"
    assert "saturated" in out[("ib_errors", NDR)]["message"]


def test_a_port_below_its_rate_is_a_warning(ib: Path, tmp_path: Path) -> None:
    state = tmp_path / "ib.json"
    out = run(ib, state, T0, expected_rate_gbps=400.0)
    assert out[("ib_rate", NDR)]["status"] == "OK"
    assert out[("ib_rate", "mlx5_1/1")]["status"] == "WARNING"  # 2X NDR: 200 of 400
    # Without a configured rate, the port's best earlier rate is its expected one.
    (ib / "mlx5_0" / "ports" / "1" / "rate").write_text("200 Gb/sec (2X NDR)\n")
    out = run(ib, state, T0 + 1000)
    assert out[("ib_rate", NDR)]["status"] == "WARNING"
    assert "below its expected 400" in out[("ib_rate", NDR)]["message"]


@pytest.mark.parametrize(
    "content", [b"", b"not json", b"[]", b'{"version": 1, "ts_ms": "x", "ports": {}}',
                b'{"version": 1, "ts_ms": 1, "ports": {"mlx5_0/1": {"counters": {"link_downed": "a"}}}}',
                b"\xff\xfe"],
)  # fmt: skip
def test_a_hostile_state_file_restarts_the_baseline(
    ib: Path, tmp_path: Path, content: bytes
) -> None:
    state = tmp_path / "ib.json"
    state.write_bytes(content)
    out = run(ib, state, T0 + 10_000)
    assert {o["status"] for o in out.values()} <= {"OK", "WARNING"}
    assert json.loads(state.read_text())["ts_ms"] == T0 + 10_000


def test_a_hostile_counter_file_is_skipped_not_judged(ib: Path, tmp_path: Path) -> None:
    state = tmp_path / "ib.json"
    run(ib, state, T0)
    setc(ib, NDR, "link_downed", b"\xff garbage")
    assert run(ib, state, T0 + 1000)[("ib_errors", NDR)]["status"] == "OK"


def test_health_run_reports_ib_errors_and_keeps_the_state(ib: Path, tmp_path: Path) -> None:
    state = tmp_path / "ib.json"
    settings = HealthSettings(expected_gpus=1, ib_sysfs_root=ib, ib_state=state,
                              ib_ignore_ports=frozenset({"mlx5_3/1"}))  # fmt: skip
    deps = HealthDeps(nvml=FakeNvml([FakeGpu.h100(0)]), which=lambda _: None,
                      clock=FakeClock(T0), new_id=lambda: "r")  # fmt: skip
    result, code = run_health("PROLOG", node="n1", settings=settings, deps=deps)
    assert code == 0 and state.exists()
    add(ib, NDR, "link_downed", 2)
    deps.clock = FakeClock(T0 + 60_000)
    result, code = run_health("EPILOG", node="n1", settings=settings, deps=deps)
    bad = [c for c in result["checks"] if c["status"] == "CRITICAL"]
    assert code == 2 and [c["name"] for c in bad] == ["ib_errors"]
    assert "mlx5_0/1: link_downed rose by 2" in bad[0]["message"]
