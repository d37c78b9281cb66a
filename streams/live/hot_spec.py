"""What a worker's hot stage is built from: its topics and settings (picklable: a hot process
gets them), and the producers' partitioner, by which the silence watch knows the nodes of its
samples partitions."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from peerwatch.settings import Settings

if TYPE_CHECKING:
    from peerwatch.streams.live.hot_stage import HotStage


@functools.lru_cache(maxsize=1 << 16)
def samples_partition(node: str, partitions: int) -> int:
    """The samples partition of ``node``: Kafka's default keyed partitioner (murmur2), which the
    producers (librdkafka ``murmur2_random``) and faust (aiokafka) both use."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(node.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class HotTopics:
    samples: str
    job_events: str
    batches: str
    deadletter: str
    job_partitions: int
    #: The public findings topic (Avro, key job) and the internal one the policy reads (JSON,
    #: key node).
    findings: str = ""
    node_findings: str = ""
    #: The NIC samples topic (NodeNicSample, key node); "" reads none.
    nic_samples: str = ""


@dataclass(frozen=True)
class HotSpec:
    """Everything a worker's hot stage is built from (picklable: a hot process gets it)."""

    settings: Settings
    app_id: str
    topics: HotTopics
    #: Partitions of the samples topic (the producers' partitioner, for the silence watch).
    node_partitions: int

    def build(self, counters: Any) -> HotStage:
        """The hot stage, counting into ``counters``."""
        from peerwatch.streams.live.hot_stage import HotStage

        return HotStage(
            self.settings, self.app_id, self.topics, counters,
            partition_of=functools.partial(samples_partition, partitions=self.node_partitions),
        )  # fmt: skip
