"""The arithmetic of ``peerwatch bench soak``: is a stream worker fed a fleet at one tick per
second for a long time flat? Pure; the run is in :mod:`peerwatch.streams.tools.bench_soak_run`.

Definitions (also printed with the report):

- *sample*: every ``--sample-s`` (30 s) of the run: the worker's resident set (``VmRSS`` of
  ``/proc/<pid>/status``) and the consumer lag of its hot stage;
- *consumer lag*: over the samples topic's partitions, high watermark minus the hot stage
  group's committed offset (the whole partition when nothing is committed yet), in node records:
  what an operator's lag monitor sees. The hot stage commits at its oldest open window, so in a
  steady state it trails by about ``window_s + lateness_s`` ticks (10 with the defaults);
- *RSS flat*: the least-squares slope of RSS over time in the second half of the run (the first
  half is warm-up: allocation tables, detector baselines, interpreter caches) is below
  ``rss_slope_max_mib_per_min`` (1 MiB/min: 15 MiB over the second half of a 30-minute soak);
- *lag bounded*: the largest lag in the second half is at most ``lag_max_ticks`` ticks of
  records (``lag_max_ticks * nodes``; 20 ticks = twice the commit point's steady trail);
- *sustained*: the publisher kept one tick per second: no tick handed to the producer more than
  ``late_max_s`` (5 s) after its slot, and the worker alive to the end. A fleet this machine
  cannot generate, publish and process at that pace fails here, not on the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

MIB = 1 << 20
RSS_SLOPE_MAX_MIB_PER_MIN = 1.0
LAG_MAX_TICKS = 20.0
LATE_MAX_S = 5.0
#: Fewest second-half samples a slope is judged on.
MIN_SLOPE_SAMPLES = 3


@dataclass(frozen=True)
class SoakSample:
    """One look at the run, ``t_s`` seconds after the paced input began."""

    t_s: float
    rss_bytes: int
    #: Committed-offset lag of the hot stage's group (node records); None if unreadable.
    lag_records: int | None
    #: The worker's own lag (its position against the cached high watermarks), if reported.
    worker_lag_records: int | None
    #: Node records the worker's hot stage has processed so far.
    processed: int
    #: Ticks published so far, and the latest tick's delay past its slot (s).
    ticks: int
    late_s: float


def slope_per_min(points: Sequence[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(t_s, y)`` points, in y per minute; None for fewer than two
    points or no spread in time."""
    n = len(points)
    if n < 2:
        return None
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (y - mean_y) for t, y in points)
    return cov / var * 60.0


def second_half(samples: Sequence[SoakSample], duration_s: float) -> list[SoakSample]:
    """The samples taken in the second half of a ``duration_s`` run."""
    return [s for s in samples if s.t_s >= duration_s / 2]


def soak_verdicts(
    samples: Sequence[SoakSample],
    nodes: int,
    duration_s: float,
    *,
    worker_alive: bool = True,
    max_late_s: float = 0.0,
    rss_slope_max_mib_per_min: float = RSS_SLOPE_MAX_MIB_PER_MIN,
    lag_max_ticks: float = LAG_MAX_TICKS,
    late_max_s: float = LATE_MAX_S,
) -> dict[str, Any]:
    """The figures and PASS/FAIL of each criterion (module docstring), and ``verdict``: PASS
    when all pass, FAIL when one fails, INCONCLUSIVE when the second half has fewer than
    :data:`MIN_SLOPE_SAMPLES` samples (or no lag could be read) and nothing failed."""
    late = second_half(samples, duration_s)
    slope_b = slope_per_min([(s.t_s, float(s.rss_bytes)) for s in late])
    slope_mib = None if slope_b is None or len(late) < MIN_SLOPE_SAMPLES else slope_b / MIB
    lags = [s.lag_records for s in late if s.lag_records is not None]
    lag_bound = lag_max_ticks * nodes
    max_lag = max(lags) if lags else None
    lag_slope = slope_per_min([(s.t_s, float(s.lag_records)) for s in late
                               if s.lag_records is not None])  # fmt: skip

    def judge(ok: bool | None) -> str:
        return "INCONCLUSIVE" if ok is None else "PASS" if ok else "FAIL"

    checks = {
        "rss_flat": judge(None if slope_mib is None else slope_mib < rss_slope_max_mib_per_min),
        "lag_bounded": judge(None if max_lag is None else max_lag <= lag_bound),
        "sustained": judge(worker_alive and max_late_s <= late_max_s),
    }
    values = set(checks.values())
    verdict = "FAIL" if "FAIL" in values else "INCONCLUSIVE" if "INCONCLUSIVE" in values else "PASS"
    return {
        "rss_slope_mib_per_min": slope_mib,
        "rss_slope_max_mib_per_min": rss_slope_max_mib_per_min,
        "rss_second_half_mib": [s.rss_bytes / MIB for s in late],
        "max_lag_records": max_lag,
        "lag_bound_records": lag_bound,
        "lag_max_ticks": lag_max_ticks,
        "lag_slope_records_per_min": lag_slope,
        "max_late_s": max_late_s,
        "late_max_s": late_max_s,
        "worker_alive": worker_alive,
        "second_half_samples": len(late),
        "checks": checks,
        "verdict": verdict,
    }


def soak_report(
    samples: Sequence[SoakSample],
    *,
    nodes: int,
    gpus_per_node: int,
    duration_s: float,
    worker_alive: bool,
    max_late_s: float,
    **limits: Any,
) -> dict[str, Any]:
    """The report: the run, every sample, and :func:`soak_verdicts`. ``max_late_s``: the
    largest delay of any tick past its slot."""
    return {
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "duration_s": duration_s,
        "samples": [asdict(s) for s in samples],
        **soak_verdicts(
            samples, nodes, duration_s, worker_alive=worker_alive, max_late_s=max_late_s, **limits
        ),
    }


def _num(value: Any, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def format_soak_table(report: Mapping[str, Any]) -> str:
    """The samples as a table, the criteria and the verdict."""
    lines = [
        f"soak: {report['nodes']} nodes x {report['gpus_per_node']} GPUs at 1 tick/s for "
        f"{report['duration_s'] / 60:g} min",
        "",
        f"{'t (s)':>7} {'RSS (MiB)':>10} {'lag':>9} {'worker lag':>11} {'processed':>11} "
        f"{'ticks':>6} {'late (s)':>9}",
    ]
    for s in report["samples"]:
        lines.append(
            f"{s['t_s']:>7.0f} {s['rss_bytes'] / MIB:>10.1f} {_num(s['lag_records']):>9} "
            f"{_num(s['worker_lag_records']):>11} {s['processed']:>11,} {s['ticks']:>6} "
            f"{s['late_s']:>9.2f}"
        )
    checks = report["checks"]
    lines += [
        "",
        f"RSS slope over the second half: {_num(report['rss_slope_mib_per_min'], '.3f')} MiB/min "
        f"(flat below {report['rss_slope_max_mib_per_min']:g}; "
        f"{report['second_half_samples']} samples): {checks['rss_flat']}",
        f"max consumer lag in the second half: {_num(report['max_lag_records'])} node records "
        f"(bound {report['lag_max_ticks']:g} ticks = {report['lag_bound_records']:,.0f}): "
        f"{checks['lag_bounded']}",
        f"one tick per second kept: latest tick {report['max_late_s']:.2f} s past its slot "
        f"(at most {report['late_max_s']:g}), worker "
        f"{'alive' if report['worker_alive'] else 'DIED'}: {checks['sustained']}",
        f"verdict: {report['verdict']}",
        "",
        "lag: high watermark - the hot stage group's committed offset, summed over the samples "
        "partitions (it commits at its oldest open window: ~window_s + lateness_s ticks behind); "
        "worker lag: the hot stage's own position lag.",
    ]
    return "\n".join(lines)
