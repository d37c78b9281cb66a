"""``peerwatch kafka start|stop|status|fetch`` — a real local Apache Kafka without Docker."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from peerwatch.commands import settings_of

if TYPE_CHECKING:
    from peerwatch.local.kafka import LocalKafka


def register(sub: Any) -> None:
    p = sub.add_parser("kafka", help="run a local single-node Kafka (KRaft) on 127.0.0.1")
    p.add_argument("action", choices=["start", "stop", "status", "fetch"])
    p.add_argument("--port", type=int, default=9092, help="broker port (default 9092)")
    p.add_argument("--controller-port", type=int, default=None,
                   help="KRaft controller port (default: the broker port + 100, 9192)")  # fmt: skip
    p.add_argument("--secure", action="store_true",
                   help="SASL_SSL (SCRAM-SHA-512) with the project's own CA, ACLs enforced, one "
                        "user per role; passwords and certificates under the state dir (give it to "
                        "status too)")  # fmt: skip
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds to wait for readiness (a broker holding many old topics loads slowly)",
    )
    p.set_defaults(func=run)


def local_kafka(args: argparse.Namespace) -> LocalKafka:
    from peerwatch.local.kafka import LocalKafka
    from peerwatch.settings import expand

    settings = settings_of(args)
    return LocalKafka(
        cache_dir=expand(settings.cache_dir),
        state_dir=expand(settings.state_dir),
        port=args.port,
        controller_port=args.controller_port,
        secure=args.secure,
    )


def run(args: argparse.Namespace) -> int:
    kafka = local_kafka(args)
    if args.action == "fetch":
        print(kafka.fetch())
    elif args.action == "start":
        outcome = kafka.start(timeout_s=args.timeout)
        print(f"kafka {outcome}: {kafka.bootstrap} (log: {kafka.log_file})")
        if kafka.secure:
            print(f"secured: SASL_SSL SCRAM-SHA-512; CA {kafka.tls_dir / 'ca.pem'}; passwords in "
                  f"{kafka.credentials_dir}/<user>.password (admin: admin)")  # fmt: skip
    elif args.action == "stop":
        print(f"kafka {kafka.stop()}")
    else:
        status = kafka.status()
        print(f"kafka {status}")
        return 0 if status.startswith("running") else 1
    return 0
