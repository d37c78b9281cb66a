"""``peerwatch eval --suite quick|full|soak [--json] [--set detector.NAME=VALUE ...]``.

Runs the labelled simulated scenarios through the offline pipeline with the settings tree
(``--config``, ``PEERWATCH_*``: the settings a live worker would run with) and ``--set``
overrides, and checks the targets; exit status 1 when a target fails. ``soak`` (hours of a
healthy fleet with every confounder) checks what it costs on-call instead: no drain, and GPU-
blaming alerts per 100 node-days (see :mod:`peerwatch.streams.tools.soak`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from peerwatch.commands import settings_of
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
    p.add_argument("--suite", choices=["quick", "full", "soak"], default="quick")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="TABLE.NAME=VALUE",
        help="override a setting of the detector, policy or stream table, e.g. "
        "detector.mad_floor_clk_rel=0.009 (repeatable)",
    )
    p.add_argument("--only", help="run only scenarios whose name contains this text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = parse_overrides(args.set, settings_of(args))
    soaking = args.suite == "soak"
    chosen = soak_suite() if soaking else suite(args.suite)
    scenarios = [s for s in chosen if not args.only or args.only in s.name]
    results, total, checks = evaluate(scenarios, settings)
    if soaking:  # no fault to recall: what counts is what on-call receives
        checks = soak_targets(total.alerts)
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
        }
        json.dump(doc, sys.stdout, indent=2, default=str)
        print()
    else:
        if args.set:
            print(f"overrides: {' '.join(args.set)}")
        print(format_report(results, total, checks))
        print()
        print("alerts by kind, per 100 node-days of fleet time:")
        print(format_census([(r.name, r.score.alerts) for r in results], total.alerts))
    return 0 if all(t.passed for t in checks) else 1
