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
        self.ends = {p: len(v) for p, v in logs.items()}  # the high watermarks
        self.next: dict[int, int] = {}  # the positions (next offset to consume)
        self.paused: set[int] = set()
        self.polls = 0  # consume calls that waited (a timeout > 0)
        self.on_poll: Any = None  # called at each waiting consume (records arrive meanwhile)

    def position(self, tps: list[Any]) -> list[Any]:
        from confluent_kafka import TopicPartition

        return [TopicPartition(tp.topic, tp.partition, self.next.get(tp.partition, 0))
                for tp in tps]  # fmt: skip

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        return 0, self.ends[tp.partition]

    def arrive(self, p: int, values: list[bytes]) -> None:
        """Records produced to ``p`` later (fetched at the next consume)."""
        self.logs[p] += [(self.ends[p] + i, v) for i, v in enumerate(values)]
        self.ends[p] += len(values)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[Message]:
        self.polls += timeout > 0
        if timeout > 0 and self.on_poll is not None:
            self.on_poll(self)
        out: list[Message] = []
        while len(out) < num_messages:
            ready = [p for p, log in self.logs.items() if log and p not in self.paused]
            if not ready:
                break
            for p in ready:
                if len(out) < num_messages and self.logs[p]:
                    offset, value = self.logs[p].pop(0)
                    self.next[p] = offset + 1
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
    source._assigned = set(logs)
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
    node's clock) stays held, and once it has been held MOST_HELD_S of wall time the samples
    behind it go on (in order, the offset committed the held one's); it goes when the samples
    catch up."""
    source, _ = input_over({0: [nic("a", 2**60), nic("a", 1000)],
                            1: [nic("b", 10**12), nic("c", 1000), nic("c", 3000)]})  # fmt: skip
    assert times(source.read(most=10, until_ms=2000)) == [("a", 2**60), ("a", 1000)]
    assert [t for t, *_ in source._held[1]] == [10**12, 1000, 3000]  # c waits behind b
    monkeypatch.setattr(nic_input, "MOST_HELD_S", 0.0)
    assert times(source.read(most=10, until_ms=2000)) == [("c", 1000)]
    assert [t for t, *_ in source._held[1]] == [10**12, 3000]
    assert source._offsets[1] == 0  # a restart reads the held ones again
    assert times(source.read(most=10, until_ms=3000)) == [("c", 3000)]
    assert times(source.read(most=10, until_ms=None)) == [("b", 10**12)]
    assert source._offsets[1] == 3


def test_held_samples_wait_out_a_backlog_however_long_it_takes() -> None:
    """Under a backlog the samples may take minutes to reach the NIC samples' time: in-order
    NIC samples stay held however long (handed on by wall time they ran ahead of their
    windows, whose port summaries then had no readings)."""
    source, _ = input_over({0: [nic("a", t) for t in range(0, 20_000, 1000)]})
    source.read(most=100, until_ms=5000)
    for item in list(source._held[0]):  # held long ago
        source._held[0].append((item[0], item[1], item[2], item[3] - 3600))
        source._held[0].popleft()
    assert times(source.read(most=100, until_ms=6000)) == [("a", 6000)]
    assert source._held[0][0][0] == 7000


def test_the_samples_wait_for_a_nic_partition_that_lags_behind_their_time(monkeypatch: Any) -> None:
    """A NIC consumer fetching slower than the samples' (a backlog): before a batch closes
    windows, the NIC samples of their time are read, waited for as they arrive (the demo's
    port-down finding was lost live when a window closed before its NIC readings came)."""
    source, consumer = input_over({0: [nic("a", t) for t in range(0, 4000, 1000)],
                                   1: [nic("b", 0)]})  # fmt: skip
    later = [nic("b", t) for t in range(1000, 12_000, 1000)]
    consumer.ends[1] += len(later)  # produced: the broker has them, the consumer not yet

    def fetched(c: Partitions) -> None:  # b's next samples come one poll at a time
        if later:
            c.logs[1].append((c.ends[1] - len(later), later.pop(0)))

    consumer.on_poll = fetched
    monkeypatch.setattr(nic_input, "QUIET_S", 0.0)  # partition 0, read to its end, is quiet
    got = times(source.read(most=10, until_ms=10_000, reach_ms=7500))
    assert [t for n, t in got if n == "b"] == list(range(0, 9000, 1000))
    assert consumer.polls == 8 and source.waits_given_up == 0
    assert source.behind(7500) == []
    # read to its end but heard from within QUIET_S, a partition may have more on its way
    # (the high watermark is the one of the latest fetch): still waited for
    monkeypatch.setattr(nic_input, "QUIET_S", 3600.0)
    assert source.behind(7500) == [0]


def test_a_nic_partition_that_never_catches_up_is_waited_for_once(
    monkeypatch: Any, caplog: Any
) -> None:
    """A partition still receiving samples older than the batch's time (a node whose clock
    runs behind) is waited for at most MOST_WAIT_S, counted, then not again for a while."""
    monkeypatch.setattr(nic_input, "MOST_WAIT_S", 0.05)
    source, consumer = input_over({0: [nic("a", 0)]})
    consumer.on_poll = lambda c: c.arrive(0, [nic("a", 0)])  # always more, always old
    source.read(most=10, until_ms=10_000, reach_ms=7500)
    assert source.waits_given_up == 1 and consumer.polls > 0
    polls = consumer.polls
    source.read(most=10, until_ms=10_000, reach_ms=7500)
    assert consumer.polls == polls and source.waits_given_up == 1
    # per partition, as the hot stage asks: the warning names them (no logging error)
    source._unwaited_until.clear()
    with caplog.at_level("WARNING"):
        source.read(most=10, until_ms={0: 10_000}, reach_ms={0: 7500})
    assert source.waits_given_up == 2 and "{0: 7500} ms" in caplog.text


def test_before_its_assignment_the_nic_input_is_waited_for_then_not(monkeypatch: Any) -> None:
    """Before the NIC group join, the samples wait (for MOST_WAIT_S after the start: a group
    join takes seconds), then go on alone (a worker given no NIC partition)."""
    source, _ = input_over({})
    source._assigned = None
    monkeypatch.setattr(nic_input, "MOST_WAIT_S", 3600.0)
    assert source.behind(0) == [-1]
    monkeypatch.setattr(nic_input, "MOST_WAIT_S", 0.0)
    assert source.behind(0) == []
    source._on_assign(None, [])  # assigned nothing: nothing waited for
    monkeypatch.setattr(nic_input, "MOST_WAIT_S", 3600.0)
    assert source._assigned == set() and source.behind(0) == []


def test_each_nic_partition_goes_no_further_than_its_own_samples_partition() -> None:
    """The topics are co-partitioned: NIC partition p holds samples partition p's nodes. With a
    backlog one samples partition may run far ahead of another; bounding every NIC partition
    by the newest of all let the slow one's NIC readings run past its windows (stage 2 keeps a
    node's readings only so far behind its newest, and summarised its windows from none)."""
    source, _ = input_over({0: [nic("a", t) for t in range(0, 90_000, 1000)],
                            1: [nic("b", t) for t in range(0, 90_000, 1000)]})  # fmt: skip
    got = times(source.read(most=7, until_ms={0: 80_000, 1: 20_000}))
    assert max(t for n, t in got if n == "a") == 80_000
    assert max(t for n, t in got if n == "b") == 20_000
    # a partition whose samples partition another worker holds goes as far as the newest
    assert nic_input.bound({0: 80_000, 1: 20_000}, 5) == 80_000
    assert nic_input.bound({}, 5) < 0 and nic_input.bound(7, 5) == 7
