"""``peerwatch agent`` on a recorded sysfs tree against the real broker: the NodeNicSample
records arrive on their own topic, keyed by node, decodable, beside the GPU samples of the same
run (the fake NVML answers as the recorded H200, ``tests/data/nvml/h200``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes import FakeGpu, FakeNvml

from peerwatch.cli import main
from peerwatch.commands import agent as agent_command
from peerwatch.producers.spool import Spool
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import NIC_SAMPLES, SAMPLES
from tests.integration.test_agent_kafka import consume, spec_of

HGX = Path(__file__).parents[1] / "data" / "sysfs" / "hgx"
TICKS = 3


def test_agent_publishes_nic_samples_from_the_recorded_tree(
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu_spec, nic_spec = spec_of(topic_prefix, SAMPLES), spec_of(topic_prefix, NIC_SAMPLES)
    ensure_topics(kafka_settings, [gpu_spec, nic_spec])
    root = tmp_path / "sys"
    shutil.copytree(HGX, root, symlinks=True)
    # One hostile counter file: null in every record and counted, the rest published.
    (root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_bytes(b"\xff\xfe7\n")
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", topic_prefix)
    monkeypatch.setenv("PEERWATCH_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setattr(agent_command, "nvml_factory", lambda: FakeNvml([FakeGpu.h200(0)]))
    code = main(["agent", "--count", str(TICKS), "--interval-s", "0.2", "--node", "gpu007",
                 "--sysfs-root", str(root)])  # fmt: skip
    assert code == 0
    assert len(Spool(tmp_path / "spool" / "agent")) == 0

    nic_codec, gpu_codec = AvroCodec("NodeNicSample"), AvroCodec("NodeGpuSample")
    nic_msgs = consume(kafka_settings, nic_spec, TICKS)
    gpu_msgs = consume(kafka_settings, gpu_spec, TICKS)
    nic = [nic_codec.decode(m.value()) for m in nic_msgs]
    gpu = [gpu_codec.decode(m.value()) for m in gpu_msgs]
    assert [r["seq"] for r in nic] == list(range(TICKS))
    assert all(m.key() == b"gpu007" for m in nic_msgs + gpu_msgs)
    assert [m.timestamp()[1] for m in nic_msgs] == [r["ts_ms"] for r in nic]
    # The same run and the same ticks as the GPU samples.
    assert {r["agent_run_id"] for r in nic} == {r["agent_run_id"] for r in gpu}
    assert [r["ts_ms"] for r in nic] == [r["ts_ms"] for r in gpu]
    for record in nic:
        ports = {p["name"]: p for p in record["ports"]}
        assert list(ports) == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "ens5np0"]
        ndr = ports["mlx5_0/1"]
        assert ndr["counters"]["symbol_error"] is None and ndr["read_errors"] == 1
        assert ndr["counters"]["port_xmit_data"] == 84533671420318 and ndr["rate_gbps"] == 400.0
        assert ports["mlx5_2/1"]["hw_counters"]["rp_cnp_handled"] == 9934
        assert record["read_errors"] == 1
