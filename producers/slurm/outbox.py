"""The hooks' outbox: one file per undelivered record, safe for concurrent hook processes.

slurmd runs a Prolog (and an Epilog) per job, so several hook processes can run at once on a
node. Each writes its record as its own file (``<ts_ms>-<event_id>.json``, written to a temporary
name, fsynced, then renamed: readers never see half a file), so writers need no lock. Readers
(the sender) take ``.lock`` (``flock``) so that only one of them delivers and removes files at a
time; a crash after delivery but before the removal re-sends a record with the same event id,
which consumers recognise.

Stdlib only: the hook's import path must stay short (see ``peerwatch.commands.slurm``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerwatch.files import write_atomic

__all__ = ["Outbox", "OutboxItem"]

_SUFFIX = ".json"


@dataclass(frozen=True)
class OutboxItem:
    """One waiting record: where it goes (``topic``, ``key``), its ``schema`` and value dict."""

    path: Path
    topic: str
    key: str
    schema: str
    record: dict[str, Any]


class Outbox:
    """A directory of records waiting for Kafka (created on first use)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, topic: str, key: str, schema: str, record: Mapping[str, Any]) -> Path:
        """Store one record durably; returns its file. Raises OSError when the disk refuses."""
        self.directory.mkdir(parents=True, exist_ok=True)
        ts_ms = int(record.get("ts_ms") or time.time() * 1000)
        name = f"{ts_ms:013d}-{record.get('event_id', 'record')}-{os.getpid()}{_SUFFIX}"
        body = json.dumps(
            {"topic": topic, "key": key, "schema": schema, "record": dict(record)},
            separators=(",", ":"),
        ).encode()
        final = self.directory / name
        write_atomic(final, body, mode=0o600)
        return final

    def pending(self, limit: int = 1000) -> list[OutboxItem]:
        """Up to ``limit`` waiting records, oldest first. Unreadable files are renamed to
        ``*.bad`` (kept for inspection, never retried)."""
        try:
            names = sorted(
                n for n in os.listdir(self.directory) if n.endswith(_SUFFIX) and n[0] != "."
            )
        except FileNotFoundError:
            return []
        items: list[OutboxItem] = []
        for name in names[:limit]:
            path = self.directory / name
            try:
                doc = json.loads(path.read_bytes())
                items.append(
                    OutboxItem(path, doc["topic"], doc["key"], doc["schema"], doc["record"])
                )
            except FileNotFoundError:
                continue  # another sender delivered it meanwhile
            except (ValueError, KeyError, TypeError):
                with contextlib.suppress(OSError):
                    os.replace(path, path.with_suffix(".bad"))
        return items

    def remove(self, item: OutboxItem) -> None:
        """Forget a delivered record (already gone is fine)."""
        with contextlib.suppress(FileNotFoundError):
            item.path.unlink()

    def __len__(self) -> int:
        try:
            return sum(1 for n in os.listdir(self.directory) if n.endswith(_SUFFIX) and n[0] != ".")
        except FileNotFoundError:
            return 0

    def sender_active(self) -> bool:
        """True when a sender holds the lock now. A sender re-checks the outbox after releasing
        the lock, so a record stored before this returned True is still picked up."""
        try:
            fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    @contextlib.contextmanager
    def locked(self, timeout_s: float) -> Iterator[bool]:
        """Hold the sender lock; yields False when another process kept it for ``timeout_s``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(0.02)
            yield True
        finally:
            os.close(fd)  # closing releases the flock
