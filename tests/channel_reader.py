"""A frame channel read in a thread until its far end closes (tests of the split replay's
transport: streams/offline/frames.py, streams/offline/split.PipeWriter)."""

from __future__ import annotations

import threading
from typing import Any

from peerwatch.streams.offline.frames import FrameChannel


class EofReader:
    """Receives every message of ``channel`` in a thread until EOF. :meth:`result` waits for it
    and fails the test if the thread is still reading, raised anything else, or never saw EOF
    (an exception inside a thread would otherwise only be a warning)."""

    def __init__(self, channel: FrameChannel) -> None:
        self.channel = channel
        self.got: list[Any] = []
        self.ended = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-eof-reader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while True:
                self.got.append(self.channel.recv())
        except EOFError:
            self.ended = True
        except BaseException as exc:  # reported by result()
            self.error = exc

    def result(self, timeout_s: float = 30.0) -> list[Any]:
        self.thread.join(timeout=timeout_s)
        assert not self.thread.is_alive(), "the reader still waits: the far end never closed"
        assert self.error is None, f"the reader failed: {self.error!r}"
        assert self.ended
        return self.got
