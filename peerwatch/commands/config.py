"""``peerwatch config`` — print the effective settings tree as TOML (secrets omitted), which
``--config`` reads back unchanged; ``--reference`` prints the generated settings reference."""

from __future__ import annotations

import argparse
from typing import Any

from peerwatch.commands import settings_of


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="print the effective settings as TOML (secrets omitted)")
    p.add_argument("--reference", action="store_true",
                   help="print the reference of every setting (markdown) instead")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peerwatch.settings_doc import reference, to_toml

    print(reference() if args.reference else to_toml(settings_of(args)), end="")
    return 0
