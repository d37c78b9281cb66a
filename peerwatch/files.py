"""Replacing a file atomically: the one way every state, cursor, head and spool file is written.

A reader (or the process after a crash) sees the old content or the new, whole, never a part.
``durable`` adds the two syncs that make this hold after a power loss too: the new data before
the rename, the directory after it. Files rewritten every second whose loss is harmless (the
worker's counters) skip them.
"""

from __future__ import annotations

import contextlib
import glob
import os
import secrets
from pathlib import Path

__all__ = ["fsync_dir", "remove_stale_tmp", "write_atomic"]


def fsync_dir(path: Path) -> None:
    """Make the creations, renames and removals in directory ``path`` durable. Raises OSError."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, *, durable: bool = True, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data``. The temporary file beside it is unique to the call (two
    writers of one path never share it) and removed when anything fails; ``mode`` is applied as
    by ``open``, less the umask. Raises OSError."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def remove_stale_tmp(path: Path) -> int:
    """Remove the temporary files :func:`write_atomic` left beside ``path`` when a process died
    in the middle; returns how many. Only for a path with one writer, before it writes."""
    removed = 0
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
            removed += 1
    return removed
