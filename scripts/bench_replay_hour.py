"""How long one hour of a 100,000-GPU cluster (12,500 nodes x 8 GPUs at 1 Hz: 45,000,000 node
records) takes to replay on this machine, measured on a scaled run and scaled linearly.

It simulates the benchmark's busy fleet (``streams/tools/bench_run.bench_fleet``: jobs of 512
GPUs side by side, an SM-clock drop in each) for ``--nodes`` x ``--seconds`` into an archive,
replays it with ``peerwatch replay --archive`` (a subprocess, as an operator runs it), and
reports the replay's own rate (node records/s, start-up excluded), its peak RSS, and the hour
at that rate. The scaling is linear because every cost of a replay is per record (decoding,
aggregation) or per GPU window (detection), and both grow with the records; memory does not
grow with the hour (archives are read as a stream, ``--reorder-s`` of samples held), but does
with the nodes: the RSS line is measured at ``--nodes``.

    .venv/bin/python scripts/bench_replay_hour.py [--nodes 2500] [--seconds 120]
        [--archive DIR]  (keep the archive in DIR; a later run replays the one there)
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peerwatch.producers.sim.publish import write_archive
from peerwatch.streams.tools.bench_run import bench_fleet

HOUR_NODE_RECORDS = 12_500 * 3_600
TARGET_S = 600.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2_500)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--archive", type=Path, default=None,
                    help="keep the simulated archive in this folder, and replay the one there "
                         "if it was written before (its fleet, not --nodes/--seconds)")  # fmt: skip
    args = ap.parse_args()
    root = args.archive or Path(tempfile.mkdtemp(prefix="pw-hour-"))
    about = root / "bench-fleet.json"
    try:
        if about.exists():
            fleet_doc = json.loads(about.read_text())
            print(f"archive: {root} as written before ({fleet_doc})", file=sys.stderr)
        else:
            fleet = bench_fleet(args.nodes, 8, args.seconds)
            t0 = time.perf_counter()
            stats = write_archive(fleet, root)
            print(f"archive: {stats.node_records:,} node records in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)  # fmt: skip
            fleet_doc = {"nodes": args.nodes, "seconds": args.seconds,
                         "start_ms": fleet.spec.start_ms, "duration_ms": fleet.spec.duration_ms}  # fmt: skip
            about.write_text(json.dumps(fleet_doc))
        args.nodes, args.seconds = fleet_doc["nodes"], fleet_doc["seconds"]
        start = fleet_doc["start_ms"]
        cmd = [
            sys.executable,
            "-m",
            "peerwatch.cli",
            "replay",
            "--archive",
            str(root),
            "--from",
            str(start),
            "--to",
            str(start + fleet_doc["duration_ms"] + 60_000),
            "--no-progress",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    finally:
        if args.archive is None:
            shutil.rmtree(root, ignore_errors=True)
    rate = summary["node_records_per_s"]
    hour_s = HOUR_NODE_RECORDS / rate
    report = {
        "nodes": args.nodes, "gpus": args.nodes * 8, "seconds": args.seconds,
        "node_records": summary["node_records"], "replay_wall_s": summary["wall_s"],
        "node_records_per_s": rate, "path": summary.get("path"),
        "findings": summary["findings"], "recommendations": summary["recommendations"],
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "hour_of_100k_gpus_s": round(hour_s, 1), "target_s": TARGET_S,
        "verdict": "PASS" if hour_s <= TARGET_S else "FAIL",
    }  # fmt: skip
    print(json.dumps(report))
    print(f"one hour of 12,500 nodes x 8 GPUs = {HOUR_NODE_RECORDS:,} node records at "
          f"{rate:,.0f}/s: {hour_s / 60:.1f} min (target <= {TARGET_S / 60:.0f} min): "
          f"{report['verdict']}", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
