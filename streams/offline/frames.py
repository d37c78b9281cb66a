"""Messages between a split replay's processes, over one end of a socket pair: each message
is a pickle (protocol 5) whose contiguous arrays travel out of band, as buffers of their own,
each written from the array itself and read straight into the memory the receiving array
then lives in. Through ``multiprocessing.Connection`` a window start's closed windows (about
300 bytes a GPU) were copied four times on the way (into the pickle, into the socket, out of
it in pieces gathered again, out of the pickle): about 0.4 CPU-s per 100 MB, now 0.1.

A frame: a header of 16 bytes (how many buffers, the pickle's length; little-endian int64s),
the buffers' lengths (an int64 each), then the body: the pickle and the buffers, each from a
multiple of 8 bytes (an array over its buffer is aligned). A frame is written with one
``sendmsg`` (its parts gathered by the kernel) and its body read with one ``recv_into``: a
message costs a few system calls and wakes the reader once, however many arrays it holds. Both
ends are this program's own processes (forked together); a header out of bounds is still
refused, never allocated.

The sender must not change an array it sent until the message is written (the frames hold
the array's memory, not a copy of it): the split replay sends closed windows, which no one
holds any more, and sample columns, which are read-only.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

_HEADER = struct.Struct("<qq")
#: At most this many out-of-band buffers in one message, and this many bytes in one part.
MAX_BUFFERS = 1 << 20
MAX_PART_BYTES = 1 << 40


def _padded(n: int) -> int:
    return (n + 7) // 8 * 8


_PAD = bytes(8)


def frames_of(message: Any) -> tuple[list[Any], int]:
    """``message`` as the parts of one frame (bytes and buffers, in writing order) and their
    total size in bytes."""
    buffers: list[pickle.PickleBuffer] = []
    main = pickle.dumps(message, 5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    sizes = [len(main), *(r.nbytes for r in raws)]
    parts: list[Any] = [
        _HEADER.pack(len(raws), len(main)) + struct.pack(f"<{len(raws)}q", *sizes[1:])
    ]
    for part, n in zip([main, *raws], sizes, strict=True):
        parts.append(part)
        if n % 8:
            parts.append(_PAD[: 8 - n % 8])
    return parts, sum(memoryview(p).nbytes for p in parts)


#: Parts given to one ``sendmsg`` (the kernel takes at most IOV_MAX, 1,024 on Linux).
_PARTS_PER_CALL = 512


class FrameChannel:
    """One end of a socket pair carrying messages as frames (module docstring)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send_frames(self, parts: list[Any]) -> None:
        """Write the parts of one frame (:func:`frames_of`). Raises OSError when the other
        end is closed."""
        views = [memoryview(p).cast("B") for p in parts]
        while views:
            sent = self.sock.sendmsg(views[:_PARTS_PER_CALL])
            while views and sent >= views[0].nbytes:  # the parts written whole
                sent -= views.pop(0).nbytes
            if sent:  # one written in part: the rest of it next
                views[0] = views[0][sent:]

    def send(self, message: Any) -> None:
        self.send_frames(frames_of(message)[0])

    def recv(self) -> Any:
        """The next message. Raises EOFError at the end of the stream (the other end closed,
        between messages or within one), ValueError for a header out of bounds."""
        count, main_len = _HEADER.unpack(self._exactly(_HEADER.size))
        if not 0 <= count <= MAX_BUFFERS or not 0 <= main_len <= MAX_PART_BYTES:
            raise ValueError(f"frame header out of bounds ({count} buffers, {main_len} bytes)")
        lengths = struct.unpack(f"<{count}q", self._exactly(8 * count)) if count else ()
        if any(not 0 <= n <= MAX_PART_BYTES for n in lengths):
            raise ValueError("frame buffer length out of bounds")
        body = memoryview(self._exactly(sum(map(_padded, (main_len, *lengths)))))
        at = _padded(main_len)
        buffers = []
        for n in lengths:
            buffers.append(body[at : at + n])
            at += _padded(n)
        return pickle.loads(body[:main_len], buffers=buffers)  # noqa: S301 - our own process's

    def _exactly(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise EOFError("the other end closed")
            got += k
        return buf

    def close(self) -> None:
        self.sock.close()


def channel_pair() -> tuple[FrameChannel, FrameChannel]:
    """Two connected ends (a Unix socket pair; a forked child inherits both: it closes the one
    it does not use)."""
    a, b = socket.socketpair()
    return FrameChannel(a), FrameChannel(b)
