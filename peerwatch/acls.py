"""Least privilege on the broker: one Kafka principal per peerwatch role and its narrowest ACLs.

:data:`ROLES` names the roles; :func:`grants` lists what one role may do, built from the topic
catalogue (:mod:`peerwatch.topics`) with the settings' ``topic_prefix``, the stream's app id and
the consumer groups; :func:`acl_table` is the documented table (docs/operations.md, "Secured
deployment"); :func:`apply_acls` creates the bindings through the admin API (``peerwatch topics
acls --apply``). Pure data apart from :func:`apply_acls`.

Idempotent producers: every confluent-kafka producer here is idempotent (``enable.idempotence``,
:data:`peerwatch.kafka_config.PRODUCER_DEFAULTS`). Since Kafka 3.0 (KIP-679) the broker lets an
idempotent producer initialise when its principal may Write any topic, so no role is granted
IdempotentWrite on the cluster; none uses transactions, so none has a TransactionalId ACL.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peerwatch.topics import (
    ACTIONS,
    DEADLETTER,
    HEALTH,
    JOB_EVENTS,
    JOB_WINDOWS,
    NIC_SAMPLES,
    NODE_EVENTS,
    RECOMMENDATIONS,
    SAMPLES,
    STEP_TIMES,
    STRAGGLERS,
    STREAM_SETTINGS,
    TOPICS,
    TopicSpec,
)

#: Role -> what it is (the table's first column).
ROLES: dict[str, str] = {
    "agent": "GPU agent on every node (`peerwatch agent`)",
    "slurm": "Slurm prolog/epilog hooks and the watcher (`peerwatch slurm ...`)",
    "health": "health checks (`peerwatch health`)",
    "stream": "stream workers (`peerwatch stream`)",
    "drain": "drain controller (`peerwatch drain-controller`)",
    "exporter": "exporters (`peerwatch export otlp|stdout|alertmanager`)",
    "archiver": "archiver (`peerwatch archive`)",
}
#: Consumer-group name prefixes of the exporters and the archiver (their ``--group-id`` defaults
#: start with them).
EXPORTER_GROUPS = "peerwatch-export"
ARCHIVER_GROUPS = "peerwatch-archive"
#: Topics the exporters read (exporters/consume.py EXPORTED_TOPICS + NIC_TOPICS and the
#: Alertmanager exporter).
EXPORTED = (JOB_WINDOWS, JOB_EVENTS, STRAGGLERS, RECOMMENDATIONS, HEALTH, ACTIONS, NIC_SAMPLES)
STREAM_INPUTS = (SAMPLES, NIC_SAMPLES, JOB_EVENTS, NODE_EVENTS, HEALTH, STEP_TIMES)
STREAM_OUTPUTS = (JOB_WINDOWS, STRAGGLERS, RECOMMENDATIONS, STREAM_SETTINGS, DEADLETTER)


@dataclass(frozen=True, order=True)
class Grant:
    """One ALLOW binding: ``operation`` (Kafka's name: Read, Write, Create, Describe,
    DescribeConfigs) on a ``resource`` ("topic", "group") named ``name`` matched ``pattern``
    ("literal" or "prefixed")."""

    resource: str
    name: str
    pattern: str
    operation: str


def default_users(prefix: str = "") -> dict[str, str]:
    """Role -> SASL user name: ``peerwatch-<role>`` (with an optional prefix for tenants/tests)."""
    return {role: f"{prefix}peerwatch-{role}" for role in ROLES}


def _topics(prefix: str, specs: Iterable[TopicSpec], *operations: str) -> list[Grant]:
    return [Grant("topic", prefix + s.name, "literal", op) for s in specs for op in operations]


def grants(
    role: str, *, topic_prefix: str = "", app_id: str = "peerwatch-stream",
    drain_group: str = "peerwatch-drain-controller",
) -> list[Grant]:  # fmt: skip
    """The bindings of ``role`` (a key of :data:`ROLES`), sorted. ``app_id`` is the stream's
    full app id (``topic_prefix`` + ``stream.app_id``): its internal, changelog and consumer-group
    names all start with it. Raises KeyError for an unknown role."""
    p = topic_prefix
    out: list[Grant]
    if role == "agent":
        out = _topics(p, (SAMPLES, NIC_SAMPLES, DEADLETTER), "Write")
    elif role == "slurm":
        out = _topics(p, (JOB_EVENTS, NODE_EVENTS), "Write")
    elif role == "health":
        out = _topics(p, (HEALTH,), "Write")
    elif role == "stream":
        out = _topics(p, STREAM_INPUTS, "Read") + _topics(p, STREAM_OUTPUTS, "Write")
        # It checks the whole catalogue at start (partition counts: co-partitioning).
        out += _topics(p, TOPICS, "Describe", "DescribeConfigs")
        # Its own topics: repartition topics, faust's changelogs and leader topic (created by
        # the worker, hence Create and DescribeConfigs); its groups: the app and the hot stage.
        out += [Grant("topic", app_id, "prefixed", op)
                for op in ("Read", "Write", "Create", "Describe", "DescribeConfigs")]  # fmt: skip
        out.append(Grant("group", app_id, "prefixed", "Read"))
    elif role == "drain":
        out = _topics(p, (RECOMMENDATIONS, NODE_EVENTS), "Read")
        out += _topics(p, (ACTIONS, DEADLETTER), "Write")
        out.append(Grant("group", drain_group, "literal", "Read"))
    elif role == "exporter":
        # Read only; an undecodable record is dead-lettered, never dropped, hence that Write.
        out = _topics(p, EXPORTED, "Read") + _topics(p, (DEADLETTER,), "Write")
        out.append(Grant("group", EXPORTER_GROUPS, "prefixed", "Read"))
    elif role == "archiver":
        # It checks the whole catalogue at start (describes partitions and configs).
        archived = [t for t in TOPICS if t.value_schema]
        out = _topics(p, archived, "Read") + _topics(p, (DEADLETTER,), "Write")
        out += _topics(p, TOPICS, "Describe", "DescribeConfigs")
        out.append(Grant("group", ARCHIVER_GROUPS, "prefixed", "Read"))
    else:
        raise KeyError(role)
    return sorted(set(out))


def acl_table(**kwargs: str) -> str:
    """The ACL table as Markdown (docs/operations.md), for the defaults or the given names."""
    lines = ["| role | principal | operation | resource | pattern |", "|---|---|---|---|---|"]
    for role, user in default_users().items():
        for g in grants(role, **kwargs):
            lines.append(f"| {role} | User:{user} | {g.operation} | {g.resource} `{g.name}` "
                         f"| {g.pattern} |")  # fmt: skip
    return "\n".join(lines)


def bindings(users: Mapping[str, str], **kwargs: str) -> list[tuple[str, Grant]]:
    """(principal, grant) for every role in ``users`` (role -> SASL user)."""
    return [(f"User:{user}", g) for role, user in users.items() for g in grants(role, **kwargs)]


def apply_acls(admin: object, pairs: Sequence[tuple[str, Grant]], timeout_s: float = 30.0) -> int:
    """Create every binding with ``admin`` (a confluent-kafka AdminClient) and wait until the
    broker describes them all (in force); returns how many. Creating an existing binding is a
    no-op on the broker. Raises KafkaException (e.g. the admin principal may not alter ACLs) or
    ServiceError when Kafka does not answer or the bindings are not in force in ``timeout_s``."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    from peerwatch.errors import ServiceError
    from peerwatch.topic_admin import _result

    operation = {"Read": AclOperation.READ, "Write": AclOperation.WRITE,
                 "Create": AclOperation.CREATE, "Describe": AclOperation.DESCRIBE,
                 "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS}  # fmt: skip
    resource = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}
    pattern = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
    acls = [
        AclBinding(
            resource[g.resource],
            g.name,
            pattern[g.pattern],
            principal,
            "*",
            operation[g.operation],
            AclPermissionType.ALLOW,
        )
        for principal, g in pairs
    ]
    if not acls:
        return 0
    futures = admin.create_acls(acls, request_timeout=timeout_s)  # type: ignore[attr-defined]
    for binding, future in futures.items():
        _result(future, timeout_s, f"create ACL {binding}")
    # The controller has them; the broker's authorizer applies them once it has replayed the
    # metadata (tried: a write right after creation was refused). Return when it describes all.
    wanted = set(acls)
    # None matches any name, principal and host (the stubs say str).
    anything: Any = None
    any_binding = AclBindingFilter(
        ResourceType.ANY, anything, ResourcePatternType.ANY, anything, anything,
        AclOperation.ANY, AclPermissionType.ANY,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while True:
        future = admin.describe_acls(any_binding, request_timeout=timeout_s)  # type: ignore[attr-defined]
        missing = wanted - set(_result(future, timeout_s, "describe ACLs"))
        if not missing:
            return len(acls)
        if time.monotonic() >= deadline:
            raise ServiceError(f"{len(missing)} ACL bindings not in force after {timeout_s:g} s")
        time.sleep(0.1)
