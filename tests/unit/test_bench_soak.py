"""``peerwatch bench soak``'s verdict: the RSS slope (least squares, second half), the lag bound
and the pace, on made-up samples (pure; the run itself needs a broker and 30 minutes)."""

from __future__ import annotations

import json

import pytest

from peerwatch.streams.tools.bench_soak import (
    MIB,
    SoakSample,
    format_soak_table,
    second_half,
    slope_per_min,
    soak_report,
    soak_verdicts,
)


def run(rss_mib: list[float], lags: list[int | None], every_s: float = 30.0) -> list[SoakSample]:
    return [
        SoakSample(i * every_s, int(r * MIB), lag, lag, 1000 * i, 30 * i, 0.1)
        for i, (r, lag) in enumerate(zip(rss_mib, lags, strict=True))
    ]


def test_slope_is_least_squares_per_minute() -> None:
    assert slope_per_min([(0, 10.0), (60, 12.0), (120, 14.0)]) == pytest.approx(2.0)
    # Noise around a line: the fit, not the end points.
    assert slope_per_min([(0, 0.0), (30, 3.0), (60, 0.0), (90, 3.0)]) == pytest.approx(1.2)
    assert slope_per_min([(0, 5.0)]) is None
    assert slope_per_min([(30, 5.0), (30, 7.0)]) is None


def test_second_half_is_by_time() -> None:
    samples = run([100.0] * 7, [0] * 7)  # t = 0 .. 180 s
    assert [s.t_s for s in second_half(samples, 180.0)] == [90.0, 120.0, 150.0, 180.0]


def test_warm_up_growth_then_flat_passes() -> None:
    # 60 samples over 30 minutes: +100 MiB in the first half, then +-2 MiB of noise.
    rss = [100 + 100 * min(i, 30) / 30 + (2 if i % 2 else -2) for i in range(61)]
    v = soak_verdicts(run(rss, [5_000] * 61), nodes=1024, duration_s=1800.0)
    assert abs(v["rss_slope_mib_per_min"]) < 0.2
    assert v["checks"] == {"rss_flat": "PASS", "lag_bounded": "PASS", "sustained": "PASS"}
    assert v["verdict"] == "PASS" and v["second_half_samples"] == 31


def test_a_leak_of_two_mib_a_minute_fails() -> None:
    rss = [200 + 1.0 * i for i in range(61)]  # 1 MiB per 30 s sample
    v = soak_verdicts(run(rss, [0] * 61), nodes=64, duration_s=1800.0)
    assert v["rss_slope_mib_per_min"] == pytest.approx(2.0)
    assert v["checks"]["rss_flat"] == "FAIL" and v["verdict"] == "FAIL"


def test_lag_beyond_the_bound_fails_and_unreadable_lag_is_left_out() -> None:
    lags: list[int | None] = [0] * 5 + [None, 64 * 21]  # 21 ticks of 64 nodes
    v = soak_verdicts(run([100.0] * 7, lags), nodes=64, duration_s=180.0)
    assert (v["max_lag_records"], v["lag_bound_records"]) == (64 * 21, 64 * 20)
    assert v["checks"]["lag_bounded"] == "FAIL"
    v = soak_verdicts(run([100.0] * 7, [None] * 7), nodes=64, duration_s=180.0)
    assert v["checks"]["lag_bounded"] == "INCONCLUSIVE" and v["verdict"] == "INCONCLUSIVE"


def test_too_few_samples_is_inconclusive_not_flat() -> None:
    v = soak_verdicts(run([100.0, 500.0, 900.0], [0, 0, 0], every_s=60), 64, 120.0)
    assert v["second_half_samples"] == 2 and v["rss_slope_mib_per_min"] is None
    assert v["checks"]["rss_flat"] == "INCONCLUSIVE"


def test_a_late_publisher_or_a_dead_worker_did_not_sustain_the_pace() -> None:
    samples = run([100.0] * 7, [0] * 7)
    assert soak_verdicts(samples, 64, 180.0, max_late_s=6.0)["checks"]["sustained"] == "FAIL"
    assert soak_verdicts(samples, 64, 180.0, worker_alive=False)["verdict"] == "FAIL"


def test_report_is_json_and_the_table_says_each_verdict() -> None:
    report = soak_report(run([100.0] * 7, [640] * 7), nodes=64, gpus_per_node=8,
                         duration_s=180.0, worker_alive=True, max_late_s=0.4)  # fmt: skip
    again = json.loads(json.dumps(report))
    assert again["samples"][3]["lag_records"] == 640 and again["verdict"] == "PASS"
    table = format_soak_table(report)
    assert "64 nodes x 8 GPUs at 1 tick/s for 3 min" in table
    assert "max consumer lag in the second half: 640" in table and "verdict: PASS" in table
