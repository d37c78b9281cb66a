"""``peerwatch config`` — print the effective settings tree as TOML (secrets omitted), which
``--config`` reads back unchanged, each value's comment saying where it came from (``[default]``,
``[file PATH]``, ``[env VAR]``); ``--reference`` prints the generated settings reference."""

from __future__ import annotations

import argparse
from typing import Any

from peerwatch.commands import settings_of


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="print the effective settings as TOML, each with where it "
                       "came from (default, file, env; secrets omitted)")  # fmt: skip
    p.add_argument("--reference", action="store_true",
                   help="print the reference of every setting (markdown) instead")  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peerwatch.settings import setting_sources
    from peerwatch.settings_doc import reference, to_toml

    if args.reference:
        print(reference(), end="")
        return 0
    sources = setting_sources(getattr(args, "config", None))
    print(to_toml(settings_of(args), sources), end="")
    return 0
