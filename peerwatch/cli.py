"""The ``peerwatch`` console script. Intentionally thin: it parses options and dispatches to
``peerwatch.commands.<name>``, each of which wires objects together and holds no logic of its own."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any

from peerwatch import __version__
from peerwatch.display import TEXT_MAX_CHARS, display_text
from peerwatch.errors import PeerwatchError
from peerwatch.extras import missing_extra

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


#: How ``peerwatch --help`` groups the commands: what runs on a cluster, what operators use,
#: what is for development and evaluation.
GROUPS: dict[str, tuple[str, ...]] = {
    "services (long-running, one systemd unit each; see docs/operations.md)": (
        "stream", "agent", "slurm", "archive", "export", "drain-controller",
    ),
    "operator tools": ("job", "replay", "health", "topics", "config"),
    "development and evaluation (not for production)": (
        "demo", "simulate", "eval", "bench", "kafka", "prometheus", "alertmanager",
    ),
}  # fmt: skip
#: One example per command, shown at the end of its ``--help``.
EXAMPLES: dict[str, str] = {
    "config": "peerwatch --config /etc/peerwatch/peerwatch.toml config",
    "kafka": "peerwatch kafka start --port 9092",
    "alertmanager": "peerwatch alertmanager start --port 9093",
    "prometheus": "peerwatch prometheus start --port 9090",
    "topics": "peerwatch topics create --replication-factor 3",
    "demo": "peerwatch demo",
    "eval": "peerwatch eval --suite quick --only clock-8pct-s1",
    "simulate": "peerwatch simulate --scenario straggler.json --archive /tmp/sim",
    "stream": "peerwatch --config /etc/peerwatch/peerwatch.toml stream",
    "bench": "peerwatch bench stream",
    "export": "peerwatch export otlp --endpoint http://127.0.0.1:4317",
    "agent": "peerwatch agent --interval-s 1",
    "health": "peerwatch health epilog --expected-gpus 8",
    "drain-controller": "peerwatch drain-controller run --enforce",
    "slurm": "peerwatch slurm watch",
    "archive": "peerwatch archive --dir /var/lib/peerwatch/archive --retention-days 30",
    "replay": "peerwatch replay --archive /var/lib/peerwatch/archive --from 2026-01-01T00:00 "
    "--to 2026-01-01T06:00 --report incident.html",
    "job": "peerwatch job 123456 --html job-123456.html",
}


class CommandParser(argparse.ArgumentParser):
    """A command's parser: it also accepts the global flags (``--config``, ``-v``) after the
    command name, as do its own sub-commands (``export otlp``), and keeps its description and
    example as written."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        # SUPPRESS: a flag not given here leaves the value given before the command alone.
        self.add_argument("--config", default=argparse.SUPPRESS,
                          help="TOML config file (default: $PEERWATCH_CONFIG)")  # fmt: skip
        self.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                          help="debug logging")  # fmt: skip


class _Commands:
    """What ``register(sub)`` receives: ``add_parser`` of the real subparsers action that
    records each command's one-line help (for the grouped ``--help``), makes it the command's
    description when it has none, and adds its example."""

    def __init__(self, action: Any) -> None:
        self.action = action
        self.help: dict[str, str] = {}

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        text = kwargs.pop("help", "")
        self.help[name] = text
        kwargs.setdefault("description", text[:1].upper() + text[1:] + "." if text else None)
        if name in EXAMPLES:
            kwargs.setdefault("epilog", f"example:\n  {EXAMPLES[name]}")
        parser: argparse.ArgumentParser = self.action.add_parser(name, **kwargs)
        return parser

    @property
    def choices(self) -> dict[str, argparse.ArgumentParser]:
        """The parsers added so far, by command name (as the subparsers action's)."""
        found: dict[str, argparse.ArgumentParser] = self.action.choices
        return found


def _grouped(helps: dict[str, str]) -> str:
    lines = []
    for title, names in GROUPS.items():
        shown = [n for n in names if n in helps]
        if shown:
            lines += ["", f"{title}:"] + [f"  {n:<18}{helps[n]}" for n in shown]
    rest = [n for n in helps if not any(n in names for names in GROUPS.values())]
    if rest:
        lines += ["", "other:"] + [f"  {n:<18}{helps[n]}" for n in rest]
    return "\n".join(lines[1:])


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, just that subcommand's module is imported (fast start-up for
    Slurm hooks: importing every command costs a few hundred milliseconds)."""
    parser = argparse.ArgumentParser(
        prog="peerwatch",
        description="GPU-cluster monitoring for Slurm training clusters on Apache Kafka.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"peerwatch {__version__}")
    parser.add_argument("--config", help="TOML config file (default: $PEERWATCH_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    action = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, help="one of those below",
                                   parser_class=CommandParser)  # fmt: skip
    commands = _Commands(action)
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(f"peerwatch.commands.{module}").register(commands)
    parser.epilog = (
        _grouped(commands.help)
        + "\n\n`peerwatch COMMAND --help` describes a command, with an example."
    )
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command word of ``argv``: its first word that is neither a flag nor the value of the
    global ``--config``."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--config":
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def unknown_command(word: str) -> str:
    """The message for a command word that is not one: the closest commands, if any."""
    close = difflib.get_close_matches(word, list(COMMANDS), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return (
        f"peerwatch: unknown command {display_text(word, 40)!r}{hint} (peerwatch --help lists them)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = command_of(argv)
    if first is not None and first not in COMMANDS:
        print(unknown_command(first), file=sys.stderr)
        return 2
    parser = build_parser(first)
    args = parser.parse_args(argv)
    from peerwatch.display import setup_logging

    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    try:
        code: int = args.func(args)
    except PeerwatchError as exc:
        print(f"peerwatch {args.command}: {display_text(exc, TEXT_MAX_CHARS * 4)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # A command of a role whose extra is not installed (pip install 'peerwatch[agent]' on
        # a node, then `peerwatch stream`): name the extra instead of a traceback.
        missing = missing_extra(exc)
        if missing is None:
            raise
        print(f"peerwatch {args.command}: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
