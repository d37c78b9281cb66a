"""``peerwatch drain-controller [run|status|reset-breaker|resume NODE]`` — wiring only."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from typing import Any

from confluent_kafka import Consumer, Producer

from peerwatch.clock import SYSTEM_CLOCK
from peerwatch.commands import settings_of
from peerwatch.errors import ServiceError
from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.controller import (
    AuditPublisher,
    DrainController,
    Topics,
    offset_reset,
)
from peerwatch.exporters.drain.operations import describe, reset_breaker, resume_node
from peerwatch.exporters.drain.slurm_ops import ScontrolSlurm
from peerwatch.exporters.drain.state import StateStore
from peerwatch.kafka_config import consumer_config, producer_config
from peerwatch.settings import Settings, expand
from peerwatch.topics import ACTIONS, DEADLETTER, NODE_EVENTS, RECOMMENDATIONS


def register(sub: Any) -> None:
    p = sub.add_parser(
        "drain-controller",
        help="act on drain recommendations (shadow mode unless --enforce)",
        description="Consume peerwatch.drain.recommendations, decide within the safety limits, "
        "drain with scontrol in enforce mode, audit every decision to peerwatch.drain.actions.",
    )
    p.add_argument("action", nargs="?", default="run",
                   choices=["run", "status", "reset-breaker", "resume"])  # fmt: skip
    p.add_argument("node", nargs="?", help="node to resume (with `resume`)")
    p.add_argument("--enforce", action="store_true", default=None,
                   help="change Slurm (default: shadow mode, or PEERWATCH_DRAIN_ENFORCE)")  # fmt: skip
    p.add_argument("--state-file", help="controller state (default: PEERWATCH_DRAIN_STATE_FILE)")
    p.add_argument("--slurm-bin", help="folder of scontrol and sinfo (default: PATH)")
    p.add_argument("--drain-config",
                   help="flat TOML file of [drain] settings (default: $PEERWATCH_DRAIN_CONFIG)")  # fmt: skip
    p.set_defaults(func=run)


def _topics(settings: Settings) -> Topics:
    prefix = settings.topic_prefix
    return Topics(prefix + RECOMMENDATIONS.name, prefix + NODE_EVENTS.name,
                  prefix + ACTIONS.name, prefix + DEADLETTER.name)  # fmt: skip


def _publisher(settings: Settings, drain: DrainSettings) -> AuditPublisher:
    producer = Producer(producer_config(settings.kafka))
    return AuditPublisher(producer, _topics(settings), drain.delivery_timeout_s)


def _deliver_now(settings: Settings, drain: DrainSettings, store: StateStore) -> None:
    """Deliver the outbox right away; if Kafka is down, a running controller delivers it later."""
    with store.transaction() as state:
        pending = list(state.outbox)
    if not pending:
        return
    try:
        _publisher(settings, drain).deliver(pending)
    except ServiceError as exc:
        print(f"audit not delivered yet (the controller will retry): {exc}", file=sys.stderr)
        return
    done = {a["action_id"] for a in pending}
    with store.transaction() as state:
        state.outbox = [a for a in state.outbox if a["action_id"] not in done]


def run(args: argparse.Namespace) -> int:
    settings = settings_of(args, {"drain.enforce": args.enforce, "drain.state_file": args.state_file,
                                  "drain.slurm_bin": args.slurm_bin})  # fmt: skip
    drain = settings.drain
    store = StateStore(expand(drain.state_file))
    slurm = ScontrolSlurm(drain.slurm_bin or None, drain.slurm_timeout_s)
    if args.action == "status":
        print(json.dumps(describe(store, SYSTEM_CLOCK.now_ms()), indent=2))
        return 0
    if args.action == "reset-breaker":
        print(reset_breaker(store, SYSTEM_CLOCK.now_ms()))
        return 0
    if args.action == "resume":
        if not args.node:
            print("peerwatch drain-controller resume: a NODE is required", file=sys.stderr)
            return 2
        action = resume_node(store, slurm, args.node, SYSTEM_CLOCK.now_ms())
        _deliver_now(settings, drain, store)
        print(f"{action['decision']} {action['node']}: {action['detail']}")
        return 0 if action["decision"] == "RESUMED" else 1
    stopping: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))
    from peerwatch.signing import verifier_of

    verifier = verifier_of(settings.signing)  # before connecting: a bad key file exits at once
    reset = offset_reset(store)  # before the controller's first save creates the file
    consumer = Consumer(
        consumer_config(settings.kafka, drain.group_id, **{"auto.offset.reset": reset})
    )
    controller = DrainController(consumer, _publisher(settings, drain), slurm, store, drain,
                                 _topics(settings), verifier=verifier)  # fmt: skip
    from peerwatch.exporters.telemetry_start import start_self_telemetry

    telemetry = start_self_telemetry(
        settings.telemetry, "drain-controller", lambda: dataclasses.asdict(controller.stats)
    )
    try:
        controller.run(stop=lambda: bool(stopping))
    finally:
        consumer.close()
        if telemetry is not None:
            telemetry.close()
    return 0
