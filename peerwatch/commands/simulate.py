"""``peerwatch simulate`` — a simulated fleet into Kafka (through the producers' delivery path)
or, with ``--archive DIR``, into Avro container files plus ``labels.jsonl`` with no Kafka at all."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of


def register(sub: Any) -> None:
    p = sub.add_parser("simulate", help="run a simulated GPU fleet (scenario file or flags)")
    p.add_argument("--scenario", help="scenario file (JSON or TOML, see docs/scenarios.md)")
    p.add_argument("--nodes", type=int, help="number of nodes")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node")
    p.add_argument("--duration", type=float, help="simulated seconds")
    p.add_argument("--seed", type=int, help="random seed (same seed, same output)")
    p.add_argument("--interval-s", type=float, help="sampling interval, seconds")
    p.add_argument(
        "--rate", type=float, default=0.0,
        help="node records per wall-clock second (0 = as fast as possible)",
    )  # fmt: skip
    p.add_argument(
        "--start-ms", default=None,
        help="event time of the first tick, epoch ms, or 'now' (default: 'now' when publishing to "
        "Kafka, whose retention would delete records stamped in the past; the scenario's own "
        "start with --archive, so archives stay byte-identical)",
    )  # fmt: skip
    p.add_argument("--step-times", action="store_true", help="also publish StepTime records")
    p.add_argument("--archive", metavar="DIR", help="write Avro files + labels.jsonl, no Kafka")
    p.add_argument("--labels", metavar="FILE", help="also write the ground-truth labels here")
    p.set_defaults(func=run)


def build_fleet(args: argparse.Namespace) -> Any:
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.scenario import default_scenario, load_scenario, with_fleet

    scenario = load_scenario(args.scenario) if args.scenario else default_scenario()
    changes = {
        name: value
        for name, value in (
            ("nodes", args.nodes), ("gpus_per_node", args.gpus_per_node),
            ("duration_s", args.duration), ("seed", args.seed), ("interval_s", args.interval_s),
        )
        if value is not None
    }  # fmt: skip
    if args.step_times:
        changes["step_times"] = True
    start = args.start_ms if args.start_ms is not None else (None if args.archive else "now")
    if start == "now":
        interval_ms = int((args.interval_s or scenario.fleet.interval_s) * 1000)
        now_ms = int(time.time() * 1000)
        changes["start_ms"] = now_ms - now_ms % interval_ms
    elif start is not None:
        changes["start_ms"] = int(start)
    if changes:
        scenario = with_fleet(scenario, **changes)
    return Fleet(scenario)


def run(args: argparse.Namespace) -> int:
    from peerwatch.console import EventTimeProgress
    from peerwatch.producers.sim.publish import STREAM_TOPICS, publish_to_kafka, write_archive

    fleet = build_fleet(args)
    settings = settings_of(args)
    # A bar with ETA over the simulated time, on a terminal only (stderr; stdout is the JSON).
    bar = EventTimeProgress(fleet.spec.start_ms, fleet.spec.start_ms + fleet.spec.duration_ms,
                            sys.stderr, "simulate")  # fmt: skip

    def on_tick(tick_ms: int, stats: Any) -> None:
        bar.update(tick_ms, stats.node_records)

    cpu_start = _cpu_s()
    if args.labels:
        Path(args.labels).write_text(
            "".join(json.dumps(lbl, sort_keys=True) + "\n" for lbl in fleet.labels())
        )
    if args.archive:
        stats = write_archive(fleet, Path(args.archive), settings.topic_prefix, on_tick)
    else:
        from peerwatch.producers.delivery import Delivery, DeliverySettings
        from peerwatch.settings import expand
        from peerwatch.topic_admin import ensure_topics
        from peerwatch.topics import catalogue

        ensure_topics(
            settings.kafka, catalogue(settings.topic_prefix, settings.stream.node_partitions)
        )
        delivery = Delivery(
            settings.kafka,
            DeliverySettings(spool_dir=expand(settings.spool_dir) / "simulate"),
        ).start()
        try:
            stats = publish_to_kafka(
                fleet, delivery, settings.topic_prefix, args.rate, on_tick=on_tick
            )
        finally:
            delivery.close(timeout_s=60)
        if delivery.stats.delivered < stats.records:
            print(
                f"warning: {stats.records - delivery.stats.delivered} records not delivered "
                f"(spooled: {delivery.spooled_records})",
                file=sys.stderr,
            )
    bar.done(stats.node_records)
    cpu_s = _cpu_s() - cpu_start
    summary = {
        "nodes": fleet.spec.nodes, "gpus_per_node": fleet.spec.gpus_per_node,
        "node_records": stats.node_records, "records": stats.records,
        "wall_s": round(stats.wall_s, 3), "node_records_per_s": round(stats.node_records_per_s, 1),
        "cpu_s": round(cpu_s, 3),
        "node_records_per_cpu_s": round(stats.node_records / cpu_s, 1) if cpu_s else None,
        "topics": sorted({t.name for t in STREAM_TOPICS.values()}),
        "archive": args.archive,
    }  # fmt: skip
    print(json.dumps(summary))
    return 0


def _cpu_s() -> float:
    """CPU seconds of this process, every thread (librdkafka's included)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
