"""Archive blocks read ahead by a process of their own: the file reads and the zstandard
decompression (a seventh of a split replay's reading process, its largest cost after the
column decoder) move to a third process, which writes each block's decompressed bytes into a
slot of memory shared across the fork; the reading process decodes them there, where they are,
and hands the slot back.

:meth:`ReadAhead.raw_blocks` is :func:`~peerwatch.exporters.archive_files.raw_blocks` with the
same results and refusals: the same ``(record count, bytes)`` blocks (a slot's bytes as a
memoryview, released once the next block is asked for), the same ValueError for an unreadable
header (OSError for a file that cannot be opened), the same warnings (the read-ahead process sends them; they are logged here, by the same
logger, in order with the blocks) and the same counts in ``stats``. A block larger than a slot
comes through the pipe as bytes.

Messages to the read-ahead process: ``("open", path)`` (read its header; any file opened before
is dropped), ``("go",)`` (send the opened file's blocks), ``("free", slot)``, ``("quit",)``.
From it: ``("header", writer_schema)`` or ``("header_error", exception)``, then ``("slot", slot,
count, size)`` or ``("bytes", count, data)`` for each block, ``("end", stats)``; ``("log",
logger, level, message)`` at any point; ``("error", message)`` when it fails (it ends then).
A read-ahead process that ends early (killed) is an error here at the next message, never a
wait: this side closed its copy of the other end of the pipe.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from peerwatch.exporters.archive_files import ReadStats, raw_blocks

#: Slots of decompressed blocks in flight (the archiver writes blocks of about 1 MiB).
SLOTS = 8
SLOT_BYTES = 2 << 20


class ReadAheadError(RuntimeError):
    """The read-ahead process failed, or ended early."""


class ReadAhead:
    """The read-ahead process and its side of the pipe (module docstring). Start it before
    any thread of this process (it is forked); :meth:`close` stops it. One file's blocks at a
    time: a blocks iterator left unfinished (an error while decoding) stops the process, and
    every later call raises ReadAheadError."""

    def __init__(self, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError("read-ahead: at least one slot of at least one byte")
        self._slot_bytes = slot_bytes
        self._mem = mmap.mmap(-1, slots * slot_bytes)  # anonymous: shared with the fork
        self._view = memoryview(self._mem)
        ctx = multiprocessing.get_context("fork")
        self._conn, there = ctx.Pipe()
        self._proc = ctx.Process(
            target=_reader_main, args=(there, self._mem, slots, slot_bytes),
            name="peerwatch-replay-read", daemon=True,
        )  # fmt: skip
        self._proc.start()
        there.close()
        self._opened = 0  # files opened; a blocks iterator reads only the latest one
        self._broken: str | None = None

    def raw_blocks(
        self, path: Path, stats: ReadStats | None = None
    ) -> tuple[Any, Iterator[tuple[int, Any]]]:
        """As :func:`~peerwatch.exporters.archive_files.raw_blocks` (module docstring)."""
        self._send(("open", str(path)))
        reply = self._recv()
        if reply[0] == "header_error":
            raise reply[1]  # raw_blocks's own ValueError or OSError, as it raised it there
        if reply[0] != "header":
            raise self._fail(f"read-ahead: {reply[0]!r} where a header was due")
        self._opened += 1
        return reply[1], self._blocks(self._opened, stats)

    def _blocks(self, opened: int, stats: ReadStats | None) -> Iterator[tuple[int, Any]]:
        if opened != self._opened:
            raise self._fail("read-ahead: the blocks of a file asked for after another was opened")
        self._send(("go",))
        done = False
        try:
            while True:
                message = self._recv()
                kind = message[0]
                if kind == "end":
                    if stats is not None:
                        stats.add(ReadStats(**message[1]))
                    done = True
                    return
                if kind == "bytes":
                    yield message[1], message[2]
                    continue
                if kind != "slot":
                    raise self._fail(f"read-ahead: {kind!r} where a block was due")
                _, slot, count, size = message
                start = slot * self._slot_bytes
                view = self._view[start : start + size]
                try:
                    yield count, view
                finally:
                    view.release()  # a view kept past this block raises, never reads another
                self._send(("free", slot))
        finally:
            if not done:  # left unfinished: the process is still sending this file's blocks
                self._stop("read-ahead: a file's blocks were left unread")

    def _send(self, message: tuple[Any, ...]) -> None:
        if self._broken is not None:
            raise ReadAheadError(self._broken)
        try:
            self._conn.send(message)
        except OSError as exc:
            raise self._fail(f"read-ahead process ended early ({exc})") from exc

    def _recv(self) -> tuple[Any, ...]:
        if self._broken is not None:
            raise ReadAheadError(self._broken)
        while True:
            try:
                message: tuple[Any, ...] = self._conn.recv()
            except (EOFError, OSError) as exc:
                self._proc.join(timeout=1.0)
                raise self._fail(
                    f"read-ahead process ended early (exit code {self._proc.exitcode})"
                ) from exc
            if message[0] == "log":
                _, name, level, text = message
                logging.getLogger(name).log(level, "%s", text)
                continue
            if message[0] == "error":
                raise self._fail(f"read-ahead process failed: {message[1]}")
            return message

    def _fail(self, why: str) -> ReadAheadError:
        self._stop(why)
        return ReadAheadError(why)

    def _stop(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join()

    def close(self) -> None:
        """Stop the read-ahead process (at once: what it read ahead is dropped)."""
        if self._broken is None:
            self._broken = "read-ahead: closed"
            with contextlib.suppress(OSError):  # it ended already
                self._conn.send(("quit",))
            self._proc.join(timeout=5.0)
        self._stop(self._broken)
        self._conn.close()
        # a blocks iterator suspended at a block (an error raised through it) still holds that
        # block's view: the memory is then freed with the last view, not here
        with contextlib.suppress(BufferError):
            self._view.release()
            self._mem.close()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Forward(logging.Handler):
    """The read-ahead process's log records, sent to be logged by the reading process."""

    def __init__(self, conn: Any) -> None:
        super().__init__()
        self._conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        self._conn.send(("log", record.name, record.levelno, record.getMessage()))


def _reader_main(conn: Any, mem: mmap.mmap, slots: int, slot_bytes: int) -> None:
    """The read-ahead process: each opened file's header, then on ``go`` its blocks."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_Forward(conn))
    try:
        _serve(conn, mem, slots, slot_bytes)
    except (EOFError, BrokenPipeError):
        return  # the reading process ended or closed the pipe: nothing to tell
    except Exception as exc:  # told to the reading process, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _serve(conn: Any, mem: mmap.mmap, slots: int, slot_bytes: int) -> None:
    free = list(range(slots))
    blocks: Iterator[tuple[int, bytes]] | None = None
    stats = ReadStats()
    while True:
        message = conn.recv()
        kind = message[0]
        if kind == "quit":
            return
        if kind == "free":
            free.append(message[1])
        elif kind == "open":
            blocks, stats = None, ReadStats()
            try:
                schema, blocks = raw_blocks(Path(message[1]), stats)
            except (ValueError, OSError) as exc:  # an unreadable header, a missing file
                conn.send(("header_error", exc))
                continue
            conn.send(("header", schema))
        elif kind == "go":
            if blocks is None:
                raise RuntimeError("blocks asked for with no file open")
            for count, data in blocks:
                if len(data) > slot_bytes:
                    conn.send(("bytes", count, data))
                    continue
                while not free or conn.poll():  # the slots handed back so far
                    reply = conn.recv()
                    if reply[0] == "quit":
                        return
                    if reply[0] != "free":
                        raise RuntimeError(f"{reply[0]!r} while a file's blocks were sent")
                    free.append(reply[1])
                slot = free.pop()
                mem[slot * slot_bytes : slot * slot_bytes + len(data)] = data
                conn.send(("slot", slot, count, len(data)))
            blocks = None
            conn.send(("end", stats.as_dict()))
        else:
            raise RuntimeError(f"unknown message {kind!r}")
