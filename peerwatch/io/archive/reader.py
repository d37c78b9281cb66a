"""Reading the archive's Avro object container files (every codec), block by block.

Each file embeds its writer schema; records are decoded by the codec's generated reader or, for
whole blocks of samples, handed on raw (:func:`raw_blocks`) to the C column decoder. A file whose
last block is truncated (an archiver killed mid-write) is read up to its last complete block; a
corrupt block or record is skipped and counted (:class:`~.layout.ReadStats`), never a crash.
"""

from __future__ import annotations

import importlib
import io
import logging
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from peerwatch.io.archive.layout import ReadStats, archive_files
from peerwatch.schemas.registry import current_schema, strip_logical_types

log = logging.getLogger(__name__)


#: The most header bytes a container file may have (its schema is a few KB): a size in the
#: header that reaches beyond is a corrupt header, never a read of that size.
MAX_HEADER_BYTES = 1 << 24


def _canonical(schema: Any) -> str:
    return str(to_parsing_canonical_form(schema))


def in_current_version(path: Path, reader_schema: Any) -> bool:
    """Whether a container file's header is readable and names ``reader_schema`` (read by the
    compiled reader, which skips a bad record and goes on; a file of another schema version is
    read by fastavro, which ends at its first fault). Raises OSError when the file cannot be
    opened."""
    with Path(path).open("rb") as fh:
        try:
            writer_schema = fastavro.block_reader(fh).writer_schema
        except Exception:  # an unreadable header: read_file judges and counts it
            return False
    return _canonical(writer_schema) == _canonical(reader_schema)


def read_file(
    path: Path,
    reader_schema: Any = None,
    keep_nodes: frozenset[str] | None = None,
    stats: ReadStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Every record of one container file. A truncated or corrupt tail (a writer killed
    mid-block) ends the file with a warning instead of an error: what precedes it is intact.
    ``keep_nodes``, ``stats``: see :func:`read_container`."""
    with Path(path).open("rb") as fh:
        yield from read_container(fh, reader_schema, str(path), keep_nodes, stats)


def read_container(
    fh: IO[bytes],
    reader_schema: Any = None,
    what: str = "",
    keep_nodes: frozenset[str] | None = None,
    stats: ReadStats | None = None,
) -> Iterator[dict[str, Any]]:
    """Like :func:`read_file` on an open binary file (``what`` names it in warnings).

    ``keep_nodes``: for records whose first field is the string ``node`` (NodeGpuSample),
    only those of these nodes are decoded and returned; the others are stepped over without
    being built (the C reader's ``skip``, else a decode that is thrown away).

    Hostile bytes, with the current schema (the compiled reader): a record that does not decode
    is skipped and counted in ``stats.bad_records`` (that record only where its end is known,
    see :func:`lenient_skipper`; else the rest of its block, as the column reader does); a
    corrupt block is stepped over
    to the next sync marker (``stats.bad_blocks``). Files of an older schema version (fastavro,
    with resolution) end at the first fault."""
    stats = stats if stats is not None else ReadStats()
    try:
        blocks = fastavro.block_reader(fh)
        # Schema resolution halves fastavro's speed: only resolve when the file was written
        # with another version of the schema.
        if reader_schema is not None and _canonical(blocks.writer_schema) != _canonical(
            reader_schema
        ):
            fh.seek(0)
            blocks = fastavro.block_reader(fh, reader_schema=reader_schema)
    except Exception as exc:  # a header cut short: nothing durable was in this file yet
        log.warning("%s: unreadable header (%s), skipped", what, exc)
        stats.bad_files += 1
        return
    # Same schema as the current one: decode each block with the codec's compiled reader (about
    # twice fastavro's speed on wide records); else fastavro (resolution of older versions).
    compiled = _compiled_for(blocks.writer_schema) if blocks.reader_schema is None else None
    inflate = _inflater(str(blocks.codec))
    if compiled is not None and inflate is not None:
        skip = None
        if keep_nodes is not None and _node_first(blocks.writer_schema):
            skip = _skipper_for(blocks.writer_schema, compiled)
        lax = lenient_skipper(blocks.writer_schema)
        try:
            fh.seek(0)
            header_end, sync = _read_header(fh)
        except ValueError as exc:
            log.warning("%s: unreadable header (%s), skipped", what, exc)
            stats.bad_files += 1
            return
        for count, data in _blocks(fh, header_end, sync, inflate, what, stats):
            try:
                records, bad = _decode_block(compiled, data, count, keep_nodes, skip, lax)
            except TrailingBytes as exc:  # the records read are kept; the block counts as bad
                records, bad = exc.records, exc.bad
                stats.bad_blocks += 1
                log.warning("%s: %s ignored", what, exc)
            if bad:
                stats.bad_records += bad
                log.warning("%s: %d record(s) of a block skipped (undecodable)", what, bad)
            yield from records
        return
    while True:
        try:
            block = next(blocks)
            records = list(block)  # type: ignore[arg-type]
            if keep_nodes is not None and _node_first(blocks.writer_schema):
                records = [r for r in records if r.get("node") in keep_nodes]
        except StopIteration:
            return
        # fastavro reports a cut block as EOFError, zlib.error, ValueError...: all mean
        # "the writer died here"; the blocks before are checked by their sync markers.
        except Exception as exc:
            log.warning("%s: truncated tail ignored (%s: %s)", what, type(exc).__name__, exc)
            stats.cut_tails += 1
            return
        yield from records


def _compiled_for(writer_schema: Any) -> Any:
    """The compiled body reader of the current schema whose canonical form equals the file's
    writer schema, or None."""
    from peerwatch.schemas.codec import codec_for
    from peerwatch.schemas.registry import SCHEMA_NAMES

    name = (
        str(writer_schema.get("name", "")).rsplit(".", 1)[-1]
        if isinstance(writer_schema, dict)
        else ""
    )
    if name not in SCHEMA_NAMES:
        return None
    codec = codec_for(name)
    if _canonical(codec.schema) != _canonical(writer_schema):
        return None
    return codec.compiled_decoder


def _node_first(writer_schema: Any) -> bool:
    fields: Any = writer_schema.get("fields") if isinstance(writer_schema, dict) else None
    if not fields:
        return False
    return bool(fields[0].get("name") == "node" and fields[0].get("type") == "string")


def _skipper_for(writer_schema: Any, decode: Any) -> Any:
    """``(buffer, offset) -> end`` over one record: the C skip, or decode-and-drop."""
    from peerwatch.schemas.native import native_skipper

    skip = native_skipper(strip_logical_types(writer_schema))
    if skip is not None:
        return skip
    return lambda data, pos: decode(data, pos)[1]


def _decode_block(
    decode: Any,
    data: bytes,
    count: int,
    keep: frozenset[str] | None = None,
    skip: Any = None,
    lax: Any = None,
) -> tuple[list[dict[str, Any]], int]:
    """The records of one block and how many were not read; with ``keep`` and ``skip``, only
    those whose leading ``node`` string is in ``keep`` (the others are stepped over by
    ``skip``). A record that does not decode is stepped over by ``lax`` (see
    :func:`lenient_skipper`: it steps over invalid UTF-8, boolean bytes above 1 and longs over
    64 bits) and the next read; where ``lax`` refuses too (the record's end is not known), the
    block ends (its remaining records count as not read): the same records as the C column
    reader keeps, whatever faults a record holds and in whatever order. Raises TrailingBytes
    (with what was read) when the block holds bytes after its ``count`` records."""
    out: list[dict[str, Any]] = []
    pos = bad = 0
    for i in range(count):
        try:
            if keep is not None and skip is not None:
                n, start = _varint(data, pos)
                if n < 0 or start + n > len(data):
                    raise ValueError("bad node length")
                if data[start : start + n].decode() not in keep:
                    pos = skip(data, pos)
                    continue
            record, pos = decode(data, pos)
        except Exception:
            if lax is None:
                return out, bad + count - i
            try:
                pos = lax(data, pos)
            except (ValueError, IndexError):
                return out, bad + count - i
            bad += 1
            continue
        out.append(record)
    if pos != len(data):  # a count too small: records were left unread (how many is unknown)
        raise TrailingBytes(out, bad, len(data) - pos)
    return out, bad


class TrailingBytes(ValueError):
    """A block held bytes after its last record: what was read, and how many bytes were not."""

    def __init__(self, records: list[dict[str, Any]], bad: int, left: int) -> None:
        super().__init__(f"{left} trailing bytes in a block")
        self.records, self.bad, self.left = records, bad, left


def lenient_skipper(writer_schema: Any) -> Any:
    """``(buffer, offset) -> end`` over one value of ``writer_schema`` stepping over the value
    faults whose extent is known: the C module's ``skip_lenient`` (what ``decode_columns``
    steps over in a block), else :func:`lax_skipper` (the same rules in Python). Raises
    ValueError (or IndexError) where the value's end is not known."""
    from peerwatch.schemas.native import native_lenient_skipper

    return native_lenient_skipper(strip_logical_types(writer_schema)) or lax_skipper(writer_schema)


def lax_skipper(writer_schema: Any) -> Any:
    """``(buffer, offset) -> end`` over one value of ``writer_schema`` that checks lengths,
    counts, union branches and enum indexes (varints of at most 64 bits, one-byte union
    branches, as the C reader) but not the values whose extent is known: invalid UTF-8, a
    boolean byte above 1, a long whose varint ends at its 10th byte without fitting 64 bits.
    Where a record that did not decode ends. Raises ValueError (or IndexError) on bytes that
    are not such a value."""
    named: dict[str, Any] = {}

    def plan(schema: Any) -> Any:
        if isinstance(schema, str):
            if schema in ("null",):
                return lambda d, p: p
            if schema == "boolean":
                return lambda d, p: _need(d, p + 1)
            if schema in ("int", "long"):
                return _lax_long
            if schema == "float":
                return lambda d, p: _need(d, p + 4)
            if schema == "double":
                return lambda d, p: _need(d, p + 8)
            if schema in ("string", "bytes"):
                return _skip_bytes
            return lambda d, p: named[schema](d, p)
        if isinstance(schema, list):
            branches = [plan(b) for b in schema]

            def union(d: bytes, p: int) -> int:
                c = d[p]  # one byte, as the C reader takes a branch index
                k, p = (c >> 1) ^ -(c & 1), p + 1
                if c >= 0x80 or not 0 <= k < len(branches):
                    raise ValueError("bad union branch")
                return int(branches[k](d, p))

            return union
        kind = schema["type"]
        if kind == "record":
            fields = []
            name = schema.get("name", "")
            named[name] = named[name.rsplit(".", 1)[-1]] = lambda d, p: rec(d, p)
            fields = [plan(f["type"]) for f in schema["fields"]]

            def rec(d: bytes, p: int) -> int:
                for f in fields:
                    p = f(d, p)
                return p

            return rec
        if kind == "enum":
            n = len(schema["symbols"])

            def enum(d: bytes, p: int) -> int:
                k, p = _varint64(d, p)
                if not 0 <= k < n:
                    raise ValueError("bad enum index")
                return p

            named[schema.get("name", "")] = enum
            return enum
        if kind == "fixed":
            size = int(schema["size"])
            return lambda d, p: _need(d, p + size)
        if kind in ("array", "map"):
            item = plan(schema["items"] if kind == "array" else schema["values"])
            key = _skip_bytes if kind == "map" else None

            def many(d: bytes, p: int) -> int:
                while True:
                    n, p = _varint64(d, p)
                    if n == 0:
                        return p
                    if n < 0:
                        _, p = _varint64(d, p)
                        n = -n
                    if n > len(d) - p:  # every item takes a byte at least... or none (null)
                        raise ValueError("bad item count")
                    for _ in range(n):
                        if key is not None:
                            p = key(d, p)
                        p = item(d, p)

            return many
        return plan(kind)

    return plan(strip_logical_types(writer_schema))


def _need(data: bytes, end: int) -> int:
    if end > len(data):
        raise ValueError("value cut short")
    return end


def _varint64(data: bytes, pos: int) -> tuple[int, int]:
    """:func:`_varint` of at most 64 bits, as the C reader's: raises ValueError when a 10th
    byte is above 1 (IndexError when ``data`` ends inside it)."""
    for k in range(10):
        if data[pos + k] < 0x80:
            if k == 9 and data[pos + k] > 1:
                break
            return _varint(data, pos)
    raise ValueError("varint does not fit 64 bits")


def _lax_long(data: bytes, pos: int) -> int:
    """The end of a long value: a varint ending at its 10th byte is stepped over even when it
    does not fit 64 bits (a value fault whose extent is known)."""
    try:
        return _varint64(data, pos)[1]
    except ValueError:
        if data[pos + 9] < 0x80:
            return pos + 10
        raise


def _skip_bytes(data: bytes, pos: int) -> int:
    n, pos = _varint64(data, pos)
    if n < 0:
        raise ValueError("negative length")
    return _need(data, pos + n)


def read_archive(
    root: Path,
    topic: str,
    schema_name: str,
    from_ms: int | None = None,
    to_ms: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Every record of ``topic`` under ``root``, in file (hour) order; times as int ms.

    ``from_ms``/``to_ms`` select the files whose hour overlaps the range (records are not
    filtered: a caller that needs exact bounds checks :func:`record_time_ms`).
    """
    reader_schema = current_schema(schema_name)
    for path in archive_files(root, topic, from_ms, to_ms):
        yield from read_file(path, reader_schema)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint long at ``pos``; returns (value, next position). Raises IndexError when
    ``data`` ends inside it."""
    shift = result = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


class HeaderCut(ValueError):
    """The bytes end inside a container header (more of the file may complete it)."""


def _header(data: bytes) -> tuple[int, bytes]:
    """(end of the header, sync marker) of a container file's first bytes. Raises HeaderCut
    when ``data`` ends inside its header, ValueError when it is not an Avro container or its
    header cannot be one (a negative size or count, a size beyond MAX_HEADER_BYTES)."""
    if data[:4] != b"Obj\x01":
        raise ValueError("not an Avro object container file")
    pos = 4
    try:
        while True:  # the metadata map: blocks of (key, value) pairs, 0 ends it
            count, pos = _varint(data, pos)
            if count == 0:
                break
            if count < 0:
                _, pos = _varint(data, pos)
                count = -count
            if count > MAX_HEADER_BYTES:
                raise ValueError(f"corrupt Avro header: {count} metadata entries")
            for _ in range(2 * count):
                size, pos = _varint(data, pos)
                if size < 0 or pos + size > MAX_HEADER_BYTES:
                    raise ValueError(f"corrupt Avro header: a metadata size of {size}")
                pos += size
    except IndexError as exc:
        raise HeaderCut("truncated Avro header") from exc
    if pos + 16 > len(data):
        raise HeaderCut("truncated Avro header")
    return pos + 16, data[pos : pos + 16]


def _read_header(fh: IO[bytes]) -> tuple[int, bytes]:
    """:func:`_header` of an open file (at its start), reading only as much as the header
    needs (at most MAX_HEADER_BYTES). Raises ValueError as :func:`_header` does."""
    head = fh.read(1 << 16)
    while True:
        try:
            return _header(head)
        except HeaderCut:
            more = fh.read(1 << 20) if len(head) < MAX_HEADER_BYTES + 16 else b""
            if not more:
                raise
            head += more


def block_spans(data: bytes, stats: ReadStats | None = None) -> tuple[int, list[tuple[int, int]]]:
    """Layout of a container file's bytes: (end of the header, [(start, end) of each complete
    block]). A corrupt block (a count or size no block could have, or no sync marker where its
    size ends) is left out: the next block is found by the sync marker after it, counted in
    ``stats.bad_blocks``; with no sync marker after it, it is a cut tail (``stats.cut_tails``).
    Raises ValueError when ``data`` is not an Avro container."""
    header_end, sync = _header(data)
    spans, pos = [], header_end
    while pos < len(data):
        try:
            count, p = _varint(data, pos)
            size, p = _varint(data, p)
        except IndexError:
            count = size = p = -1
        end = p + size + 16
        if count >= 0 and size >= 0 and end <= len(data) and data[end - 16 : end] == sync:
            spans.append((pos, end))
            pos = end
            continue
        found = data.find(sync, pos)
        if found < 0:
            if stats is not None:
                stats.cut_tails += 1
            break
        log.warning("corrupt block at byte %d skipped to the next sync marker", pos)
        if stats is not None:
            stats.bad_blocks += 1
        pos = found + 16
    return header_end, spans


def _file_varint(fh: IO[bytes]) -> int | None:
    """A zigzag varint long read from ``fh``; None when the file ends inside it (or at once)."""
    shift = result = 0
    while True:
        b = fh.read(1)
        if not b:
            return None
        result |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return (result >> 1) ^ -(result & 1)
        shift += 7


def _zstd() -> Any:
    try:  # the standard library from Python 3.14, else the backport (a dependency)
        return importlib.import_module("compression.zstd")
    except ImportError:
        return importlib.import_module("backports.zstd")


#: A zstandard block whose frame header states at most this many bytes is decompressed into
#: one buffer of that size (python-zstandard, about three times the backport's speed here);
#: a larger or unstated size goes through the backport, which grows its buffer as it goes (a
#: damaged header cannot make either allocate more than this, or more than the data gives).
ZSTD_ONE_BUFFER_MAX_BYTES = 64 << 20


def _zstd_decompress() -> Any:
    fallback = _zstd().decompress
    try:
        import zstandard
    except ImportError:  # an optional speed-up
        return fallback

    def decompress(data: bytes) -> bytes:
        # One frame of a stated, bounded size (what the archiver writes); anything else (more
        # frames, no size, damage) is the backport's to decompress or refuse, as before.
        try:
            size = zstandard.frame_content_size(data)
            if 0 <= size <= ZSTD_ONE_BUFFER_MAX_BYTES:
                out: bytes = zstandard.ZstdDecompressor().decompress(data, allow_extra_data=False)
                return out
        except zstandard.ZstdError:
            pass
        return bytes(fallback(data))

    return decompress


def _inflater(codec: str) -> Any:
    if codec == "null":
        return bytes
    if codec == "deflate":
        return lambda data: zlib.decompress(data, -15)
    if codec == "zstandard":
        return _zstd_decompress()
    return None


def raw_blocks(
    path: Path, stats: ReadStats | None = None
) -> tuple[Any, Iterator[tuple[int, bytes]]]:
    """The writer schema of a container file and its blocks, ``(record count, decompressed
    bytes)``, undecoded (the null, deflate and zstandard codecs), read one block at a time
    (memory: a block). A corrupt block is skipped to the next sync marker and the iterator ends
    at a cut tail, with a warning and counted in ``stats`` (see :func:`block_spans`). Raises
    ValueError for a file that is not a container or has another codec (read it with
    :func:`read_file`)."""
    fh = Path(path).open("rb")  # noqa: SIM115 - closed by the blocks iterator (or at GC)
    try:
        header_end, sync = _read_header(fh)
        fh.seek(0)
        header = fastavro.block_reader(io.BytesIO(fh.read(header_end)))
        inflate = _inflater(str(header.codec))
        if inflate is None:
            raise ValueError(f"codec {header.codec!r}")
    except Exception as exc:
        fh.close()
        raise ValueError(f"{path}: {exc}") from exc

    def blocks() -> Iterator[tuple[int, bytes]]:
        with fh:
            yield from _blocks(fh, header_end, sync, inflate, str(path), stats)

    return header.writer_schema, blocks()


def _blocks(fh: IO[bytes], header_end: int, sync: bytes, inflate: Any, what: str,
            stats: ReadStats | None) -> Iterator[tuple[int, bytes]]:  # fmt: skip
    """The ``(count, decompressed bytes)`` of each block of an open container file after its
    header; a corrupt block is stepped over to the next sync marker (see :func:`raw_blocks`)."""
    file_bytes = fh.seek(0, io.SEEK_END)
    fh.seek(header_end)
    while True:
        at = fh.tell()
        count = _file_varint(fh)
        if count is None and fh.tell() == at:
            return  # the end of the file, between blocks
        size = _file_varint(fh) if count is not None else None
        # A size or count no block of the file could have (negative, or beyond the bytes
        # left: a corrupted varint) is a corrupt block, never a read of that size.
        fits = size is not None and 0 <= size <= file_bytes - fh.tell()
        fault = None
        if count is None or not 0 <= count < 1 << 62 or not fits:
            fault = "corrupt block header"
        else:
            assert size is not None and count is not None
            payload = fh.read(size)
            if len(payload) != size or fh.read(16) != sync:
                fault = "no sync marker after the block"
            else:
                try:
                    data = inflate(payload)
                except Exception as exc:
                    fault = f"corrupt block ({type(exc).__name__}: {exc})"
        if fault is None:
            assert count is not None
            yield count, data
            continue
        after = _next_sync(fh, sync, at)
        if after is None:
            log.warning("%s: truncated tail ignored (%s at byte %d)", what, fault, at)
            if stats is not None:
                stats.cut_tails += 1
            return
        log.warning("%s: %s at byte %d, skipped to the next sync marker", what, fault, at)
        if stats is not None:
            stats.bad_blocks += 1
        fh.seek(after)


def _next_sync(fh: IO[bytes], sync: bytes, start: int) -> int | None:
    """The position just after the first ``sync`` at or after ``start``, or None (read in
    1 MiB pieces: memory stays bounded)."""
    fh.seek(start)
    carry = b""
    base = start
    while True:
        piece = fh.read(1 << 20)
        if not piece:
            return None
        window = carry + piece
        found = window.find(sync)
        if found >= 0:
            return base + found + len(sync)
        keep = len(sync) - 1
        base += len(window) - keep
        carry = window[-keep:]


def split_file(path: Path, max_bytes: int, stats: ReadStats | None = None) -> list[bytes]:
    """The file cut into self-contained container files of about ``max_bytes`` of blocks each
    (its header + consecutive blocks: the sync marker is the same throughout), so that parts
    decode in parallel. A cut tail and corrupt blocks are left out (counted in ``stats``, see
    :func:`block_spans`). Raises ValueError for a non-container file."""
    data = Path(path).read_bytes()
    header_end, spans = block_spans(data, stats)
    parts: list[bytes] = []
    start = last = None
    for s, e in spans:
        if start is not None and s != last:  # a corrupt block left out: never inside a part
            parts.append(data[:header_end] + data[start:last])
            start = None
        if start is None:
            start = s
        last = e
        if e - start >= max_bytes:
            parts.append(data[:header_end] + data[start:e])
            start = None
    if start is not None:
        parts.append(data[:header_end] + data[start:last])
    return parts
