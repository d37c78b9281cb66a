"""``peerwatch topics create|list`` — the topic catalogue on a real cluster."""

from __future__ import annotations

import argparse
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.topics import catalogue


def register(sub: Any) -> None:
    p = sub.add_parser("topics", help="create or list the catalogue's topics")
    p.add_argument("action", choices=["create", "list"])
    p.add_argument("--replication-factor", type=int, default=1)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    specs = catalogue(settings.topic_prefix, settings.stream.node_partitions)
    if args.action == "list":
        for t in specs:
            print(f"{t.name:34} key={t.key:12} value={t.value_schema or 'raw bytes':20} "
                  f"partitions={t.partitions:<3} cleanup={t.cleanup_policy}")  # fmt: skip
        return 0
    from peerwatch.topic_admin import ensure_topics

    for change in ensure_topics(settings.kafka, specs, replication_factor=args.replication_factor):
        differs = f"; config differs: {'; '.join(change.mismatches)}" if change.mismatches else ""
        print(f"{change.outcome:8} {change.name} ({change.partitions} partitions{differs})")
    return 0
