"""The ``peerwatch`` console script. Intentionally thin: it parses options and dispatches to
``peerwatch.commands.<name>``, each of which wires objects together and holds no logic of its own."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from peerwatch import __version__
from peerwatch.errors import PeerwatchError

#: Subcommand -> module in peerwatch.commands providing ``register(subparsers)``.
COMMANDS: dict[str, str] = {
    "config": "config",
    "kafka": "kafka",
    "alertmanager": "alertmanager",
    "prometheus": "prometheus",
    "topics": "topics",
    "demo": "demo",
    "eval": "eval",
    "simulate": "simulate",
    "stream": "stream",
    "bench": "bench",
    "export": "export",
    "agent": "agent",
    "health": "health",
    "drain-controller": "drain_controller",
    "slurm": "slurm",
    "archive": "archive",
    "replay": "replay",
    "job": "job",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand's module is imported (fast start-up for
    Slurm hooks: importing every command costs a few hundred milliseconds)."""
    parser = argparse.ArgumentParser(
        prog="peerwatch",
        description="GPU-cluster monitoring for Slurm training clusters on Apache Kafka.",
    )
    parser.add_argument("--version", action="version", version=f"peerwatch {__version__}")
    parser.add_argument("--config", help="TOML config file (default: $PEERWATCH_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"peerwatch.commands.{module}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(argv)
    from peerwatch.display import setup_logging

    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        code: int = args.func(args)
    except PeerwatchError as exc:
        from peerwatch.display import TEXT_MAX_CHARS, display_text

        print(f"peerwatch {args.command}: {display_text(exc, TEXT_MAX_CHARS * 4)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
