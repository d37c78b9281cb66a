"""``peerwatch eval --suite quick|full|soak|network [--json] [--set detector.NAME=VALUE ...]``.

Runs the labelled simulated scenarios through the offline pipeline with the settings tree
(``--config``, ``PEERWATCH_*``: the settings a live worker would run with) and ``--set``
overrides, and checks the targets; exit status 1 when a target fails. ``soak`` (hours of a
healthy fleet with every confounder) checks what it costs on-call instead: no drain, and GPU-
blaming alerts per 100 node-days (see :mod:`peerwatch.streams.tools.soak`).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.console import CountProgress, make_console
from peerwatch.display import display_text
from peerwatch.errors import ConfigError
from peerwatch.streams.tools.eval_suites import suite
from peerwatch.streams.tools.evaluation import (
    evaluate,
    format_report,
    parse_overrides,
    soak_targets,
)
from peerwatch.streams.tools.soak import format_census, soak_suite


def register(sub: Any) -> None:
    p = sub.add_parser("eval", help="run the labelled simulated scenarios and score the detector")
    p.add_argument("--suite", choices=["quick", "full", "soak", "network"], default="quick")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="TABLE.NAME=VALUE",
        help="override a setting of the detector, policy or stream table, e.g. "
        "detector.mad_floor_clk_rel=0.009 (repeatable)",
    )
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only the scenario of this exact name (repeatable; --list names them)")  # fmt: skip
    p.add_argument("--list", action="store_true", help="list the suite's scenarios and exit")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none unless stderr is a terminal)")  # fmt: skip
    p.set_defaults(func=run)


def chosen_scenarios(names: list[str], scenarios: list[Any]) -> list[Any]:
    """The scenarios named in ``names`` (exact names; all when empty), in suite order. Raises
    ConfigError naming an unknown name and the closest known ones."""
    known = {s.name for s in scenarios}
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see eval --list"
            raise ConfigError("--only", f"no scenario {display_text(name)!r} in this suite{hint}")
    return [s for s in scenarios if not names or s.name in names]


def run(args: argparse.Namespace) -> int:
    soaking = args.suite == "soak"
    chosen = soak_suite() if soaking else suite(args.suite)
    if args.list:
        for s in chosen:
            print(s.name)
        return 0
    settings = parse_overrides(args.set, settings_of(args))
    scenarios = chosen_scenarios(args.only, chosen)
    with CountProgress(f"eval {args.suite}", len(scenarios), sys.stderr,
                       enabled=not args.no_progress) as bar:  # fmt: skip
        results, total, checks = evaluate(scenarios, settings, lambda r: bar.advance(r.name))
    if soaking:  # no fault to recall: what counts is what on-call receives
        checks = soak_targets(total.alerts)
    unmeasured: list[str] = []
    # A subset may hold nothing a target measures, and the network suite has no GPU straggler
    # label: no verdict on what is not measured, not a FAIL.
    if args.only or args.suite == "network":
        unmeasured = [t.name for t in checks if t.value is None]
        checks = [t for t in checks if t.value is not None]
    if args.json:
        doc = {
            "suite": args.suite,
            "overrides": list(args.set),
            "scenarios": [
                {
                    "name": r.name,
                    "gpus": r.gpus,
                    "labels": r.labels,
                    "runtime_s": r.runtime_s,
                    "counters": r.counters,
                    **r.score.to_dict(),
                }
                for r in results
            ],
            "total": total.to_dict(),
            "targets": [
                {"name": t.name, "value": t.value, "goal": t.goal, "passed": t.passed}
                for t in checks
            ],
            "not_measured": unmeasured,
        }
        json.dump(doc, sys.stdout, indent=2, default=str)
        print()
    else:
        if args.set:
            print(f"overrides: {' '.join(args.set)}")
        print(format_report(results, total, checks, width=make_console().width))
        if unmeasured:
            print(f"not measured by these scenarios: {'; '.join(unmeasured)}")
        print()
        print("alerts by kind, per 100 node-days of fleet time:")
        print(format_census([(r.name, r.score.alerts) for r in results], total.alerts))
    return 0 if all(t.passed for t in checks) else 1
