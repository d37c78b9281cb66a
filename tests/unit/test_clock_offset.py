"""Node clock offsets against the times they were received, relative to the fleet's median."""

from __future__ import annotations

from random import Random

import numpy as np
import pytest

from peerwatch.streams.core.clock_offset import ClockOffsets, relative_offsets

NODES = [f"gpu{i:05d}" for i in range(10)]


def feed(
    clocks: ClockOffsets, ticks: range, skew_ms: dict[int, int], seen_of: object, rng: Random
) -> None:
    """One batch per tick: every node's sample of tick ``t`` (ts = t s + its skew), seen at
    ``seen_of(t, node)``."""
    for t in ticks:
        codes = np.arange(len(NODES), dtype=np.int64)
        ts = np.array([t * 1000 + skew_ms.get(n, 0) for n in range(len(NODES))], np.int64)
        seen = np.array([seen_of(t, n, rng) for n in range(len(NODES))], np.int64)  # type: ignore[operator]
        clocks.observe(NODES.__getitem__, codes, ts, seen)


def real_time(t: int, _n: int, rng: Random) -> int:
    return t * 1000 + rng.randint(5, 80)  # tick -> receipt: 5..80 ms


def test_a_node_ahead_and_one_behind_are_found_within_the_delay_jitter() -> None:
    clocks = ClockOffsets()
    feed(clocks, range(100, 160), {3: 2500, 7: -1500}, real_time, Random(1))
    got = clocks.offsets_ms()
    assert set(got) == set(NODES)
    assert got["gpu00003"] == pytest.approx(2500, abs=80)
    assert got["gpu00007"] == pytest.approx(-1500, abs=80)
    assert all(abs(v) <= 80 for n, v in got.items() if n not in ("gpu00003", "gpu00007"))


def test_late_deliveries_do_not_move_a_nodes_offset() -> None:
    def spooled(t: int, n: int, rng: Random) -> int:  # node 5 delivers half its samples 40 s late
        late = 40_000 if n == 5 and t % 2 else 0
        return real_time(t, n, rng) + late

    clocks = ClockOffsets()
    feed(clocks, range(100, 160), {}, spooled, Random(2))
    assert abs(clocks.offsets_ms()["gpu00005"]) <= 80


def test_a_backlog_published_faster_than_real_time_still_gives_the_offsets() -> None:
    def burst(t: int, n: int, _rng: Random) -> int:  # 200 ticks received within 2 s
        return 5_000_000 + t * 10 + n

    clocks = ClockOffsets()
    feed(clocks, range(0, 200), {4: 3000}, burst, Random(3))
    got = clocks.offsets_ms()
    assert got["gpu00004"] == pytest.approx(3000, abs=20)
    assert all(abs(v) <= 20 for n, v in got.items() if n != "gpu00004")


def test_a_fixed_clock_is_followed_and_a_silent_node_remembered_then_forgotten() -> None:
    clocks = ClockOffsets(bucket_ms=30_000, memory_buckets=4)
    feed(clocks, range(100, 130), {2: 2000, 9: 1500}, real_time, Random(4))
    assert clocks.offsets_ms()["gpu00002"] == pytest.approx(2000, abs=80)

    def tick(t: int, nodes: list[int]) -> None:
        codes = np.array(nodes, np.int64)
        ts = np.array([t * 1000 for _ in nodes], np.int64)
        clocks.observe(NODES.__getitem__, codes, ts, np.full(len(nodes), t * 1000 + 40))

    # gpu00002's clock is fixed; gpu00009 stops reporting
    later = [n for n in range(len(NODES)) if n != 9]
    for t in range(130, 200):
        tick(t, later)
    got = clocks.offsets_ms()
    assert got["gpu00002"] == 0  # two buckets later, only the fixed clock's leads are left
    assert got["gpu00009"] == pytest.approx(1500, abs=80)  # its last estimate, remembered
    for t in range(200, 300):
        tick(t, later)
    assert "gpu00009" not in clocks.offsets_ms()  # more than 4 buckets of silence


def test_a_batch_out_of_order_only_raises_its_nodes_bucket() -> None:
    clocks = ClockOffsets(bucket_ms=1000)
    codes = np.array([0, 1, 2], np.int64)
    clocks.observe(NODES.__getitem__, codes, np.array([5000, 5000, 5000]), np.full(3, 5100))
    clocks.observe(NODES.__getitem__, codes[:1], np.array([4950]), np.array([4960]))
    assert clocks.leads_ms() == {"gpu00000": -10, "gpu00001": -100, "gpu00002": -100}


def test_rows_without_a_reference_time_are_ignored_and_few_nodes_give_nothing() -> None:
    clocks = ClockOffsets()
    codes = np.array([0, 1, 2], np.int64)
    clocks.observe(NODES.__getitem__, codes, np.array([1000, 2000, 3000]), np.zeros(3, np.int64))
    assert clocks.leads_ms() == {} and clocks.offsets_ms() == {}
    clocks.observe(NODES.__getitem__, codes[:2], np.array([1000, 9000]), np.array([1010, 1010]))
    assert clocks.leads_ms() == {"gpu00000": -10, "gpu00001": 7990}
    assert clocks.offsets_ms() == {}  # two nodes: no median to speak of
    assert relative_offsets({"a": 10, "b": 20, "c": 3020}) == {"a": -10, "b": 0, "c": 3000}
    with pytest.raises(ValueError, match="bucket_ms"):
        ClockOffsets(bucket_ms=0)
