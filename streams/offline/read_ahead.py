"""Archive blocks read and decompressed by a thread, ahead of the replay that decodes them.

Reading a block from its file and decompressing it (zstandard) release the GIL, so one thread
does both while the replay's own thread decodes and aggregates the blocks before it: on a machine
with a core to spare, that work (about a sixth of a replay, docs/performance.md) leaves the
replay's path; on a busy one the thread costs a queue hand-over a block. The blocks come out in
the order read, and whatever reading them raises is raised to the reader at that place, so a
replay reads the same blocks with or without it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

#: Blocks read ahead at most (about 1 MB each decompressed, for the bench fleet's archive).
READ_AHEAD_BLOCKS = 8

_END = object()


def read_ahead(items: Iterator[T], depth: int = READ_AHEAD_BLOCKS) -> Iterator[T]:
    """``items`` in order, each taken from ``items`` by a thread while the caller works on
    those before it (at most ``depth`` waiting). An exception ``items`` raises is raised here
    after the items before it. Closing this iterator before its end stops the thread (after the
    item it is reading) and closes ``items``; ``items`` is used by that thread only."""
    waiting: queue.Queue[tuple[object, BaseException | None]] = queue.Queue(max(1, depth))
    stop = threading.Event()

    def fill() -> None:
        try:
            for item in items:
                if stop.is_set():
                    return
                waiting.put((item, None))
            waiting.put((_END, None))
        except BaseException as exc:  # handed to the reader, never lost with the thread
            waiting.put((_END, exc))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=fill, name="archive-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, error = waiting.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item  # type: ignore[misc]  # every other item is one of ``items``
    finally:
        stop.set()
        # A thread blocked on a full queue gets room, sees the stop and ends.
        while thread.is_alive():
            with contextlib.suppress(queue.Empty):
                waiting.get(timeout=0.05)
        thread.join()
