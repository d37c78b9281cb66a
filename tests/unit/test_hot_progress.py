"""Where the hot stage commits: at the oldest open window, with what a successor must skip."""

from __future__ import annotations

import json

from peerwatch.streams.live.hot_progress import PartitionProgress

W = 30_000


def test_nothing_read_nothing_to_commit() -> None:
    assert PartitionProgress(W).commit_point() is None


def test_commit_trails_the_oldest_open_window() -> None:
    p = PartitionProgress(W)
    p.read(10, 0)  # window 0
    p.read(11, 31_000)  # window 30 s
    p.read(12, 5_000)  # window 0 again
    assert p.commit_point() == (10, "{}")  # nothing closed yet: no skip metadata
    p.closed(W)  # window 0 emitted
    offset, meta = p.commit_point() or (None, "")
    assert offset == 11
    assert json.loads(meta) == {"closed_until_ms": W, "seen_until": 13}
    p.closed(2 * W)
    assert p.commit_point() == (13, json.dumps({"closed_until_ms": 2 * W, "seen_until": 13},
                                               separators=(",", ":")))  # fmt: skip


def test_undecodable_records_advance_without_holding_a_window() -> None:
    p = PartitionProgress(W)
    p.skip(0)
    p.skip(1)
    assert p.commit_point() == (2, "{}")


def test_late_samples_do_not_hold_the_commit_back() -> None:
    p = PartitionProgress(W)
    p.read(0, 1_000)
    p.closed(W)
    p.read(1, 2_000)  # late: its window is closed (the stage dead-letters it)
    assert (p.commit_point() or (None,))[0] == 2


def test_a_successor_skips_what_was_handled_and_rebuilds_open_windows() -> None:
    before = PartitionProgress(W)
    for offset, ts in enumerate([1_000, 29_000, 31_000, 29_500, 40_000]):
        before.read(offset, ts)
    before.closed(W)  # window 0 emitted; offsets 2 and 4 are in the open 30 s window
    offset, meta = before.commit_point() or (0, "")
    assert offset == 2

    after = PartitionProgress(W)
    after.resume(meta)
    assert after.resumed_closed_until_ms == W and after.resumed_seen_until == 5
    # re-read from offset 2: 3 belongs to the emitted window 0 and is skipped
    assert not after.already_handled(2, 31_000)
    assert after.already_handled(3, 29_500)
    assert not after.already_handled(4, 40_000)
    # beyond seen_until an old sample is new input: late, not "handled"
    assert not after.already_handled(5, 29_900)
    assert after.skipped == 1
    # until it closes something itself, it keeps the resumed metadata
    after.read(2, 31_000)
    after.skip(3)
    after.read(4, 40_000)
    assert json.loads((after.commit_point() or (0, ""))[1]) == {
        "closed_until_ms": W,
        "seen_until": 5,
    }


def test_bad_metadata_resumes_fresh() -> None:
    for meta in (None, "", "not json", "[1]", '{"closed_until_ms": "x", "seen_until": 3}'):
        p = PartitionProgress(W)
        p.resume(meta)
        assert p.resumed_seen_until is None
        assert not p.already_handled(0, 0)
