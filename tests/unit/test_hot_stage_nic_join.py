"""The live hot stage gives stage 3 the ports the in-process runner gives, also when one
consumed batch spans many windows (a backlog: a restart, a burst, a worker started behind).

Found live (tests/integration/test_demo_live_replay.py, the demo with NIC samples): the hot
stage stepped a partition's whole batch at once after handing on the NIC samples up to the
batch's newest time, so the first windows it closed were summarised after stage 2 had dropped
their NIC readings (it keeps a node's readings only so far behind its newest one) and their
ports came out empty; the job comparison then missed the demo's port-down. The hot stage now
steps a batch in the in-process runner's parts (each ends at the stage's next close), each
after its partition's NIC samples up to its time. No broker here: the consumers are stand-ins
holding the records (the logic under test is the join and the stepping).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from test_nic_input import Message, Partitions

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import Settings, with_overrides
from peerwatch.streams.core.network_jobs import JobPorts, job_ports_messages
from peerwatch.streams.core.pipeline import Pipeline
from peerwatch.streams.live import nic_input
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.hot_spec import HotTopics
from peerwatch.streams.live.hot_stage import HotStage


class Producer:
    """Keeps what is produced (topic, value); every record delivered."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, **_: Any) -> None:
        self.sent.append((topic, value))

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0


#: Two minutes of a 4-node job with NICs: one batch spans twelve 10 s windows, over twice
#: as long as stage 2 keeps a node's NIC readings (55 s with these settings).
DURATION_S = 120
SETTINGS = with_overrides(Settings(), {"detector.window_s": 10, "stream.lateness_s": 5})


def scenario() -> list[tuple[str, str, dict[str, Any]]]:
    doc = {
        "fleet": {"nodes": 4, "gpus_per_node": 8, "seed": 7, "nics_per_node": 2,
                  "start_ms": 1_700_000_000_000, "duration_s": DURATION_S, "interval_s": 1},
        "jobs": [{"job_id": "77", "gpus": 32, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "faults": [{"name": "nic_port_down", "node": 2, "start_s": 60, "end_s": 70,
                    "params": {"port": 1}}],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    return [(r.stream, r.key, r.value) for _, recs in fleet.timed_ticks() for r in recs]


def in_process_ports(records: list[tuple[str, str, dict[str, Any]]]) -> list[bytes]:
    """The network messages of each job window the in-process runner compares."""
    pipeline = Pipeline(SETTINGS)
    got: list[JobPorts] = []
    add = pipeline.net_jobs.add
    pipeline.net_jobs.add = lambda jp: (got.append(jp), add(jp))[1]  # type: ignore[method-assign]
    for stream, key, value in records:
        pipeline.feed(stream, key, value)
    return [m for jp in got for m in job_ports_messages(jp)]


def live_ports(
    records: list[tuple[str, str, dict[str, Any]]],
    batches: int = 1,
    batch_s: float = 0.0,
    settings: Settings = SETTINGS,
) -> list[bytes]:
    """The network messages the hot stage sends when the GPU samples come in ``batches``
    batches (one samples partition, each batch all that was left to read when it was consumed,
    each taken ``batch_s`` of wall time after the previous one arrived) with the NIC samples
    waiting on their partition."""

    class NoCommits:
        """The samples consumer: nothing committed; caught up once a batch is consumed."""

        def __init__(self) -> None:
            self.end = 0  # the high watermark and the position: every batch is all there is

        def committed(self, partitions: list[Any], timeout: float) -> list[Any]:
            return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]

        def position(self, tps: list[Any]) -> list[Any]:
            return [TopicPartition(tp.topic, tp.partition, self.end) for tp in tps]

        def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
            return 0, self.end

    hot = HotStage(settings, "t", HotTopics("s", "je", "b", "dead", 1, "f", "nf", "nic"),
                   StreamCounters())  # fmt: skip
    producer = Producer()
    hot.delivery.producer = producer
    hot.jobs.sync = lambda *_a, **_k: None  # type: ignore[method-assign]
    samples_consumer = NoCommits()
    hot._on_assign(samples_consumer, [TopicPartition("s", 0)])
    hot.parts.consumer = samples_consumer
    nic_codec, gpu_codec = AvroCodec("NodeNicSample"), AvroCodec("NodeGpuSample")
    assert hot.nic is not None
    hot.nic.nic._consumer = Partitions(
        {0: [nic_codec.encode(v) for s, _, v in records if s == "nic-samples"]}
    )
    hot.nic.nic._assigned = {0}
    for stream, _, value in records:
        if stream == "job-events":
            hot.stage.apply_job_event(value)
    gpu = [Message(0, i, gpu_codec.encode(v))
           for i, v in enumerate(v for s, _, v in records if s == "samples")]  # fmt: skip
    size = -(-len(gpu) // batches)
    for first in range(0, len(gpu), size):
        batch = gpu[first : first + size]
        samples_consumer.end = batch[-1].offset() + 1
        for part in hot.parts.parts.values():  # the previous batch arrived batch_s ago
            part.arrival_wall_s -= batch_s
        hot.take(batch)
    return [value for topic, value in producer.sent
            if topic == "b" and value[:1] == b"{" and json.loads(value).get("kind") == "network"]  # fmt: skip


def test_a_backlog_batch_gets_the_in_process_runners_ports_window_by_window() -> None:
    records = scenario()
    want = in_process_ports(records)
    assert len(want) >= 8  # the windows the batch closes (all but the open ones)
    got = live_ports(records)
    assert got == want[: len(got)] and len(got) >= len(want) - 1
    # every port of every compared window has readings (none summarised from nothing)
    for message in got:
        for ports in json.loads(message)["nodes"].values():
            assert all(p["readings"] > 0 for p in ports), message[:300]


def test_a_slow_batch_does_not_free_the_next_batchs_nic_samples() -> None:
    """Found live with 25,000-sample batches on a loaded machine (the demo with NICs): a batch
    that took seconds left its partition looking quiet (caught up, nothing heard for over
    :data:`~peerwatch.streams.live.nic_join.NIC_QUIET_S`) when the next batch came, so that
    batch's NIC samples were all handed on before its GPU samples, ran ahead of the windows it
    closed, and one port comparison came out without readings. A partition is heard from when
    its samples arrive, not only once they are taken."""
    records = scenario()
    want = in_process_ports(records)
    got = live_ports(records, batches=3, batch_s=2.0)
    assert got == want[: len(got)] and len(got) >= len(want) - 1


def test_a_backlog_batch_longer_than_a_nic_partition_holds_reads_on_part_by_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of 25,000 samples from one partition spans about as many NIC samples, past the
    :data:`~peerwatch.streams.live.nic_input.HOLD_MOST` a NIC partition holds before it is
    paused; the read before the batch stopped there, and the windows after it were summarised
    without readings. Here the same at a small scale (50 held, 100 read at a time)."""
    monkeypatch.setattr(nic_input, "HOLD_MOST", 50)
    records = scenario()
    want = in_process_ports(records)
    got = live_ports(records, settings=with_overrides(SETTINGS, {"stream.batch_max": 100}))
    assert got == want[: len(got)] and len(got) >= len(want) - 1
