"""The hot stage's NIC input joins the GPU samples in event time (streams/live/nic_input.py).

A window's port summaries are made when the GPU samples close it; the in-process runner sees
both streams in event order. Live, with a backlog of samples, a NIC input that reads ahead of
the samples lets stage 2 prune the readings of windows not yet closed, and one that lags behind
leaves them without ports: either way live and replay differ (seen on real Kafka with the demo,
tests/integration/test_demo_live_replay.py). The consumer here is a stand-in holding the
partitions' records (the logic under test is the input's holding and releasing, no broker).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.streams.live import nic_input
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.delivery import OutputDelivery
from peerwatch.streams.live.nic_input import NicInput

CODEC = AvroCodec("NodeNicSample")


class Message:
    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self._partition, self._offset, self._value = partition, offset, value

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "nic"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b""

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (0, 0)


class Partitions:
    """Each partition's records, handed out in offset order, round robin, as a consumer would;
    paused partitions give nothing."""

    def __init__(self, logs: dict[int, list[bytes]]) -> None:
        self.logs = {p: list(enumerate(v)) for p, v in logs.items()}
        self.paused: set[int] = set()

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[Message]:
        out: list[Message] = []
        while len(out) < num_messages:
            ready = [p for p, log in self.logs.items() if log and p not in self.paused]
            if not ready:
                break
            for p in ready:
                if len(out) < num_messages and self.logs[p]:
                    offset, value = self.logs[p].pop(0)
                    out.append(Message(p, offset, value))
        return out

    def pause(self, tps: list[Any]) -> None:
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps: list[Any]) -> None:
        self.paused -= {tp.partition for tp in tps}


def nic(node: str, ts_ms: int) -> bytes:
    return CODEC.encode({"node": node, "ts_ms": ts_ms, "seq": ts_ms // 1000, "agent_run_id": "r",
                         "interval_ms": 1000, "ports": [], "read_errors": 0})  # fmt: skip


def input_over(logs: dict[int, list[bytes]]) -> tuple[NicInput, Partitions]:
    delivery = OutputDelivery("dead", StreamCounters(), producer=object())
    source = NicInput(KafkaSettings(), "nic", "g", delivery)
    source._consumer = Partitions(logs)
    return source, source._consumer


def times(samples: Sequence[Any]) -> list[tuple[str, int]]:
    return [(s["node"], s["ts_ms"]) for s in samples]


def test_nic_samples_wait_for_the_gpu_samples_time_and_keep_each_partitions_order() -> None:
    source, _ = input_over({0: [nic("a", t) for t in range(0, 10_000, 1000)],
                            1: [nic("b", t) for t in range(0, 10_000, 1000)]})  # fmt: skip
    first = source.read(most=3, until_ms=2000)
    assert sorted(times(first)) == [("a", 0), ("a", 1000), ("a", 2000),
                                    ("b", 0), ("b", 1000), ("b", 2000)]  # fmt: skip
    # the later ones were held, not lost, and come in order when the samples reach them
    assert times(source.read(most=3, until_ms=4500)) == [("a", 3000), ("a", 4000),
                                                          ("b", 3000), ("b", 4000)]  # fmt: skip
    # committed offsets follow what was handed on only (a restart reads the held ones again)
    assert source._offsets == {0: 5, 1: 5}
    # the samples caught up: everything that arrived goes on
    rest = source.read(most=3, until_ms=None)
    assert [t for n, t in times(rest) if n == "a"] == list(range(5000, 10_000, 1000))
    assert source._offsets == {0: 10, 1: 10}


def test_a_partition_far_ahead_is_paused_while_a_late_one_catches_up(monkeypatch: Any) -> None:
    monkeypatch.setattr(nic_input, "HOLD_MOST", 4)
    calls: list[str] = []
    source, consumer = input_over({0: [nic("a", t) for t in range(10_000, 30_000, 1000)],
                                   1: [nic("b", t) for t in range(0, 20_000, 1000)]})  # fmt: skip
    pause, resume = consumer.pause, consumer.resume
    consumer.pause = lambda tps: (calls.append("pause"), pause(tps))  # type: ignore[method-assign]
    consumer.resume = lambda tps: (calls.append("resume"), resume(tps))  # type: ignore[method-assign]
    got = times(source.read(most=2, until_ms=15_000))
    # both read up to the time; partition 0 stopped at HOLD_MOST samples past it, paused
    assert [t for n, t in got if n == "a"] == list(range(10_000, 16_000, 1000))
    assert [t for n, t in got if n == "b"] == list(range(0, 16_000, 1000))
    assert calls == ["pause"] and consumer.paused == {0}
    assert [t for t, *_ in source._held[0]] == [16_000, 17_000, 18_000, 19_000]
    assert source._held[1][0][0] == 16_000  # held, not lost
    # the samples moved on: the held ones go, the partition is read again
    later = times(source.read(most=2, until_ms=30_000))
    assert [t for n, t in later if n == "a"] == list(range(16_000, 30_000, 1000))
    assert calls == ["pause", "resume"] and consumer.paused == set()


def test_an_undecodable_nic_record_is_dead_lettered_in_its_place() -> None:
    source, _ = input_over({0: [nic("a", 0), b"\x00garbage", nic("a", 2000)]})
    dead: list[str] = []
    source.delivery.dead = lambda m, reason, detail: dead.append(reason)  # type: ignore[method-assign]
    assert times(source.read(most=10, until_ms=1000)) == [("a", 0)]
    assert dead == ["undecodable"] and source._offsets == {0: 2}
    assert times(source.read(most=10, until_ms=None)) == [("a", 2000)]


def test_a_sample_from_the_future_never_stalls_its_partition(monkeypatch: Any) -> None:
    """A hostile time goes on at once (the link rules count it); a valid time far ahead (a
    node's clock) is held at most MOST_HELD_S of wall time, then handed on in order."""
    source, _ = input_over({0: [nic("a", 2**60), nic("a", 1000)],
                            1: [nic("b", 10**12), nic("b", 1000)]})  # fmt: skip
    assert times(source.read(most=10, until_ms=2000)) == [("a", 2**60), ("a", 1000)]
    assert [t for t, *_ in source._held[1]] == [10**12, 1000]  # b waits behind its future
    monkeypatch.setattr(nic_input, "MOST_HELD_S", 0.0)
    assert times(source.read(most=10, until_ms=2000)) == [("b", 10**12), ("b", 1000)]
