"""``peerwatch topics create|list|acls`` — the topic catalogue on a real cluster (``list`` shows
beside each catalogue topic what the broker holds: partitions, configs that differ, missing), and
the ACLs of each role's principal (:mod:`peerwatch.acls`; ``acls`` prints them, ``acls --apply``
creates them as the configured Kafka user, who must be allowed to alter ACLs)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.display import display_text
from peerwatch.topics import catalogue


def register(sub: Any) -> None:
    p = sub.add_parser("topics", help="create or list the catalogue's topics, or their ACLs")
    p.add_argument("action", choices=["create", "list", "acls"])
    p.add_argument("--replication-factor", type=int, default=1)
    p.add_argument("--catalogue-only", action="store_true",
                   help="list: the catalogue alone, without asking the broker")  # fmt: skip
    p.add_argument("--apply", action="store_true",
                   help="acls: create the bindings on the cluster (else only print them)")  # fmt: skip
    p.add_argument("--user", action="append", default=[], metavar="ROLE=NAME",
                   help="acls: the SASL user of a role (default peerwatch-<role>); repeatable")  # fmt: skip
    p.set_defaults(func=run)


def _users(pairs: list[str]) -> dict[str, str]:
    from peerwatch.acls import ROLES, default_users
    from peerwatch.errors import ConfigError

    users = default_users()
    for pair in pairs:
        role, sep, name = pair.partition("=")
        if not sep or role not in ROLES or not name.strip():
            raise ConfigError(
                "--user", f"{pair!r} is not ROLE=NAME with ROLE one of {', '.join(ROLES)}"
            )
        users[role] = name.strip()
    return users


def _acls(args: argparse.Namespace) -> int:
    from peerwatch.acls import apply_acls, bindings

    settings = settings_of(args)
    pairs = bindings(
        _users(args.user), topic_prefix=settings.topic_prefix,
        app_id=settings.topic_prefix + settings.stream.app_id, drain_group=settings.drain.group_id,
    )  # fmt: skip
    for principal, g in pairs:
        print(f"{principal:32} {g.operation:16} {g.resource:6} {g.pattern:9} {g.name}")
    if args.apply:
        from confluent_kafka.admin import AdminClient

        from peerwatch.kafka_config import admin_config

        count = apply_acls(AdminClient(admin_config(settings.kafka)), pairs)
        print(f"applied {count} ACL bindings")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "acls":
        return _acls(args)
    settings = settings_of(args)
    specs = catalogue(settings.topic_prefix, settings.stream.node_partitions)
    if args.action == "list":
        from peerwatch.console import make_console, table, user_text
        from peerwatch.errors import ServiceError

        held: dict[str, str] = {}
        if not args.catalogue_only:
            from peerwatch.topic_admin import broker_state

            try:
                held = broker_state(settings.kafka, list(specs), timeout_s=10.0)
            except ServiceError as exc:
                print(f"topics: the broker was not asked ({display_text(exc, 300)})",
                      file=sys.stderr)  # fmt: skip
        grid = table("topic", "key", "value", "partitions", "cleanup", *(["broker"] if held else []),
                     right=(3,), keep=(0, 2, 3, 4))  # fmt: skip
        for t in specs:
            broker = [user_text(held.get(t.name, "-"), 300)] if held else []
            grid.add_row(user_text(t.name, 120), t.key, t.value_schema or "raw bytes",
                         str(t.partitions), t.cleanup_policy, *broker)  # fmt: skip
        make_console().print(grid)
        return 0
    from peerwatch.topic_admin import ensure_topics

    for change in ensure_topics(settings.kafka, specs, replication_factor=args.replication_factor):
        differs = f"; config differs: {'; '.join(change.mismatches)}" if change.mismatches else ""
        print(display_text(f"{change.outcome:8} {change.name} ({change.partitions} partitions"
                           f"{differs})", 1000))  # fmt: skip
    return 0
