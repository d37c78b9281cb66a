"""``peerwatch alertmanager start|stop|status`` — a real local Alertmanager (Debian's package)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of


def register(sub: Any) -> None:
    p = sub.add_parser("alertmanager", help="run a local Alertmanager on 127.0.0.1")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--port", type=int, help="web/API port (default alertmanager.port, 9093)")
    p.add_argument("--config-file", type=Path, help="alertmanager.yml (default: a null receiver)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for readiness")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peerwatch.local.alertmanager import LocalAlertmanager
    from peerwatch.settings import expand

    settings = settings_of(args, {"alertmanager.port": args.port})
    am = LocalAlertmanager(
        state_dir=expand(settings.state_dir),
        port=settings.alertmanager.port,
        config_file=args.config_file,
    )
    if args.action == "start":
        outcome = am.start(timeout_s=args.timeout)
        print(f"alertmanager {outcome}: {am.url} (log: {am.log_file})")
    elif args.action == "stop":
        print(f"alertmanager {am.stop()}")
    else:
        status = am.status()
        print(f"alertmanager {status}")
        return 0 if status.startswith("running") else 1
    return 0
