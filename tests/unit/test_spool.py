from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from peerwatch.producers.spool import Spool, SpooledRecord


def rec(i: int, topic: str = "t", size: int = 10) -> SpooledRecord:
    return SpooledRecord(topic, f"k{i}".encode(), bytes([i % 256]) * size, (("h", b"v"),), i, i)


def test_record_encoding_round_trips_every_field() -> None:
    r = SpooledRecord("peerwatch.gpu.samples", None, b"\x00\xff", (("a", b""), ("b", b"x")), 5, 7)
    assert SpooledRecord.decode(r.encode()) == r


def test_fifo_order_and_pop(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([rec(i) for i in range(5)])
    spool.append([rec(i) for i in range(5, 8)])
    assert len(spool) == 8
    assert [r.seq for r in spool.peek(3)] == [0, 1, 2]
    spool.pop(3)
    assert [r.seq for r in spool.peek(100)] == [3, 4, 5, 6, 7]
    spool.pop(5)
    assert len(spool) == 0 and spool.peek(10) == []


def test_survives_reopen_with_head_position(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=200)
    spool.append([rec(i) for i in range(20)])
    spool.pop(7)
    reopened = Spool(tmp_path, segment_bytes=200)
    assert len(reopened) == 13
    assert [r.seq for r in reopened.peek(100)] == list(range(7, 20))


def test_torn_tail_is_cut_and_the_rest_kept(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.append([rec(i) for i in range(4)])
    seg = sorted(tmp_path.glob("*.seg"))[-1]
    with seg.open("ab") as fh:  # a crash mid-write leaves half a frame
        fh.write(b"\x40\x00\x00\x00\x01\x02")
    reopened = Spool(tmp_path)
    assert [r.seq for r in reopened.peek(10)] == [0, 1, 2, 3]
    reopened.append([rec(9)])
    assert [r.seq for r in Spool(tmp_path).peek(10)] == [0, 1, 2, 3, 9]


def test_size_limit_drops_oldest_first_and_counts(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=2_000, segment_bytes=500)
    for i in range(40):
        spool.append([rec(i, size=50)])
    kept = [r.seq for r in spool.peek(1000)]
    assert spool.dropped > 0
    assert kept == list(range(40 - len(kept), 40)), "the newest records survive, in order"
    assert spool.dropped + len(kept) == 40
    assert spool.bytes <= 2_000


def test_age_limit_drops_old_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_age_s=0.0, segment_bytes=100)
    spool.append([rec(i, size=80) for i in range(3)])
    spool.append([rec(3, size=80)])
    assert spool.dropped >= 1
    assert spool.peek(10)[-1].seq == 3


def test_prepend_puts_records_back_in_front(tmp_path: Path) -> None:
    spool = Spool(tmp_path, segment_bytes=10_000)
    spool.append([rec(i) for i in range(10)])
    chunk = spool.peek(4)
    spool.pop(4)
    spool.prepend([chunk[1], chunk[3]])  # two of the chunk failed
    assert [r.seq for r in spool.peek(100)] == [1, 3, 4, 5, 6, 7, 8, 9]
    assert [r.seq for r in Spool(tmp_path).peek(100)] == [1, 3, 4, 5, 6, 7, 8, 9]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["append", "pop", "reopen"]), st.integers(1, 7)), max_size=25
    )
)
def test_model_based_fifo(tmp_path_factory: object, ops: list[tuple[str, int]]) -> None:
    directory = Path(tmp_path_factory.mktemp("spool"))  # type: ignore[attr-defined]
    spool = Spool(directory, segment_bytes=150)
    model: list[int] = []
    nxt = 0
    for op, n in ops:
        if op == "append":
            spool.append([rec(nxt + i) for i in range(n)])
            model += list(range(nxt, nxt + n))
            nxt += n
        elif op == "pop":
            spool.pop(n)
            model = model[n:]
        else:
            spool = Spool(directory, segment_bytes=150)
        assert len(spool) == len(model)
        assert [r.seq for r in spool.peek(1000)] == model
