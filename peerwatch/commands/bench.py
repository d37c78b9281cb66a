"""``peerwatch bench stream`` — measure the live stream processor against a plain consume +
decode floor on the same pre-produced records (definitions in ``peerwatch.streams.tools.bench``).

``peerwatch bench soak`` — a stream worker fed a fleet at one tick per second for ``--minutes``
(30): its RSS and its consumer lag sampled, flat or not (definitions in
``peerwatch.streams.tools.bench_soak``).

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

#: ``bench soak``'s default fleet: an estimate of the largest this shared 2-core machine keeps
#: at one tick per second (docs/performance.md says how it was chosen).
SOAK_NODES = 1024


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
    k = what.add_parser("soak", help="a stream worker fed one tick per second for minutes: "
                                     "RSS and consumer lag flat?")  # fmt: skip
    k.add_argument("--nodes", type=int, default=SOAK_NODES,
                   help=f"nodes (default {SOAK_NODES:,}: see docs/performance.md)")  # fmt: skip
    k.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    k.add_argument("--minutes", type=float, default=30.0, help="length of the run (default 30)")
    k.add_argument("--sample-s", type=float, default=30.0,
                   help="seconds between samples of RSS and lag (default 30)")  # fmt: skip
    k.add_argument("--rss-slope-max", type=float, default=1.0,
                   help="RSS flat below this slope over the second half, MiB/min (default 1)")  # fmt: skip
    k.add_argument("--lag-max-ticks", type=float, default=20.0,
                   help="lag bound in ticks of records (x nodes) (default 20)")  # fmt: skip
    k.add_argument("--keep-topics", action="store_true",
                   help="keep the soak's topics (default: delete them at the end)")  # fmt: skip
    k.add_argument("--workdir", help="where the worker's log and counters go (default: a temp dir)")
    k.add_argument("--json", metavar="FILE", help="also write the report and samples there")
    k.set_defaults(func=run_soak)
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


def run_soak(args: argparse.Namespace) -> int:
    from peerwatch.streams.tools.bench_soak import format_soak_table
    from peerwatch.streams.tools.bench_soak_run import run_soak as soak

    if args.nodes < 1 or args.minutes <= 0 or args.sample_s <= 0:
        print("bench soak: --nodes, --minutes and --sample-s must be positive", file=sys.stderr)
        return 2
    settings = settings_of(args)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="peerwatch-soak-"))
    report = soak(
        settings.kafka, args.nodes, args.gpus_per_node, args.minutes, workdir,
        sample_s=args.sample_s, keep_topics=args.keep_topics,
        rss_slope_max_mib_per_min=args.rss_slope_max, lag_max_ticks=args.lag_max_ticks,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(report, sort_keys=True, indent=1) + "\n")
    print(format_soak_table(report))
    return 0 if report["verdict"] == "PASS" else 1


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
