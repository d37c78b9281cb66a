"""The split replay's message channel (streams/offline/frames): arrays out of band arrive
equal and usable, messages in order, a closed end is EOFError, a header out of bounds is
refused before anything is allocated."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest
from channel_reader import EofReader

from peerwatch.streams.offline.frames import MAX_BUFFERS, channel_pair, frames_of


def test_a_message_with_arrays_arrives_equal_and_writable() -> None:
    here, there = channel_pair()
    ints = np.arange(10_000, dtype=np.int64).reshape(2, 5_000)
    message = ("drain", [], 7, {"ints": ints[1], "sums": np.linspace(0, 1, 33), "empty":
               np.zeros(0, np.int64), "strided": ints[0, ::3], "flags": np.ones(5, np.bool_)},
               {"jobs": {1: ("j", None, "p", "a")}})  # fmt: skip
    parts, size = frames_of(message)
    assert size == sum(memoryview(p).nbytes for p in parts)
    assert len(parts) > 3  # the contiguous arrays went out of band
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(there.recv()))
    reader.start()
    here.send(message)
    reader.join(timeout=30)
    kind, refused, at, arrays, meta = got[0]  # type: ignore[misc]
    assert (kind, refused, at, meta) == (*message[:3], message[4])
    for name, sent in message[3].items():  # type: ignore[union-attr]
        assert arrays[name].dtype == sent.dtype
        assert np.array_equal(arrays[name], sent)
    arrays["ints"][0] = -1  # the receiver's own memory, as an unpickled copy was
    assert ints[1, 0] == 5_000
    here.close()
    there.close()


def test_messages_arrive_in_order_and_a_closed_end_is_eof() -> None:
    here, there = channel_pair()
    sent = [("saw", np.full(i, i, np.int64), np.arange(i), [str(i)] * (i % 3)) for i in range(50)]
    reader = EofReader(there)
    for m in sent:
        here.send(m)
    here.close()
    got = reader.result()
    assert len(got) == len(sent)
    for g, s in zip(got, sent, strict=True):
        assert g[0] == s[0] and g[3] == s[3]  # type: ignore[index]
        assert np.array_equal(g[1], s[1]) and np.array_equal(g[2], s[2])  # type: ignore[index]
    there.close()


def test_a_frame_cut_short_is_eof() -> None:
    here, there = channel_pair()
    parts, _ = frames_of(("drain", np.arange(1000)))
    here.sock.sendall(b"".join(bytes(memoryview(p)) for p in parts)[:-10])
    here.close()
    with pytest.raises(EOFError):
        there.recv()
    there.close()


@pytest.mark.parametrize(
    "header",
    [
        struct.pack("<qq", MAX_BUFFERS + 1, 10),
        struct.pack("<qq", -1, 10),
        struct.pack("<qq", 0, -5),
        struct.pack("<qq", 1, 10) + struct.pack("<q", -1),
        struct.pack("<qq", 1, 10) + struct.pack("<q", 1 << 50),
    ],
)
def test_a_header_out_of_bounds_is_refused(header: bytes) -> None:
    here, there = channel_pair()
    here.sock.sendall(header)
    with pytest.raises(ValueError, match="out of bounds"):
        there.recv()
    here.close()
    there.close()
