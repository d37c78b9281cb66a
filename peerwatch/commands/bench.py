"""``peerwatch bench stream`` — measure the live stream processor against a plain consume +
decode floor on the same pre-produced records (definitions in ``peerwatch.streams.tools.bench``).

``peerwatch bench hooks`` — the Slurm prolog/epilog hooks' wall time against a budget, with a
PASS/FAIL verdict (definitions in ``peerwatch.streams.tools.bench_hooks``)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from peerwatch.commands import settings_of


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks against a real broker")
    what = p.add_subparsers(dest="bench", metavar="WHAT", required=True)
    s = what.add_parser("stream", help="the stream worker vs a consume+decode floor")
    s.add_argument("--nodes", type=int, default=256, help="nodes (default 256)")
    s.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    s.add_argument("--duration", type=float, default=300.0,
                   help="simulated seconds at 1 s sampling (default 300)")  # fmt: skip
    s.add_argument("--rss-nodes", type=int, default=12_500,
                   help="nodes of the RSS-at-scale run (default 12,500 = 100,000 GPUs; 0 skips)")  # fmt: skip
    s.add_argument("--rss-duration", type=float, default=10.0,
                   help="simulated seconds of the RSS run (default 10)")  # fmt: skip
    s.add_argument("--paced", type=float, default=120.0,
                   help="seconds published at one tick per second after the burst, for the "
                        "finding latency (default 120; 0 skips)")  # fmt: skip
    s.add_argument("--keep-topics", action="store_true",
                   help="keep the benchmark's topics (default: delete them at the end)")  # fmt: skip
    s.add_argument("--no-replay", action="store_true",
                   help="skip the replay of the same records from an archive")  # fmt: skip
    s.add_argument("--workdir", help="where worker logs and counters go (default: a temp dir)")
    s.add_argument("--json", action="store_true", help="print one JSON object instead")
    s.set_defaults(func=run)
    h = what.add_parser("hooks", help="the Slurm prolog/epilog hooks' wall time vs a budget")
    h.add_argument(
        "--runs", type=int, default=50, help="jobs, each a prolog and an epilog (default 50)"
    )
    h.add_argument("--budget-ms", type=float, default=None,
                   help="wall-time budget per hook run, judged on the p95 (default 400)")  # fmt: skip
    h.add_argument("--deliver-timeout-s", type=float, default=60.0,
                   help="how long the events may take to reach Kafka afterwards (default 60)")  # fmt: skip
    h.add_argument("--keep-topics", action="store_true",
                   help="keep the benchmark's topic (default: delete it at the end)")  # fmt: skip
    h.add_argument("--workdir", help="where the hooks' outbox goes (default: a temp dir)")
    h.add_argument("--json", action="store_true", help="print one JSON object instead")
    h.set_defaults(func=run_hooks)


def run(args: argparse.Namespace) -> int:
    from peerwatch.streams.tools.bench import format_table
    from peerwatch.streams.tools.bench_run import run_stream_bench

    settings = settings_of(args)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="peerwatch-bench-"))
    report = run_stream_bench(
        settings.kafka, args.nodes, args.gpus_per_node, args.duration, workdir,
        rss_nodes=args.rss_nodes, rss_duration_s=args.rss_duration, paced_s=args.paced,
        keep_topics=args.keep_topics, replay=not args.no_replay,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )  # fmt: skip
    print(json.dumps(report, sort_keys=True) if args.json else format_table(report))
    return 0 if all(v != "FAIL" for v in report["verdicts"].values()) else 1


def run_hooks(args: argparse.Namespace) -> int:
    from peerwatch.streams.tools.bench_hooks import DEFAULT_BUDGET_MS, format_hooks_table
    from peerwatch.streams.tools.bench_hooks_run import run_hooks_bench

    budget_ms = DEFAULT_BUDGET_MS if args.budget_ms is None else args.budget_ms
    if args.runs < 1 or budget_ms <= 0:
        print("bench hooks: --runs and --budget-ms must be positive", file=sys.stderr)
        return 2
    settings = settings_of(args)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="peerwatch-bench-hooks-"))
    report = run_hooks_bench(
        settings.kafka, args.runs, budget_ms, workdir,
        deliver_timeout_s=args.deliver_timeout_s, keep_topics=args.keep_topics,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )  # fmt: skip
    print(json.dumps(report, sort_keys=True) if args.json else format_hooks_table(report))
    return 0 if report["verdict"] == "PASS" else 1
