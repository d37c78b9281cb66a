"""One process at a time per spool directory (``Spool`` is single-owner).

The agent holds its spool's lock for its whole life; concurrent health runs (two prologs on one
node) wait briefly for theirs. The lock is ``flock`` on ``<dir>/.lock``: the kernel releases it
when the process dies, so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from peerwatch.errors import ServiceError


class SpoolBusyError(ServiceError):
    """Another process holds the spool directory's lock."""


class SpoolLock:
    """``with SpoolLock(dir, timeout_s):`` — exclusive use of ``dir`` (created if missing).

    Raises SpoolBusyError when the lock is not had within ``timeout_s`` (0: try once), and
    OSError when the directory cannot be created or the lock file opened.
    """

    def __init__(self, directory: Path, timeout_s: float = 0.0, poll_s: float = 0.05) -> None:
        self.directory = Path(directory)
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._fd: int | None = None

    def acquire(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise SpoolBusyError(
                        f"spool {self.directory} is in use by another peerwatch process"
                    ) from None
                time.sleep(self.poll_s)
                continue
            self._fd = fd
            return

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> SpoolLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
