"""CPU cost of the agent's NIC read per tick: sysfs reads of every chosen port, the record built
and Avro-encoded, as ``peerwatch agent`` does it each tick.

PYTHONPATH=. python3 scripts/bench_nic_sysfs.py [--root tests/data/sysfs/hgx] [--ticks 2000]

Prints CPU µs per tick and per port (this thread's CPU time, ``time.thread_time``), median over
``--ticks`` ticks after a warm-up. On a recorded tree the reads hit the page cache, as real sysfs
attributes do; a real HCA's counter file also costs the driver a MAD query (not measured here).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from peerwatch.producers.nic.ports import discover_ports
from peerwatch.producers.nic.sampler import NicSampler
from peerwatch.producers.nic.sysfs import Reader, SysfsTree
from peerwatch.schemas.codec import AvroCodec


class _Clock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("tests/data/sysfs/hgx"))
    parser.add_argument("--ticks", type=int, default=2000)
    args = parser.parse_args()
    reader = Reader(SysfsTree(args.root))
    ports = discover_ports(reader)
    sampler = NicSampler(reader, ports, node="bench", interval_ms=1000, clock=_Clock(),
                         agent_run_id="bench")  # fmt: skip
    encode = AvroCodec("NodeNicSample").encode
    for seq in range(50):
        encode(sampler.sample(seq))
    read_us: list[float] = []
    total_us: list[float] = []
    for seq in range(args.ticks):
        c0 = time.thread_time()
        record = sampler.sample(seq)
        c1 = time.thread_time()
        encode(record)
        c2 = time.thread_time()
        read_us.append((c1 - c0) * 1e6)
        total_us.append((c2 - c0) * 1e6)
    n = max(1, len(ports))
    values = sum(len(p["counters"]) + len(p["hw_counters"]) + 5 for p in record["ports"])
    print(json.dumps({
        "root": str(args.root), "ports": len(ports), "values_per_tick": values,
        "ticks": args.ticks,
        "read_us_per_tick_median": round(statistics.median(read_us), 1),
        "total_us_per_tick_median": round(statistics.median(total_us), 1),
        "total_us_per_port_median": round(statistics.median(total_us) / n, 1),
        "total_us_per_tick_p99": round(sorted(total_us)[int(0.99 * len(total_us))], 1),
        "read_errors": reader.stats.total,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
