"""NodeAgent: wall-clock grid without drift, contiguous seq, XIDs at once, LOST GPUs, clean stop.

Most tests run the loop in simulated time: ``SimWake`` is the agent's interruptible sleep; instead
of sleeping it moves the fake clock to the wake-up time, running scripted actions (an XID, a stall,
a lost GPU, a stop) at their instant on the way.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeClock, FakeGpu, FakeNvml

from peerwatch.clock import SystemClock
from peerwatch.commands import agent as agent_command
from peerwatch.errors import EncodeError
from peerwatch.producers.agent import (
    NodeAgent,
    NoGpuSampler,
    TickChannel,
    catch_up,
    first_target_ms,
)
from peerwatch.producers.nic.ports import discover_ports
from peerwatch.producers.nic.sampler import NicSampler
from peerwatch.producers.nic.sysfs import Reader, SysfsTree
from peerwatch.producers.nvml.sampler import GpuSampler
from peerwatch.producers.nvml.xid import XidCallback, XidWatcher
from peerwatch.schemas.codec import AvroCodec

T0 = 1_700_000_000_000  # a multiple of every interval used here
CODEC = AvroCodec("NodeGpuSample")
TOPIC = "t.peerwatch.gpu.samples"


class ListSink:
    """Records what the agent sends: (topic, key, value bytes, ts_ms)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, int]] = []

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        ts_ms: int = 0,
    ) -> None:
        self.sent.append((topic, key, value, ts_ms))

    def records(self) -> list[dict[str, Any]]:
        return [CODEC.decode(value) for _, _, value, _ in self.sent]


class SimWake:
    """A ``threading.Event`` stand-in whose ``wait`` advances ``clock`` instead of sleeping."""

    def __init__(self, clock: FakeClock, actions: Iterable[tuple[int, Callable[[], None]]] = ()):
        self.clock = clock
        self.actions = sorted(actions, key=lambda a: a[0])
        self.flag = False
        self.waits_ms: list[int] = []

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None and timeout > 0
        if self.flag:
            return True
        wake_ms = self.clock.ms + round(timeout * 1000)
        self.waits_ms.append(wake_ms)
        if self.actions and self.actions[0][0] <= wake_ms:
            at_ms, action = self.actions.pop(0)
            self.clock.ms = max(self.clock.ms, at_ms)
            action()
            return self.flag
        self.clock.ms = wake_ms
        return False


class FakeWatcher:
    def __init__(self, callback: XidCallback) -> None:
        self.callback = callback
        self.started = self.stopped = False

    def start(self) -> list[int]:
        self.started = True
        return [0]

    def stop(self, timeout_s: float | None = None) -> None:
        self.stopped = True


class SlowSampler:
    """Wraps a sampler; each sample takes ``cost_ms`` of (fake) time after its timestamp."""

    def __init__(self, inner: GpuSampler, clock: FakeClock, cost_ms: int) -> None:
        self.inner, self.clock, self.cost_ms = inner, clock, cost_ms
        self.closed = False

    def sample(self, seq: int, xids: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
        record = self.inner.sample(seq, xids)
        self.clock.ms += self.cost_ms
        return record

    def close(self) -> None:
        self.closed = True
        self.inner.close()


class Rig:
    """A FakeNvml node with 8 GPUs, a list sink and simulated time."""

    def __init__(
        self,
        start_ms: int = T0 + 300,
        interval_ms: int = 1000,
        actions: Iterable[tuple[int, Callable[[], None]]] = (),
        gpus: int = 8,
        sample_cost_ms: int = 0,
        channel: Callable[[FakeClock], TickChannel] | None = None,
    ) -> None:
        self.clock = FakeClock(start_ms)
        self.nvml = FakeNvml([FakeGpu.h100(i) for i in range(gpus)])
        self.nvml.nvmlInit()
        inner = GpuSampler(self.nvml, "gpu-a01", interval_ms, self.clock, agent_run_id="run-7")
        self.sampler: GpuSampler | SlowSampler = (
            SlowSampler(inner, self.clock, sample_cost_ms) if sample_cost_ms else inner
        )
        self.sink = ListSink()
        self.wake = SimWake(self.clock, actions)
        self.watchers: list[FakeWatcher] = []
        self.agent = NodeAgent(
            sampler=self.sampler,
            sink=self.sink,
            encode=CODEC.encode,
            topic=TOPIC,
            node="gpu-a01",
            interval_ms=interval_ms,
            clock=self.clock,
            wakeup=self.wake,
            watcher_factory=self._watcher,
            channel=channel(self.clock) if channel else None,
        )

    def _watcher(self, callback: XidCallback) -> FakeWatcher:
        watcher = FakeWatcher(callback)
        self.watchers.append(watcher)
        return watcher

    def xid(self, at_ms: int, gpu: int, code: int) -> tuple[int, Callable[[], None]]:
        event = {"gpu_index": gpu, "xid": code, "ts_ms": at_ms, "event_data": None}
        return at_ms, lambda: self.agent.on_xid(event)


def test_grid_helpers() -> None:
    assert first_target_ms(T0 + 1, 1000) == T0 + 1000
    assert first_target_ms(T0, 1000) == T0
    assert catch_up(T0, T0 + 999, 1000) == (T0, 0)
    assert catch_up(T0, T0 + 3200, 1000) == (T0 + 3000, 3)


def test_ticks_fall_on_the_wall_clock_grid_with_contiguous_seq() -> None:
    rig = Rig()
    stats = rig.agent.run(count=5)
    records = rig.sink.records()
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["ts_ms"] for r in records] == [T0 + k * 1000 for k in range(1, 6)]
    assert {r["agent_run_id"] for r in records} == {"run-7"}
    assert all(len(r["gpus"]) == 8 and r["interval_ms"] == 1000 for r in records)
    # Every record left as Avro, keyed by node, with its event time as the Kafka timestamp.
    assert {(t, k) for t, k, _, _ in rig.sink.sent} == {(TOPIC, b"gpu-a01")}
    assert [ts for *_, ts in rig.sink.sent] == [r["ts_ms"] for r in records]
    assert (stats.records, stats.ticks, stats.missed_ticks, stats.xid_records) == (5, 5, 0, 0)


def test_records_round_trip_through_the_codec_unchanged() -> None:
    rig = Rig(gpus=2)
    rig.agent.run(count=1)
    raw = rig.sink.sent[0][2]
    record = CODEC.decode(raw)
    assert CODEC.encode(record) == raw
    assert record["gpus"][1]["uuid"] == FakeGpu.h100(1).uuid
    assert record["gpus"][0]["power_mw"] == 650_000


def test_sampling_time_does_not_drift_the_schedule() -> None:
    # Each sample costs 137 ms; scheduling from "now + interval" would drift by that per tick.
    rig = Rig(sample_cost_ms=137)
    rig.agent.run(count=6)
    assert [r["ts_ms"] for r in rig.sink.records()] == [T0 + k * 1000 for k in range(1, 7)]
    assert rig.wake.waits_ms[1:] == [T0 + k * 1000 for k in range(2, 7)]


def test_missed_ticks_are_skipped_and_seq_stays_contiguous() -> None:
    rig = Rig()

    def stall() -> None:  # the process is frozen from 2.5 s to 5.2 s
        rig.clock.ms = T0 + 5200

    rig.wake.actions = [(T0 + 2500, stall)]
    stats = rig.agent.run(count=4)
    records = rig.sink.records()
    assert [r["seq"] for r in records] == [0, 1, 2, 3]
    # 3 s and 4 s were missed; the late tick samples at once, then the grid resumes at 6 s.
    assert [r["ts_ms"] for r in records] == [T0 + 1000, T0 + 2000, T0 + 5200, T0 + 6000]
    assert stats.missed_ticks == 2


def test_xid_wakes_the_loop_for_an_immediate_extra_sample() -> None:
    rig = Rig()
    rig.wake.actions = [rig.xid(T0 + 2400, gpu=3, code=79)]
    stats = rig.agent.run(count=4)
    records = rig.sink.records()
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["ts_ms"] for r in records] == [T0 + 1000, T0 + 2000, T0 + 2400, T0 + 3000, T0 + 4000]
    assert records[2]["xids"] == [
        {"gpu_index": 3, "xid": 79, "ts_ms": T0 + 2400, "event_data": None}
    ]
    assert all(r["xids"] == [] for i, r in enumerate(records) if i != 2)
    assert (stats.ticks, stats.xid_records, stats.xid_events) == (4, 1, 1)


def test_xid_at_a_tick_rides_on_that_tick() -> None:
    rig = Rig()
    rig.wake.actions = [rig.xid(T0 + 2000, gpu=0, code=48)]
    rig.agent.run(count=3)
    records = rig.sink.records()
    assert [r["ts_ms"] for r in records] == [T0 + 1000, T0 + 2000, T0 + 3000]
    assert [len(r["xids"]) for r in records] == [0, 1, 0]


def test_lost_gpu_is_reported_and_the_loop_continues() -> None:
    rig = Rig()
    rig.wake.actions = [(T0 + 2500, lambda: rig.nvml.lose_gpu(5, xid=None))]
    stats = rig.agent.run(count=5)
    records = rig.sink.records()
    assert len(records) == 5
    states = [[g["state"] for g in r["gpus"]] for r in records]
    assert states[1][5] == "OK"
    for later in states[2:]:
        assert later[5] == "LOST"
        assert later[:5] + later[6:] == ["OK"] * 7
    assert records[-1]["gpus"][5]["power_mw"] is None
    assert stats.records == 5


def test_stop_is_clean_and_closes_watcher_and_sampler() -> None:
    rig = Rig()
    rig.wake.actions = [(T0 + 3500, rig.agent.stop)]
    stats = rig.agent.run()
    assert [r["seq"] for r in rig.sink.records()] == [0, 1, 2]
    assert rig.watchers and rig.watchers[0].started and rig.watchers[0].stopped
    # The sampler freed both GPM buffers of each of the 8 GPUs.
    assert rig.nvml.count("nvmlGpmSampleFree") == 16
    assert stats.ticks == 3


def test_xid_arriving_while_stopping_still_gets_a_record() -> None:
    rig = Rig()

    def xid_then_stop() -> None:
        rig.agent.stop()
        rig.agent.on_xid({"gpu_index": 1, "xid": 94, "ts_ms": T0 + 1500, "event_data": None})

    rig.wake.actions = [(T0 + 1500, xid_then_stop)]
    rig.agent.run()
    records = rig.sink.records()
    assert [r["seq"] for r in records] == [0, 1]
    assert records[1]["xids"][0]["xid"] == 94


def test_encode_failure_spends_its_seq_and_the_loop_continues() -> None:
    rig = Rig(gpus=1)
    calls = {"n": 0}

    def flaky_encode(record: Any) -> bytes:
        calls["n"] += 1
        if calls["n"] == 2:
            raise EncodeError("NodeGpuSample: field seq: 'x' is not long")
        return CODEC.encode(record)

    rig.agent._encode = flaky_encode
    stats = rig.agent.run(count=3)
    assert [r["seq"] for r in rig.sink.records()] == [0, 2]  # the gap shows the loss
    assert stats.encode_errors == 1


def test_no_gpu_sampler_heartbeats_with_empty_gpus() -> None:
    clock = FakeClock(T0 + 10)
    sink = ListSink()
    agent = NodeAgent(
        sampler=NoGpuSampler("cpu-01", 500, clock, "run-x"),
        sink=sink,
        encode=CODEC.encode,
        topic=TOPIC,
        node="cpu-01",
        interval_ms=500,
        clock=clock,
        wakeup=SimWake(clock),
    )
    agent.run(count=3)
    records = sink.records()
    assert [(r["seq"], r["ts_ms"], r["gpus"]) for r in records] == [
        (0, T0 + 500, []),
        (1, T0 + 1000, []),
        (2, T0 + 1500, []),
    ]
    assert records[0]["driver_version"] is None


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval_ms"):
        Rig(interval_ms=0)


def test_real_watcher_thread_delivers_xid_within_the_interval() -> None:
    """Real time, real XidWatcher thread over FakeNvml: the XID is in a record long before the
    next tick (the interval is 60 s; the bounds below are a loaded machine's, not a latency
    target: an XID that waited for the tick would take the whole minute)."""
    nvml = FakeNvml([FakeGpu.h100(i) for i in range(2)])
    nvml.nvmlInit()

    clock = SystemClock()
    sink = ListSink()
    got_xid = threading.Event()

    class SignallingSink(ListSink):
        def send(self, topic: str, key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes]] = (), ts_ms: int = 0) -> None:  # fmt: skip
            sink.send(topic, key, value, headers, ts_ms)
            if CODEC.decode(value)["xids"]:
                got_xid.set()

    agent = NodeAgent(
        sampler=GpuSampler(nvml, "gpu-a02", 60_000, clock),
        sink=SignallingSink(),
        encode=CODEC.encode,
        topic=TOPIC,
        node="gpu-a02",
        interval_ms=60_000,
        clock=clock,
        watcher_factory=lambda cb: XidWatcher(nvml, cb, clock, wait_timeout_ms=50),
    )
    runner = threading.Thread(target=agent.run)
    runner.start()
    try:
        time.sleep(0.2)  # let the watcher register
        injected_ms = clock.now_ms()
        nvml.inject_xid(1, 48)
        assert got_xid.wait(30.0), "no record carried the XID within 30 s (interval 60 s)"
    finally:
        agent.stop()
        runner.join(5)
    assert not runner.is_alive()
    records = sink.records()
    with_xid = [r for r in records if r["xids"]]
    assert len(with_xid) == 1
    assert with_xid[0]["xids"][0]["xid"] == 48
    assert with_xid[0]["ts_ms"] - injected_ms < 30_000
    assert [r["seq"] for r in records] == list(range(len(records)))


# -- the NIC channel --------------------------------------------------------------------------

NIC_CODEC = AvroCodec("NodeNicSample")
NIC_TOPIC = "t.peerwatch.nic.samples"
HGX = Path(__file__).parents[1] / "data" / "sysfs" / "hgx"


def hgx_channel(root: Path = HGX) -> Callable[[FakeClock], TickChannel]:
    """A NIC tick channel on the sysfs tree ``root`` that reads the rig's clock."""

    def build(clock: FakeClock) -> TickChannel:
        reader = Reader(SysfsTree(root))
        sampler = NicSampler(reader, discover_ports(reader), node="gpu-a01", interval_ms=1000,
                             clock=clock, agent_run_id="run-7")  # fmt: skip
        return TickChannel(sampler.sample, NIC_CODEC.encode, NIC_TOPIC)

    return build


def test_nic_record_on_every_regular_tick_not_on_xid_extras() -> None:
    # The GPU sample takes 7 ms: the NIC record still carries the tick's time, the GPU record's.
    rig = Rig(channel=hgx_channel(), sample_cost_ms=7)
    rig.wake.actions = [rig.xid(T0 + 1500, 3, 48)]
    stats = rig.agent.run(count=3)
    topics = [t for t, _, _, _ in rig.sink.sent]
    # GPU tick, NIC tick, the XID extra (GPU only), then two more ticks of both.
    assert topics == [TOPIC, NIC_TOPIC, TOPIC, TOPIC, NIC_TOPIC, TOPIC, NIC_TOPIC]
    nic = [NIC_CODEC.decode(v) for t, _, v, _ in rig.sink.sent if t == NIC_TOPIC]
    assert [r["seq"] for r in nic] == [0, 1, 2]
    assert [r["ts_ms"] for r in nic] == [T0 + k * 1000 for k in range(1, 4)]
    gpu_ts = [CODEC.decode(v)["ts_ms"] for t, _, v, _ in rig.sink.sent if t == TOPIC]
    assert [ts for ts in gpu_ts if ts % 1000 == 0] == [r["ts_ms"] for r in nic]
    assert [ts for t, _, _, ts in rig.sink.sent if t == NIC_TOPIC] == [r["ts_ms"] for r in nic]
    assert len(nic[0]["ports"]) == 4
    assert all(k == b"gpu-a01" for _, k, _, _ in rig.sink.sent)
    assert stats.nic_records == 3 and stats.nic_errors == 0 and stats.records == 4


def test_a_failing_nic_sample_is_counted_and_the_gpu_records_go_on() -> None:
    def broken(seq: int, ts_ms: int) -> dict[str, Any]:
        raise RuntimeError("sampler bug")

    rig = Rig(channel=lambda _: TickChannel(broken, NIC_CODEC.encode, NIC_TOPIC))
    stats = rig.agent.run(count=2)
    assert stats.nic_errors == 2 and stats.nic_records == 0 and stats.records == 2
    assert [r["seq"] for r in rig.sink.records()] == [0, 1]


def test_nic_read_errors_are_summed_in_the_stats(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(HGX, root, symlinks=True)
    rig = Rig(channel=hgx_channel(root))
    (root / "class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_bytes(b"\xff")
    stats = rig.agent.run(count=2)
    assert stats.nic_records == 2 and stats.nic_read_errors == 2


# -- the command ------------------------------------------------------------------------------


def test_agent_command_dry_run_prints_decoded_records(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from peerwatch.cli import main

    fake = FakeNvml([FakeGpu.h100(i) for i in range(8)])
    monkeypatch.setattr(agent_command, "nvml_factory", lambda: fake)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", "t.")
    hgx = Path(__file__).parents[1] / "data" / "sysfs" / "hgx"
    code = main(["agent", "--dry-run", "--count", "2", "--interval-s", "0.05", "--node", "n1",
                 "--sysfs-root", str(hgx)])  # fmt: skip
    assert code == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    lines = [r for r in out if "gpus" in r]
    nic = [r for r in out if "ports" in r]
    # Each tick: the GPU record, then the NIC record of the recorded tree's up ports.
    assert ["gpus" in r for r in out] == [True, False, True, False]
    assert [r["seq"] for r in nic] == [0, 1] and all(r["node"] == "n1" for r in nic)
    assert [p["name"] for p in nic[0]["ports"]] == ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "ens5np0"]
    assert [r["seq"] for r in lines] == [0, 1]
    assert all(r["node"] == "n1" and len(r["gpus"]) == 8 for r in lines)
    # Consecutive grid points 50 ms apart (one may be skipped on a loaded machine).
    assert 25 <= lines[1]["ts_ms"] - lines[0]["ts_ms"] <= 150
    assert fake.count("nvmlShutdown") == 1  # NVML released on the way out


def test_agent_command_without_nvml_exits_2_unless_allowed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from peerwatch.cli import main

    monkeypatch.setattr(agent_command, "nvml_factory", lambda: FakeNvml(library_missing=True))
    assert main(["agent", "--dry-run", "--count", "1", "--interval-s", "0.05"]) == 2
    assert "libnvidia-ml.so.1 not found" in capsys.readouterr().err
    code = main(["agent", "--dry-run", "--count", "1", "--interval-s", "0.05", "--allow-no-gpu",
                 "--sysfs-root", str(tmp_path)])  # fmt: skip
    assert code == 0
    # An empty sysfs tree: no NIC port, the NIC record is published with none.
    line, nic = capsys.readouterr().out.splitlines()
    assert json.loads(nic)["ports"] == []
    assert json.loads(line)["gpus"] == []
