"""Create the catalogue's topics idempotently on a real cluster (confluent-kafka AdminClient),
and check what exists against the catalogue: partitions (refused when they differ) and configs
(reported)."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
)

from peerwatch.errors import ServiceError, TopicError
from peerwatch.kafka_config import admin_config
from peerwatch.settings import KafkaSettings
from peerwatch.topics import TOPICS, TopicSpec


@dataclass(frozen=True)
class TopicChange:
    """What ``ensure_topics`` did with one topic: ``outcome`` "created" or "exists", its
    partition count as the broker describes it, and every config that differs from the
    catalogue's (``"retention.ms is 1000, the catalogue says 86400000"``)."""

    name: str
    outcome: str  # "created" | "exists"
    partitions: int
    mismatches: tuple[str, ...] = ()


def _result(future: Any, timeout_s: float, what: str) -> Any:
    """The result of an admin request's future; ServiceError when Kafka gave no answer in
    ``timeout_s`` (no broker at the bootstrap address, or one that is not up yet)."""
    try:
        return future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError as exc:
        raise ServiceError(
            f"Kafka gave no answer in {timeout_s:g} s ({what}): is a broker running at the "
            "bootstrap address? (`peerwatch kafka start` starts a local one)"
        ) from exc


def describe_partitions(admin: AdminClient, names: list[str], timeout_s: float) -> dict[str, int]:
    """Partition counts of the named topics that exist, asked of the broker topic by topic
    (DescribeTopics: not a metadata listing a busy broker may not have caught up on). Raises
    ServiceError when Kafka cannot answer."""
    if not names:
        return {}
    try:
        futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceError(f"cannot describe topics on Kafka: {exc}") from exc
    found: dict[str, int] = {}
    for name, future in futures.items():
        try:
            found[name] = len(_result(future, timeout_s, f"describe {name}").partitions)
        except KafkaException as exc:
            if _error_name(exc) == "UNKNOWN_TOPIC_OR_PART":
                continue
            raise ServiceError(f"cannot describe {name} on Kafka: {exc}") from exc
    return found


def describe_configs(admin: AdminClient, specs: list[TopicSpec], timeout_s: float
                     ) -> dict[str, tuple[str, ...]]:  # fmt: skip
    """Per topic, each catalogue config (``TopicSpec.config``) the broker holds otherwise."""
    if not specs:
        return {}
    resources = [ConfigResource(ConfigResource.Type.TOPIC, s.name) for s in specs]
    try:
        futures = admin.describe_configs(resources, request_timeout=timeout_s)
    except KafkaException as exc:
        raise ServiceError(f"cannot describe topic configs on Kafka: {exc}") from exc
    by_name = {r.name: f for r, f in futures.items()}
    out: dict[str, tuple[str, ...]] = {}
    for spec in specs:
        try:
            held = _result(by_name[spec.name], timeout_s, f"describe {spec.name}'s configs")
        except KafkaException as exc:
            raise ServiceError(f"cannot describe {spec.name}'s configs: {exc}") from exc
        out[spec.name] = tuple(
            f"{key} is {held[key].value if key in held else 'unset'}, the catalogue says {want}"
            for key, want in sorted(spec.config().items())
            if key not in held or held[key].value != want
        )
    return out


def _error_name(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return str(err.name()) if isinstance(err, KafkaError) else ""


def _refuse_mismatched(specs: list[TopicSpec], existing: dict[str, int]) -> None:
    mismatched = [
        f"{s.name} has {existing[s.name]} partitions, the catalogue says {s.partitions}"
        for s in specs
        if s.name in existing and existing[s.name] != s.partitions
    ]
    if mismatched:
        # A keyed record lands on murmur2(key) % partitions: another count sends every key
        # elsewhere than the co-partitioned topics and the stream tables expect (STACK.md).
        raise TopicError(
            "refusing to use mismatched topics (recreate them or change the catalogue): "
            + "; ".join(mismatched)
        )


def ensure_topics(
    settings: KafkaSettings,
    specs: Iterable[TopicSpec] = TOPICS,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> list[TopicChange]:
    """Create every missing topic; leave matching ones alone; describe every one afterwards.

    Raises :class:`TopicError` naming every existing topic whose partition count differs from the
    catalogue (nothing is created then when seen before creating; a topic that turned out to
    exist only at creation, another process's or one the broker's metadata had not caught up
    on, is described and refused the same way), and :class:`ServiceError` when Kafka cannot be
    reached. Config differences (cleanup policy, retention) are reported in each change's
    ``mismatches``, not refused: they change no record's partition.
    """
    specs = list(specs)
    admin = AdminClient(admin_config(settings))
    existing = describe_partitions(admin, [s.name for s in specs], timeout_s)
    _refuse_mismatched(specs, existing)
    missing = [s for s in specs if s.name not in existing]
    # The controller knows every topic at once, a broker's metadata only later: a dry run of
    # the creation finds topics the read missed, to be described and checked before anything
    # is created.
    hidden = _already_existing(admin, missing, replication_factor, timeout_s)
    if hidden:
        existing.update(_described(admin, hidden, timeout_s))
        _refuse_mismatched(specs, existing)
        missing = [s for s in missing if s.name not in existing]
    outcome = {s.name: "exists" for s in specs if s.name in existing}
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
                _result(futures[spec.name], timeout_s, f"create {spec.name}")
                outcome[spec.name] = "created"
            except KafkaException as exc:
                if _error_name(exc) == "TOPIC_ALREADY_EXISTS":
                    # Created by another process meanwhile, or missed by the first read:
                    # described below like any existing topic, never taken on trust.
                    outcome[spec.name] = "exists"
                    continue
                raise TopicError(f"cannot create {spec.name}: {exc.args[0]}") from exc
    partitions = _described(admin, specs, timeout_s)
    _refuse_mismatched(specs, partitions)
    configs = describe_configs(admin, specs, timeout_s)
    return [
        TopicChange(s.name, outcome[s.name], partitions[s.name], configs.get(s.name, ()))
        for s in specs
    ]


def _already_existing(admin: AdminClient, specs: list[TopicSpec], replication_factor: int,
                      timeout_s: float) -> list[TopicSpec]:  # fmt: skip
    """Those of ``specs`` a validate-only creation says exist already."""
    if not specs:
        return []
    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, replication_factor, config=s.config()) for s in specs],
        request_timeout=timeout_s, validate_only=True,
    )  # fmt: skip
    out = []
    for spec in specs:
        try:
            _result(futures[spec.name], timeout_s, f"check {spec.name}")
        except KafkaException as exc:
            if _error_name(exc) == "TOPIC_ALREADY_EXISTS":
                out.append(spec)
            # anything else: the real creation below reports it
    return out


def _described(admin: AdminClient, specs: list[TopicSpec], timeout_s: float) -> dict[str, int]:
    """Partition counts of ``specs`` once the broker describes every one of them (a topic just
    created can take a moment to show). Raises ServiceError when one never shows."""
    deadline = time.monotonic() + timeout_s
    names = [s.name for s in specs]
    while True:
        found = describe_partitions(admin, names, timeout_s)
        if len(found) == len(names):
            return found
        if time.monotonic() >= deadline:
            gone = sorted(set(names) - set(found))
            raise ServiceError(f"topics not described by Kafka after creation: {', '.join(gone)}")
        time.sleep(0.2)


def broker_state(
    settings: KafkaSettings, specs: list[TopicSpec], timeout_s: float = 10.0
) -> dict[str, str]:
    """What the broker holds of each catalogue topic, in words: ``"12 partitions"``,
    ``"missing"``, ``"6 partitions (the catalogue says 12)"``, with the configs that differ
    appended. Raises ServiceError when Kafka cannot answer within ``timeout_s``."""
    admin = AdminClient(admin_config(settings))
    held = describe_partitions(admin, [s.name for s in specs], timeout_s)
    configs = describe_configs(admin, [s for s in specs if s.name in held], timeout_s)
    out: dict[str, str] = {}
    for spec in specs:
        if spec.name not in held:
            out[spec.name] = "missing"
            continue
        n = held[spec.name]
        words = f"{n} partition{'' if n == 1 else 's'}" + ("" if n == spec.partitions
                                     else f" (the catalogue says {spec.partitions})")  # fmt: skip
        out[spec.name] = "; ".join([words, *configs.get(spec.name, ())])
    return out
