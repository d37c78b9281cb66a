"""``peerwatch demo`` — placeholder until the pipeline lands."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="simulated fleet through real Kafka (walking skeleton)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise NotImplementedError
