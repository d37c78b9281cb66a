"""Digest of what the pipeline outputs on every scenario of an evaluation suite, to compare commits.

    PYTHONPATH=. .venv/bin/python scripts/eval_digest.py --suite quick [--out FILE]

For each scenario: the number of findings and recommendations and a SHA-256 of them (canonical
JSON, in output order), so two checkouts' digests are equal exactly when their outputs are
byte-identical. ``--out`` also writes every finding and recommendation as JSON lines, to see
where two commits differ (``diff`` the files). Run it from the checkout to measure (its own
``peerwatch`` package is imported).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.settings import Settings
from peerwatch.streams.tools.eval_suites import suite
from peerwatch.streams.tools.evaluation import scenario_pipeline


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="quick", choices=("quick", "full", "soak", "network"))
    p.add_argument("--only", default="", help="only scenarios whose name contains this")
    p.add_argument("--out", type=Path, help="write every output as JSON lines here")
    args = p.parse_args(argv)
    lines = args.out.open("w") if args.out else None
    try:
        for scenario in suite(args.suite):
            if args.only not in scenario.name:
                continue
            fleet = Fleet(parse_scenario(scenario.doc))
            digest = hashlib.sha256()
            counts: dict[str, int] = {}
            records = (r for batch in fleet.ticks() for r in batch)
            for out in scenario_pipeline(fleet, Settings()).run(records):
                text = json.dumps([out.kind, out.value], sort_keys=True)
                digest.update(text.encode() + b"\n")
                counts[out.kind] = counts.get(out.kind, 0) + 1
                if lines is not None:
                    lines.write(f"{scenario.name}\t{text}\n")
            shown = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
            print(f"{scenario.name}\t{shown}\t{digest.hexdigest()[:16]}", flush=True)
    finally:
        if lines is not None:
            lines.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
