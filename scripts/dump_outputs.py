"""Dump every finding and recommendation (and a digest of every window) of the evaluation suites as JSON lines, one file per
scenario, so that a refactoring can be shown to change nothing (``diff -r before after``).

    .venv/bin/python scripts/dump_outputs.py --suite quick --out /tmp/outputs-before
    [--set stream.lateness_s=10 --set stream.job_grace_s=0 ...]  (settings, as peerwatch eval)
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.tools.eval_suites import suite
from peerwatch.streams.tools.evaluation import parse_overrides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--suite", default="quick")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--set", action="append", default=[], help="SECTION.NAME=VALUE, as eval's")
    args = ap.parse_args()
    settings = parse_overrides(args.set)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for scenario in suite(args.suite):
        if args.only not in scenario.name:
            continue
        fleet = Fleet(parse_scenario(scenario.doc))
        records = (r for batch in fleet.ticks() for r in batch)
        windows = hashlib.sha256()
        n_windows = 0
        with (out / f"{scenario.name}.jsonl").open("w") as fh:
            for o in Pipeline(settings).run(records):
                line = json.dumps([o.kind, o.key, o.stream_ms, o.value], sort_keys=True)
                if o.kind in (FINDING, RECOMMENDATION):
                    fh.write(line + "\n")
                else:  # windows (and anything else): one digest, the files stay small
                    windows.update(line.encode())
                    n_windows += 1
            fh.write(json.dumps(["other-outputs", n_windows, windows.hexdigest()]) + "\n")
        print(scenario.name, flush=True)


if __name__ == "__main__":
    main()
