"""``peerwatch topics create|list`` — the topic catalogue on a real cluster; ``list`` shows
beside each catalogue topic what the broker holds (partitions, configs that differ, missing)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.display import display_text
from peerwatch.topics import catalogue


def register(sub: Any) -> None:
    p = sub.add_parser("topics", help="create or list the catalogue's topics")
    p.add_argument("action", choices=["create", "list"])
    p.add_argument("--replication-factor", type=int, default=1)
    p.add_argument("--catalogue-only", action="store_true",
                   help="list: the catalogue alone, without asking the broker")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
