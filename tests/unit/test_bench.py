"""The pure part of ``peerwatch bench stream``: /proc parsing, rates, verdicts, the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerwatch.streams.tools.bench import (
    FloorResult,
    floor_summary,
    format_table,
    latency_summary,
    parse_stat_cpu_s,
    parse_status_kib,
    percentile,
    verdicts,
    worker_metrics,
)

# A real-shaped /proc/<pid>/stat line whose command name holds spaces and parentheses.
STAT = (
    "4242 (python (faust) w) S 1 4242 4242 0 -1 4194560 52311 0 0 0 "
    "1234 567 0 0 20 0 9 0 123456 987654321 30000 18446744073709551615"
)
STATUS = "Name:\tpython\nVmPeak:\t  900000 kB\nVmHWM:\t  524288 kB\nVmRSS:\t  400000 kB\n"


def test_stat_cpu_counts_fields_after_the_command_name() -> None:
    assert parse_stat_cpu_s(STAT, 100) == pytest.approx(18.01)


def test_stat_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_stat_cpu_s("no command name here", 100)
    with pytest.raises(ValueError):
        parse_stat_cpu_s("1 (x) S 1 2", 100)


def test_status_fields_in_bytes() -> None:
    assert parse_status_kib(STATUS) == 512 << 20
    assert parse_status_kib(STATUS, "VmRSS") == 400000 * 1024
    with pytest.raises(ValueError):
        parse_status_kib(STATUS, "VmSwap")


def test_percentile_nearest_rank() -> None:
    assert percentile([], 0.5) is None
    assert percentile([5.0, 1.0, 3.0], 0.5) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 100.0], 0.95) == 100.0


def counters() -> dict[str, Any]:
    # [start wall, end wall, start cpu, end cpu, node records, GPU readings]
    return {
        "batch_log": [
            [90.0, 91.0, 1.0, 1.5, 10, 80],  # before the timed input: excluded
            [100.0, 101.0, 2.0, 2.8, 1000, 8000],
            [101.0, 102.0, 2.8, 3.6, 1000, 8000],
        ],
        "findings": 2,
        "finding_latency_ms": [400.0, 2500.0],
    }


def test_worker_metrics_over_the_timed_batches() -> None:
    m = worker_metrics(counters(), since_wall_s=100.0)
    assert m["node_records"] == 2000 and m["gpu_samples"] == 16000
    assert m["wall_s"] == pytest.approx(2.0)
    assert m["gpu_samples_per_s"] == pytest.approx(8000.0)
    assert m["cpu_s_per_1000_gpu_samples"] == pytest.approx(1.6 / 16)
    assert m["finding_latency_ms"]["max"] == 2500.0
    assert worker_metrics(counters())["node_records"] == 2010


def report(
    gps: float, ratio: float, rss: int | None, gpus: int, lat_ms: float, replay_x: float = 12.0
) -> dict[str, Any]:
    worker = {
        "gpu_samples_per_s": gps, "node_records_per_s": gps / 8, "node_records": 100,
        "cpu_s_per_1000_gpu_samples": 0.02,
        "finding_latency_ms": {"count": 1, "p50": lat_ms, "p95": lat_ms, "max": lat_ms},
    }  # fmt: skip
    out = {
        "nodes": 8, "gpus_per_node": 8, "duration_s": 60.0, "worker": worker,
        "worker_peak_rss_bytes": 100 << 20, "processor_over_floor": ratio,
        "floor": {"gpu_samples_per_s": gps / ratio, "cpu_s_per_1000_gpu_samples": 0.01},
        "rss_at_scale": {"gpus_tracked": gpus, "peak_rss_bytes": rss} if rss else None,
        "replay": {"node_records": 1000, "node_records_per_s": gps / 8 * replay_x,
                   "path": "native", "over_worker": replay_x},
    }  # fmt: skip
    out["verdicts"] = verdicts(out)
    return out


def test_verdicts_against_the_issue_targets() -> None:
    good = report(60_000.0, 2.1, 700 << 20, 100_000, 900.0)["verdicts"]
    assert set(good.values()) == {"PASS"}
    bad = report(30_000.0, 1.9, 1100 << 20, 100_000, 2500.0, replay_x=3.0)["verdicts"]
    assert set(bad.values()) == {"FAIL"}
    # a replay under 10x a much faster worker passes at the last session's replay rate
    fast = report(1_200_000.0, 2.5, 700 << 20, 100_000, 900.0, replay_x=0.94)
    assert fast["replay"]["node_records_per_s"] >= 140_244
    assert fast["verdicts"]["replay_over_worker"] == "PASS"
    assert (
        report(1_000_000.0, 2.5, None, 0, 900, replay_x=1.0)["verdicts"]["replay_over_worker"]
        == "FAIL"
    )
    # An RSS measured with fewer GPUs than the target's proves nothing either way.
    assert report(60_000.0, 0.5, 200 << 20, 50_000, 900.0)["verdicts"]["rss_100k_gpus"] == "N/A"


def test_table_names_every_target_and_verdict() -> None:
    table = format_table(report(30_000.0, 2.6, 700 << 20, 100_000, 900.0))
    assert "30,000.0" in table and "2.600" in table
    lines = {line.split("  ")[0]: line for line in table.splitlines()}
    assert lines["worker GPU samples/s"].endswith("FAIL")
    assert lines["processor / floor"].endswith("PASS")
    assert "100,000 GPUs tracked" in table
    assert lines["replay / worker (node records/s)"].endswith("PASS")
    assert "12.00" in lines["replay / worker (node records/s)"]


def test_a_ratio_just_under_its_target_never_prints_as_the_target() -> None:
    rep = report(60_000.0, 1.9999, 700 << 20, 100_000, 900.0, replay_x=9.997)
    lines = {line.split("  ")[0]: line for line in format_table(rep).splitlines()}
    assert "9.99" in lines["replay / worker (node records/s)"]
    assert "10.00" not in lines["replay / worker (node records/s)"]
    assert lines["replay / worker (node records/s)"].endswith("FAIL")
    assert "1.999 " in lines["processor / floor"] and lines["processor / floor"].endswith("FAIL")


def test_the_replay_figure_is_the_median_run_and_the_table_lists_every_run() -> None:
    from peerwatch.streams.tools.bench_run import median_run

    runs = [{"node_records_per_s": r, "wall_s": w} for r, w in ((90.0, 1), (40.0, 2), (70.0, 3))]
    assert median_run(runs) == {"node_records_per_s": 70.0, "wall_s": 3}
    assert median_run(runs[:2])["node_records_per_s"] == 40.0  # even: the lower middle
    assert (
        median_run([{"node_records_per_s": None}, runs[0], runs[1]])["node_records_per_s"] == 40.0
    )
    with pytest.raises(ValueError):
        median_run([])
    rep = report(30_000.0, 2.6, 700 << 20, 100_000, 900.0)
    rep["replay"]["runs_node_records_per_s"] = [41_000.0, 45_000.0, 52_500.0]
    assert "median of 41,000, 45,000, 52,500" in format_table(rep)


def test_worker_metrics_stop_at_the_burst() -> None:
    # The first two batches make 2010 records; the third (paced input) is left out.
    c = counters()
    c["batch_log"] = [*c["batch_log"], [500.0, 500.1, 9.0, 9.1, 8, 64]]
    m = worker_metrics(c, until_records=2010)
    assert m["node_records"] == 2010
    assert worker_metrics(c)["node_records"] == 2018


def test_latency_is_judged_on_the_paced_phase_when_it_has_findings() -> None:
    burst_slow = report(60_000.0, 0.5, 700 << 20, 100_000, 9_000.0)
    burst_slow["paced"] = {"seconds": 120.0, "node_records": 100,
                           "finding_latency_ms": latency_summary([300.0, 900.0])}  # fmt: skip
    assert verdicts(burst_slow)["finding_latency"] == "PASS"
    burst_slow["verdicts"] = verdicts(burst_slow)
    table = format_table(burst_slow)
    assert "finding latency, paced p50/p95/max (ms, n=2)" in table
    paced_line = next(line for line in table.splitlines() if "paced" in line)
    assert paced_line.endswith("PASS") and "900" in paced_line
    # no finding in the paced phase: the burst figure is judged
    burst_slow["paced"]["finding_latency_ms"] = latency_summary([])
    assert verdicts(burst_slow)["finding_latency"] == "FAIL"
    assert latency_summary([]) == {"count": 0, "p50": None, "p95": None, "p99": None, "max": None}


def test_the_replay_phase_archive_holds_what_the_simulator_archives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    from peerwatch.io.archive.reader import read_archive
    from peerwatch.producers.sim.publish import write_archive
    from peerwatch.streams.tools.bench_run import archive_raw, bench_fleet, encode_fleet
    from peerwatch.topics import SAMPLES

    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)  # both fleets start alike
    fleet = bench_fleet(4, 8, 40.0)
    first, rest, total = encode_fleet(fleet, "pfx.")
    assert archive_raw([*first, *rest], tmp_path / "raw", "pfx.") == len(first) + len(rest)
    write_archive(bench_fleet(4, 8, 40.0), tmp_path / "sim")
    got = list(read_archive(tmp_path / "raw", SAMPLES.name, "NodeGpuSample"))
    want = list(read_archive(tmp_path / "sim", SAMPLES.name, "NodeGpuSample"))
    assert len(got) == total == len(want) and got == want


def test_hard_fault_latency_is_publish_to_the_first_hard_drain_and_judged_on_p99() -> None:
    from peerwatch.streams.tools.bench_run import hard_latencies

    faults = [("n1", 1_000), ("n2", 2_000), ("n3", 3_000), ("n4", 9_000)]
    sent = {1_000: 50_000.0, 2_000: 51_000.0, 3_000: 52_000.0}  # n4's tick: not paced
    recs = [
        ({"node": "n1", "action": "DRAIN", "hard": True}, 50_400),
        ({"node": "n1", "action": "DRAIN", "hard": True}, 59_000),  # a later one: not counted
        ({"node": "n2", "action": "ALERT", "hard": False}, 51_100),  # not a hard drain
        ({"node": "n2", "action": "DRAIN", "hard": True}, 51_900),
    ]
    assert hard_latencies(faults, sent, recs) == ([400.0, 900.0], 1)  # n3 got none
    rep = report(60_000.0, 2.1, 700 << 20, 100_000, 900.0)
    rep["paced"] = {"seconds": 120.0, "node_records": 100,
                       "finding_latency_ms": latency_summary([300.0]),
                       "hard_to_recommendation_ms": latency_summary([400.0, 900.0]),
                       "hard_faults_without_recommendation": 0}  # fmt: skip
    assert verdicts(rep)["hard_latency"] == "PASS"
    line = next(x for x in format_table({**rep, "verdicts": verdicts(rep)}).splitlines()
                if x.startswith("hard fault"))  # fmt: skip
    assert "400/900" in line and line.endswith("PASS")
    rep["paced"]["hard_faults_without_recommendation"] = 1
    assert verdicts(rep)["hard_latency"] == "FAIL"
    rep["paced"]["hard_faults_without_recommendation"] = 0
    rep["paced"]["hard_to_recommendation_ms"] = latency_summary([400.0] * 98 + [6000.0] * 2)
    assert verdicts(rep)["hard_latency"] == "FAIL"


def test_the_floor_is_the_mean_rate_of_the_runs_before_and_after_the_worker() -> None:
    before = FloorResult(node_records=1000, gpu_samples=8000, wall_s=0.2, cpu_s=0.3)
    after = FloorResult(node_records=1000, gpu_samples=8000, wall_s=0.4, cpu_s=0.5)
    f = floor_summary(before, after)
    assert f["runs"] == 2
    assert (f["before_gpu_samples_per_s"], f["after_gpu_samples_per_s"]) == (40_000, 20_000)
    assert f["gpu_samples_per_s"] == 30_000  # the mean of the rates, not of the times
    assert f["node_records_per_s"] == 3_750
    assert f["cpu_s_per_1000_gpu_samples"] == pytest.approx(0.05)
    alone = floor_summary(None, after)
    assert alone["runs"] == 1 and alone["gpu_samples_per_s"] == 20_000
    assert alone["before_gpu_samples_per_s"] is None
    # a run that took no time gives no rate (and no ratio), never a division by zero
    assert floor_summary(FloorResult(0, 0, 0.0, 0.0), after)["gpu_samples_per_s"] is None


def test_the_table_shows_both_floors() -> None:
    r = report(30_000.0, 2.6, 700 << 20, 100_000, 900.0)
    r["floor"].update(before_gpu_samples_per_s=12_000.0, after_gpu_samples_per_s=11_000.0)
    line = next(x for x in format_table(r).splitlines() if x.startswith("floor GPU samples/s"))
    assert "11,538.5 (12,000 / 11,000)" in line
