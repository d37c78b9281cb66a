"""Archive blocks read ahead by a process of their own: the file reads and the zstandard
decompression and, given a column decoder, the decoding of the samples (the reading process's
largest cost) move to a third process, which writes each block's bytes (or its decoded columns)
into a slot of memory shared across the fork; the reading process takes them from there and
hands the slot back.

:meth:`ReadAhead.raw_blocks` is :func:`~peerwatch.io.archive.reader.raw_blocks` with the
same results and refusals: the same ``(record count, bytes)`` blocks (a slot's bytes as a
memoryview, released once the next block is asked for), the same ValueError for an unreadable
header (OSError for a file that cannot be opened), the same warnings (the read-ahead process sends them; they are logged here, by the same
logger, in order with the blocks) and the same counts in ``stats``. A block larger than a slot
comes through the pipe as bytes. :meth:`ReadAhead.decoded_blocks` is
:func:`~peerwatch.streams.offline.sample_runs.decoded_here` over ``raw_blocks`` with the same
decoder: the same tables (copied out of the slot), the same refusals, string codes of the
caller's ``strings``. The read-ahead process decodes with a copy of that dict (sent with the
first ``go`` and whenever the caller gives another) and sends each block's new strings with
it; this side adds them to ``strings`` at the same codes, so the codes are those a decoder here
would give. Only decoders add to such a dict; one that changed under a file's blocks is an
error.

Messages to the read-ahead process: ``("open", path)`` (read its header; any file opened before
is dropped), ``("go", decode, strings)`` (send the opened file's blocks, decoded or not; the
reading process's strings to decode with, None: those held), ``("free",
slot)``, ``("quit",)``. From it: ``("header", writer_schema)`` or ``("header_error",
exception)``, then for each block ``("slot", slot, count, size)`` or ``("bytes", count, data)``,
decoded ``("slot_tables", slot, shape, lengths, count, size, bad, end, names)`` or ``("tables",
raw, count, size, bad, end, names)``, then ``("end", stats)``; ``("log", logger, level,
message)`` at any point; ``("error", message)`` when it fails (it ends then).
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

from peerwatch.io.archive.layout import ReadStats
from peerwatch.io.archive.reader import raw_blocks
from peerwatch.schemas.columns import Buffer, ColumnDecoder, RawTable, Table
from peerwatch.streams.offline.sample_runs import DecodedBlock

#: Slots of blocks in flight (the archiver writes blocks of about 1 MiB; their samples decoded
#: into columns take about 1.3 MiB).
SLOTS = 8
SLOT_BYTES = 4 << 20


class ReadAheadError(RuntimeError):
    """The read-ahead process failed, or ended early."""


class ReadAhead:
    """The read-ahead process and its side of the pipe (module docstring). Start it before
    any thread of this process (it is forked); :meth:`close` stops it. One file's blocks at a
    time: a blocks iterator left unfinished (an error while decoding) stops the process, and
    every later call raises ReadAheadError."""

    def __init__(
        self, slots: int = SLOTS, slot_bytes: int = SLOT_BYTES, decoder: ColumnDecoder | None = None
    ) -> None:
        """``decoder``: the column decoder of :meth:`decoded_blocks` (None: only
        :meth:`raw_blocks`)."""
        if slots < 1 or slot_bytes < 1:
            raise ValueError("read-ahead: at least one slot of at least one byte")
        self._slot_bytes = slot_bytes
        self._mem = mmap.mmap(-1, slots * slot_bytes)  # anonymous: shared with the fork
        self._view = memoryview(self._mem)
        self._decoder = decoder
        ctx = multiprocessing.get_context("fork")
        self._conn, there = ctx.Pipe()
        self._proc = ctx.Process(
            target=_reader_main, args=(there, self._mem, slots, slot_bytes, decoder),
            name="peerwatch-replay-read", daemon=True,
        )  # fmt: skip
        self._proc.start()
        there.close()
        self._opened = 0  # files opened; a blocks iterator reads only the latest one
        self._broken: str | None = None
        #: the strings dict the read-ahead process mirrors, and how many of its strings it holds
        self._strings: dict[str, int] | None = None
        self._mirrored = 0

    def raw_blocks(
        self, path: Path, stats: ReadStats | None = None
    ) -> tuple[Any, Iterator[tuple[int, Any]]]:
        """As :func:`~peerwatch.io.archive.reader.raw_blocks` (module docstring)."""
        return self._open(path), self._blocks(self._opened, stats, None)

    def decoded_blocks(
        self, path: Path, stats: ReadStats | None, strings: dict[str, int]
    ) -> tuple[Any, Iterator[DecodedBlock]]:
        """As :func:`~peerwatch.streams.offline.sample_runs.decoded_here` with this read-ahead's
        decoder over :func:`~peerwatch.io.archive.reader.raw_blocks` (module docstring):
        a :data:`~peerwatch.streams.offline.sample_runs.TablesOf`."""
        if self._decoder is None:
            raise ValueError("read-ahead: made without a decoder")
        return self._open(path), self._blocks(self._opened, stats, strings)

    def _open(self, path: Path) -> Any:
        self._send(("open", str(path)))
        reply = self._recv()
        if reply[0] == "header_error":
            raise reply[1]  # raw_blocks's own ValueError or OSError, as it raised it there
        if reply[0] != "header":
            raise self._fail(f"read-ahead: {reply[0]!r} where a header was due")
        self._opened += 1
        return reply[1]

    def _blocks(
        self, opened: int, stats: ReadStats | None, strings: dict[str, int] | None
    ) -> Iterator[Any]:
        """The opened file's blocks: ``(count, bytes)``, or with ``strings`` DecodedBlocks."""
        if opened != self._opened:
            raise self._fail("read-ahead: the blocks of a file asked for after another was opened")
        seed = None  # the caller's strings, where the read-ahead process does not hold them yet
        if strings is not None and (strings is not self._strings or len(strings) != self._mirrored):
            seed, self._strings, self._mirrored = list(strings), strings, len(strings)
        self._send(("go", strings is not None, seed))
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
                if strings is not None and kind == "tables":
                    _, raw, count, size, bad, end, names = message
                    yield DecodedBlock(count, size, self._tables(raw, names, strings), bad, end)
                    continue
                if strings is not None and kind == "slot_tables":
                    _, slot, shape, lengths, count, size, bad, end, names = message
                    raw = self._copied(slot, shape, lengths)
                    self._send(("free", slot))
                    yield DecodedBlock(count, size, self._tables(raw, names, strings), bad, end)
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

    def _copied(
        self, slot: int, shape: list[tuple[int, int]], lengths: list[int]
    ) -> list[RawTable]:
        """A slot's decoded tables, copied out of it at once (the slot is free again after
        this): views of one bytes object, each part where :func:`_offsets` put it."""
        offsets = _offsets(lengths)
        start = slot * self._slot_bytes
        whole = memoryview(bytes(self._view[start : start + offsets[-1]]))
        parts: list[Buffer] = [whole[at : at + n] for at, n in zip(offsets, lengths, strict=False)]
        raw: list[RawTable] = []
        i = 0
        for rows, n_values in shape:
            raw.append((rows, parts[i], parts[i + 1 : i + 1 + n_values], parts[i + 1 + n_values]))
            i += n_values + 2
        return raw

    def _tables(
        self, raw: list[RawTable], names: list[str], strings: dict[str, int]
    ) -> dict[str, Table]:
        """The tables of the read-ahead process's output; the strings it coded for them added
        to ``strings``, at the codes it gave them (its dict mirrors the caller's: only decoders
        add to such a dict, see :mod:`~peerwatch.schemas.columns`)."""
        assert self._decoder is not None
        if len(strings) != self._mirrored:
            raise self._fail("read-ahead: the strings dict changed while a file's blocks were read")
        for name in names:
            if strings.setdefault(name, len(strings)) != self._mirrored:
                raise self._fail(f"read-ahead: {name!r} already had another code")
            self._mirrored += 1
        return self._decoder.wrap(raw)

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


def _offsets(lengths: list[int]) -> list[int]:
    """Where the parts of a block's tables lie in a slot: each at a multiple of 8 bytes (so
    that a column read as int64s is aligned), and after them the end of the last one."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + (n + 7) // 8 * 8)
    if lengths:
        offsets[-1] = offsets[-2] + lengths[-1]
    return offsets


class _Forward(logging.Handler):
    """The read-ahead process's log records, sent to be logged by the reading process."""

    def __init__(self, conn: Any) -> None:
        super().__init__()
        self._conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        self._conn.send(("log", record.name, record.levelno, record.getMessage()))


def _reader_main(
    conn: Any, mem: mmap.mmap, slots: int, slot_bytes: int, decoder: ColumnDecoder | None
) -> None:
    """The read-ahead process: each opened file's header, then on ``go`` its blocks."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(_Forward(conn))
    try:
        _Server(conn, mem, slots, slot_bytes, decoder).serve()
    except (EOFError, BrokenPipeError):
        return  # the reading process ended or closed the pipe: nothing to tell
    except Exception as exc:  # told to the reading process, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


class _Server:
    """The read-ahead process's loop (module docstring)."""

    def __init__(self, conn: Any, mem: mmap.mmap, slots: int, slot_bytes: int,
                 decoder: ColumnDecoder | None) -> None:  # fmt: skip
        self.conn, self.mem, self.slot_bytes, self.decoder = conn, mem, slot_bytes, decoder
        self.free = list(range(slots))
        self.strings: dict[str, int] = {}  # the reading process's dict, mirrored
        self.sent = 0  # strings told to the reading process

    def serve(self) -> None:
        conn = self.conn
        blocks: Iterator[tuple[int, bytes]] | None = None
        stats = ReadStats()
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "quit":
                return
            if kind == "free":
                self.free.append(message[1])
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
                if message[2] is not None:  # the reading process's strings, to mirror
                    self.strings = {name: code for code, name in enumerate(message[2])}
                    self.sent = len(self.strings)
                send = self._send_decoded if message[1] else self._send_block
                for count, data in blocks:
                    if not send(count, data):
                        return
                blocks = None
                conn.send(("end", stats.as_dict()))
            else:
                raise RuntimeError(f"unknown message {kind!r}")

    def _slot(self) -> int | None:
        """A free slot, once one is handed back (None: told to quit meanwhile)."""
        while not self.free or self.conn.poll():  # the slots handed back so far
            reply = self.conn.recv()
            if reply[0] == "quit":
                return None
            if reply[0] != "free":
                raise RuntimeError(f"{reply[0]!r} while a file's blocks were sent")
            self.free.append(reply[1])
        return self.free.pop()

    def _send_block(self, count: int, data: bytes) -> bool:
        if len(data) > self.slot_bytes:
            self.conn.send(("bytes", count, data))
            return True
        slot = self._slot()
        if slot is None:
            return False
        self.mem[slot * self.slot_bytes : slot * self.slot_bytes + len(data)] = data
        self.conn.send(("slot", slot, count, len(data)))
        return True

    def _send_decoded(self, count: int, data: bytes) -> bool:
        if self.decoder is None:
            raise RuntimeError("decoded blocks asked for with no decoder")
        raw, bad, end = self.decoder.block_raw(data, 0, count, self.strings)
        names = list(self.strings)[self.sent :] if len(self.strings) > self.sent else []
        self.sent = len(self.strings)
        parts = [b for _, parent, values, valid in raw for b in (parent, *values, valid)]
        lengths = [len(b) for b in parts]
        offsets = _offsets(lengths)
        if offsets[-1] > self.slot_bytes:
            self.conn.send(("tables", raw, count, len(data), bad, end, names))
            return True
        slot = self._slot()
        if slot is None:
            return False
        base = slot * self.slot_bytes
        for part, at in zip(parts, offsets, strict=False):
            self.mem[base + at : base + at + len(part)] = part
        shape = [(rows, len(values)) for rows, _, values, _ in raw]
        self.conn.send(("slot_tables", slot, shape, lengths, count, len(data), bad, end, names))
        return True
