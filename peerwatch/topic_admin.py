"""Create the catalogue's topics idempotently on a real cluster (confluent-kafka AdminClient)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from peerwatch.errors import ServiceError, TopicError
from peerwatch.kafka_config import admin_config
from peerwatch.settings import KafkaSettings
from peerwatch.topics import TOPICS, TopicSpec


@dataclass(frozen=True)
class TopicChange:
    name: str
    outcome: str  # "created" | "exists"
    partitions: int


def _existing_partitions(admin: AdminClient, timeout_s: float) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceError(f"cannot fetch metadata from Kafka: {exc}") from exc
    return {name: len(t.partitions) for name, t in metadata.topics.items()}


def ensure_topics(
    settings: KafkaSettings,
    specs: Iterable[TopicSpec] = TOPICS,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> list[TopicChange]:
    """Create every missing topic; leave matching ones alone.

    Raises :class:`TopicError` naming every existing topic whose partition count differs from the
    catalogue (nothing is created then), and :class:`ServiceError` when Kafka cannot be reached.
    """
    specs = list(specs)
    admin = AdminClient(admin_config(settings))
    existing = _existing_partitions(admin, timeout_s)
    mismatched = [
        f"{s.name} has {existing[s.name]} partitions, the catalogue says {s.partitions}"
        for s in specs
        if s.name in existing and existing[s.name] != s.partitions
    ]
    if mismatched:
        raise TopicError(
            "refusing to use mismatched topics (recreate them or change the catalogue): "
            + "; ".join(mismatched)
        )
    missing = [s for s in specs if s.name not in existing]
    changes = [TopicChange(s.name, "exists", s.partitions) for s in specs if s.name in existing]
    if missing:
        futures = admin.create_topics(
            [
                NewTopic(s.name, s.partitions, replication_factor, config=s.config())
                for s in missing
            ],
            request_timeout=timeout_s,
        )
        for spec in missing:
            try:
                futures[spec.name].result(timeout=timeout_s)
                changes.append(TopicChange(spec.name, "created", spec.partitions))
            except KafkaException as exc:
                err = exc.args[0]
                if getattr(err, "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
                    # Another process created it between our metadata read and the request.
                    changes.append(TopicChange(spec.name, "exists", spec.partitions))
                    continue
                raise TopicError(f"cannot create {spec.name}: {err}") from exc
    order = {s.name: i for i, s in enumerate(specs)}
    return sorted(changes, key=lambda c: order[c.name])
