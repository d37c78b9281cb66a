"""The NIC sampler on recorded sysfs trees (tests/data/sysfs): ports, affinity, hostile files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeClock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peerwatch.producers.nic.ports import discover_ports, pci_bus_id
from peerwatch.producers.nic.sampler import NicSampler
from peerwatch.producers.nic.sysfs import Reader, SysfsTree
from peerwatch.schemas.codec import AvroCodec

SYSFS = Path(__file__).parents[1] / "data" / "sysfs"
HGX_GPUS = {0: "00000000:04:00.0", 1: "00000000:84:00.0"}
IB0 = "class/infiniband/mlx5_0/ports/1"


def sample(
    root: Path, select: tuple[str, ...] = (), gpus: dict[int, str] = HGX_GPUS
) -> dict[str, Any]:
    reader = Reader(SysfsTree(root))
    ports = discover_ports(reader, gpus, select)
    sampler = NicSampler(reader, ports, node="n1", interval_ms=1000, clock=FakeClock(),
                         agent_run_id="r")  # fmt: skip
    return sampler.sample(7)


def by_name(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in record["ports"]}


@pytest.fixture
def hgx(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "hgx", root, symlinks=True)
    return root


def test_default_is_every_port_up_at_start_with_kernel_values() -> None:
    rec = sample(SYSFS / "hgx")
    ports = by_name(rec)
    # mlx5_3 is DOWN/Disabled; ibp3s0 is IPoIB (its IB port is sampled); lo is virtual.
    assert list(ports) == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "ens5np0"]
    ib0 = ports["mlx5_0/1"]
    assert (ib0["kind"], ib0["state"], ib0["phys_state"], ib0["up"]) == (
        "IB",
        "ACTIVE",
        "LinkUp",
        True,
    )
    assert ib0["rate_gbps"] == 400.0 and ib0["link_layer"] == "InfiniBand"
    assert (
        ib0["counters"]["symbol_error"] == 3 and ib0["counters"]["port_xmit_data"] == 84533671420318
    )
    assert ports["mlx5_1/1"]["rate_gbps"] == 200.0
    assert ports["mlx5_2/1"]["link_layer"] == "Ethernet"
    assert ports["mlx5_2/1"]["hw_counters"]["np_cnp_sent"] == 10211
    assert ib0["hw_counters"] == {}  # no hw_counters/ on that HCA
    eth = ports["ens5np0"]
    assert eth["kind"] == "NETDEV" and eth["rate_gbps"] == 200.0 and eth["up"] is True
    assert eth["counters"]["carrier_changes"] == 2 and eth["counters"]["rx_dropped"] == 17
    assert rec["read_errors"] == 0 and all(p["read_errors"] == 0 for p in rec["ports"])
    codec = AvroCodec("NodeNicSample")
    assert codec.decode(codec.encode(rec)) == rec


def test_rail_affinity_from_the_pci_switch_and_numa() -> None:
    ports = by_name(sample(SYSFS / "hgx"))
    assert ports["mlx5_0/1"]["gpu_indices"] == [0] and ports["mlx5_0/1"]["numa_node"] == 0
    assert (
        ports["mlx5_1/1"]["gpu_indices"] == [1]
        and ports["mlx5_1/1"]["pci_address"] == "0000:83:00.0"
    )
    # mlx5_2 shares no PCIe switch with a GPU: its rail falls back to its NUMA node.
    assert ports["mlx5_2/1"]["gpu_indices"] == [0]
    assert by_name(sample(SYSFS / "hgx", gpus={}))["mlx5_0/1"]["gpu_indices"] == []


def test_configured_ports_are_sampled_even_when_down_and_unknown_names_are_left_out() -> None:
    rec = sample(SYSFS / "hgx", select=("mlx5_3/1", "nope/1"))
    (port,) = rec["ports"]
    assert port["name"] == "mlx5_3/1" and port["up"] is False and port["state"] == "DOWN"


def test_this_machines_recorded_net_tree() -> None:
    (eth,) = sample(SYSFS / "vm-net", gpus={})["ports"]
    # A virtio NIC: speed -1 is "unknown", not a rate.
    assert eth["name"] == "eth0" and eth["up"] is True and eth["rate_gbps"] is None
    assert eth["pci_address"] == "0000:00:03.0"
    assert eth["counters"]["rx_bytes"] == 2447865669 and eth["counters"]["rx_crc_errors"] == 0


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage\n", b"-5\n", b"1e9\n", b"99999999999999999999\n", b"\xff\xfe\n",
     b"N/A (no PMA)\n", b"1" * 5000],
)  # fmt: skip
def test_a_hostile_counter_file_is_null_and_counted(hgx: Path, content: bytes) -> None:
    (hgx / IB0 / "counters" / "symbol_error").write_bytes(content)
    port = by_name(sample(hgx))["mlx5_0/1"]
    assert port["counters"]["symbol_error"] is None and port["read_errors"] == 1
    assert port["counters"]["link_downed"] == 1  # the others are kept


def test_missing_unreadable_and_garbled_state_files(hgx: Path) -> None:
    (hgx / IB0 / "rate").write_bytes(b"fast\n")
    (hgx / IB0 / "counters" / "link_downed").unlink()
    (hgx / IB0 / "counters" / "port_rcv_errors").unlink()
    (hgx / IB0 / "counters" / "port_rcv_errors").mkdir()  # EISDIR on read
    rec = sample(hgx, select=("mlx5_0/1",))
    (hgx / IB0 / "phys_state").write_bytes(b"\x00\x01\xc3(")
    port = by_name(sample(hgx, select=("mlx5_0/1",)))["mlx5_0/1"]
    assert port["rate_gbps"] is None and port["phys_state"] is None and port["up"] is None
    assert port["counters"]["link_downed"] is None and port["counters"]["port_rcv_errors"] is None
    assert port["read_errors"] == 4 and rec["read_errors"] == 3


def test_each_failing_file_is_logged_once_and_counted_every_tick(
    hgx: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (hgx / IB0 / "counters" / "symbol_error").write_bytes(b"x\n")
    reader = Reader(SysfsTree(hgx))
    sampler = NicSampler(reader, discover_ports(reader, select=("mlx5_0/1",)), node="n1",
                         interval_ms=1000, clock=FakeClock(), agent_run_id="r")  # fmt: skip
    with caplog.at_level("WARNING", logger="peerwatch.producers.nic.sysfs"):
        counts = [sampler.sample(seq)["read_errors"] for seq in range(3)]
    assert counts == [1, 1, 1] and reader.stats.garbage == 3
    (line,) = [r.getMessage() for r in caplog.records]
    assert "counters/symbol_error': garbage" in line


def test_a_fifo_in_place_of_a_file_does_not_block_the_tick(hgx: Path) -> None:
    fifo = hgx / IB0 / "counters" / "symbol_error"
    fifo.unlink()
    os.mkfifo(fifo)  # no writer: a blocking open would wait for ever
    port = by_name(sample(hgx, select=("mlx5_0/1",)))["mlx5_0/1"]
    assert port["counters"]["symbol_error"] is None and port["read_errors"] == 1


def test_a_vanished_port_reads_as_nulls_without_raising(hgx: Path) -> None:
    reader = Reader(SysfsTree(hgx))
    ports = discover_ports(reader, HGX_GPUS)
    sampler = NicSampler(reader, ports, node="n1", interval_ms=1000, clock=FakeClock(),
                         agent_run_id="r")  # fmt: skip
    shutil.rmtree(hgx / "class" / "infiniband" / "mlx5_2")
    port = by_name(sampler.sample(1))["mlx5_2/1"]
    assert port["state"] is None and port["up"] is None
    assert set(port["hw_counters"].values()) == {None} and port["read_errors"] > 20
    assert reader.stats.missing == port["read_errors"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=64), st.sampled_from(["state", "rate", "counters/port_xmit_data"]))
def test_any_bytes_in_any_file_never_raise(hgx: Path, content: bytes, name: str) -> None:
    (hgx / IB0 / name).write_bytes(content)
    rec = sample(hgx, select=("mlx5_0/1",))
    codec = AvroCodec("NodeNicSample")
    assert codec.decode(codec.encode(rec)) == rec


def test_nvml_bus_ids_become_sysfs_addresses() -> None:
    assert pci_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert pci_bus_id("00000001:AB:1F.7") == "0001:ab:1f.7"
    assert pci_bus_id("garbage") is None and pci_bus_id("zz:00:00.0") is None
