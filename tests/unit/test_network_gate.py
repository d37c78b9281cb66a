"""The network comparison's gate (network_gate): a job slowed against its own recent past, or the
GPU detector's job-wide verdict, opens it; JobNetwork (stage 3) names a slow link only then."""

from __future__ import annotations

import json
from typing import Any

import pytest

from peerwatch.streams.core.network_gate import MIN_REFERENCE_WINDOWS, JobPace
from peerwatch.streams.core.network_jobs import JobNetwork, JobPorts
from peerwatch.streams.core.settings import NetworkSettings
from tests.unit.test_network_peers import WAITING, W, job, named

S = NetworkSettings()


def paced(pace: JobPace, sms: list[float | None], first: int = 0,
          steps: list[float | None] | None = None) -> list[bool]:  # fmt: skip
    steps = steps or [None] * len(sms)
    return [
        pace.slowed((first + k) * W, sm, step, S)
        for k, (sm, step) in enumerate(zip(sms, steps, strict=True))
    ]


def test_a_job_whose_sm_activity_drops_against_its_own_past_is_slowed() -> None:
    pace = JobPace()
    # every rank waits on one link: the whole job's SM activity falls by 30 % at once
    assert paced(pace, [0.80, 0.81, 0.79, 0.80, 0.56, 0.55, 0.57]) == [False] * 4 + [True] * 3


def test_noise_and_a_small_dip_do_not_open_the_gate() -> None:
    pace = JobPace()
    assert not any(paced(pace, [0.80, 0.78, 0.82, 0.79, 0.81, 0.76, 0.80, 0.74]))


def test_no_reference_before_enough_normal_windows() -> None:
    pace = JobPace()
    sms: list[float | None] = [0.8] * (MIN_REFERENCE_WINDOWS - 1) + [0.3]
    assert not any(paced(pace, sms))


def test_step_time_rising_against_the_job_s_own_past_opens_the_gate() -> None:
    pace = JobPace()
    got = paced(pace, [None] * 5, steps=[1000.0, 1010.0, 990.0, 1000.0, 1300.0])
    assert got == [False] * 4 + [True]


def test_slowed_windows_do_not_become_the_reference_until_the_memory_ends() -> None:
    pace = JobPace()
    memory_windows = int(S.pace_memory_s * 1000 // W)
    sms: list[float | None] = [0.8] * 4 + [0.5] * (memory_windows + 3)
    got = paced(pace, sms)
    # slowed for the whole memory (the reference holds), then the slow level is the new normal
    assert got[4 : 4 + memory_windows] == [True] * memory_windows
    assert got[-2:] == [False, False]


def test_a_repeated_or_older_window_changes_nothing() -> None:
    pace = JobPace()
    paced(pace, [0.8] * 4)
    before = pace.to_dict()
    assert pace.slowed(2 * W, 0.1, None, S) is False
    assert pace.to_dict() == before


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), None])
def test_missing_or_hostile_medians_are_ignored(bad: float | None) -> None:
    pace = JobPace()
    paced(pace, [0.8] * 4)
    assert pace.slowed(4 * W, bad, bad, S) is False
    assert pace.sm == [0.8] * 4


def test_the_pace_round_trips_as_plain_data() -> None:
    pace = JobPace()
    paced(pace, [0.8, 0.7, 0.9, 0.8], steps=[1.0, 2.0, None, 3.0])
    assert JobPace.from_dict(pace.to_dict()) == pace


def ports(k: int, **odd: dict[str, float]) -> JobPorts:
    nodes = job(32, start=k * W, seed=k, **odd)
    return JobPorts("j1", k * W, (k + 1) * W, {n: tuple(p) for n, p in nodes.items()})


def run(net: JobNetwork, sms: list[float], job_wide: bool = False, first: int = 0,
        **odd: dict[str, float]) -> list[dict[str, Any]]:  # fmt: skip
    out: list[dict[str, Any]] = []
    for k, sm in enumerate(sms, first):
        net.add(ports(k, **odd))
        out += net.release("j1", k * W, (k + 1) * W, job_wide, sm, None)
    return out


def test_a_slow_link_is_named_when_the_job_slows_against_its_own_past() -> None:
    """The old gate (the GPU detector's job-wide verdict only) never opened for a uniform
    slowdown: this link stayed unnamed."""
    net = JobNetwork()
    assert run(net, [0.8] * 6, n17=WAITING) == []  # standing out, but the job is not slow
    found = run(net, [0.55] * 3, first=6, n17=WAITING)
    assert named(found) == [("n17", "mlx5_0/1", "CONFIRMED")]
    assert "while the job is slowed" in found[0]["reason"]


def test_the_job_wide_verdict_alone_still_opens_the_gate() -> None:
    assert named(run(JobNetwork(), [0.8] * 3, job_wide=True, n17=WAITING)) == [
        ("n17", "mlx5_0/1", "CONFIRMED")
    ]


def test_a_slowed_job_without_a_port_that_stands_out_names_nobody() -> None:
    net = JobNetwork()
    assert run(net, [0.8] * 5 + [0.4] * 6) == []


def test_a_node_a_switch_episode_explains_is_never_named() -> None:
    net = JobNetwork()
    run(net, [0.8] * 4)
    out = []
    for k in range(4, 10):
        jp = ports(k, n17=WAITING)
        net.add(JobPorts(jp.job_id, jp.start_ms, jp.end_ms, jp.nodes, {"n17": "leaf4"}))
        out += net.release("j1", k * W, (k + 1) * W, False, 0.5, None)
    assert out == []


def test_ports_of_a_released_window_are_refused_and_stale_ones_pruned() -> None:
    net = JobNetwork()
    run(net, [0.8] * 3)
    assert net.add(ports(1)) is False
    net.release("j1", 3 * W, 4 * W, False, 0.8, None)  # released before its ports came
    assert net.add(ports(3)) is False and ("j1", 3 * W) not in net.held
    assert net.add(ports(7)) is True
    net.prune(10 * W)
    assert net.held == {} and net.paces == {}


def test_a_restored_job_network_names_what_an_uninterrupted_one_names() -> None:
    """Cut between the first flagged window and the one that confirms: the saved memory (the
    pace, the port's flagged history) carries the episode over."""

    def go(net: JobNetwork, first: int, last: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for k in range(first, last):
            net.add(ports(k, **({"n17": WAITING} if k >= 5 else {})))
            out += net.release("j1", k * W, (k + 1) * W, False, 0.8 if k < 5 else 0.5, None)
        return out

    expected = go(JobNetwork(), 0, 10)
    first = JobNetwork()
    head = go(first, 0, 6)
    second = JobNetwork()
    second.restore("j1", json.loads(json.dumps(first.snapshot("j1"))))
    assert head == [] and go(second, 6, 10) == expected
    assert named(expected) == [("n17", "mlx5_0/1", "CONFIRMED")]
    assert expected[0]["window_start_ms"] == 6 * W
    # a clean port's memory is not saved (it is the same as none): only n17's is
    assert list(first.snapshot("j1")["peers"]) == ["n17/mlx5_0/1"]
