"""The stage 2 -> 3 window-batch message (schema ``WindowBatch``) and the scored GpuWindow
records stage 3 writes from it.

The hot stage sends, per job and window, one ``WindowBatch``: every samples partition's
(source's) GpuWindows of that window, each a GpuWindow record in Avro single-object encoding
with ``step_ms``, ``score`` and ``gated`` still null. Stage 3 decodes them with the schema's C
reader (JSON was the largest item of its time before) and writes each scored window back out.

Writing a scored window re-encodes only its tail. An Avro record is the concatenation of its
fields' encodings, in schema order, and stage 3 sets only :data:`STAGE3_FIELDS`: the bytes of
every field before the first of them are the hot stage's own bytes, unchanged. So a scored
record is the received message up to that field (its *head*) followed by the encoding of the
fields from there on (its *tail*), made from the scored dict. The head is kept only when the
received message ends with exactly the tail the decoded dict re-encodes to (current schema,
canonical bytes); otherwise the whole record is encoded, with the same result. Tests check
head + tail equals the whole encoding, field by field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from peerwatch.schemas import registry
from peerwatch.schemas.codec import HEADER_LEN, MAGIC, AvroCodec
from peerwatch.schemas.compiled import compile_encoder
from peerwatch.schemas.records import GpuWindow
from peerwatch.streams.core.window_dicts import LazyWindows

#: The GpuWindow fields stage 3 sets; every field from the first of them on is re-encoded.
STAGE3_FIELDS = ("step_ms", "score", "gated")

#: (node, GPU index): a window's GPU inside one job and window.
GpuIdent = tuple[str, int]

#: A job's window goes to stage 3 in messages of at most about this size, whole samples
#: partitions (sources) each: well under Kafka's default 1 MB record limit. A GpuWindow is about
#: 190 bytes, so one message holds some 2,700 GPUs; a 16,000-GPU job's window is a few messages.
MAX_BATCH_BYTES = 512 * 1024


def is_window_batch(value: bytes | bytearray) -> bool:
    """Whether a stage 2 -> 3 message is Avro (a WindowBatch); older workers sent JSON."""
    return value[: len(MAGIC)] == MAGIC


class WindowBatchCodec:
    """Encode and decode WindowBatch messages; write scored GpuWindows from their heads."""

    def __init__(self) -> None:
        self.windows = AvroCodec("GpuWindow")
        self.batches = AvroCodec("WindowBatch")
        self._header = MAGIC + self.windows.fingerprint
        wire: dict[str, Any] = registry.strip_logical_types(registry.raw_schema("GpuWindow"))  # type: ignore[assignment]
        fields: list[dict[str, Any]] = wire["fields"]
        first = min(i for i, f in enumerate(fields) if f["name"] in STAGE3_FIELDS)
        #: The names of the tail's fields, in schema order.
        self.tail_fields: tuple[str, ...] = tuple(f["name"] for f in fields[first:])
        tail = {"type": "record", "name": "GpuWindowTail", "fields": fields[first:]}
        self._tail = compile_encoder(tail)
        self._body = self.windows.compiled_decoder

    # -- hot stage ------------------------------------------------------------------------------
    def encode_batch(
        self,
        job_id: str,
        window_start_ms: int,
        window_end_ms: int,
        parts: Mapping[int, Sequence[Mapping[str, Any]]],
        closed_wall_ms: float | None,
    ) -> bytes:
        """One WindowBatch, whatever its size: ``parts`` is source -> its GpuWindow dicts.
        Raises EncodeError (naming the field) for a window that does not fit the schema."""
        [value] = self.encode_batches(
            job_id, window_start_ms, window_end_ms, parts, closed_wall_ms, max_bytes=1 << 62
        )
        return value

    def encode_batches(
        self,
        job_id: str,
        window_start_ms: int,
        window_end_ms: int,
        parts: Mapping[int, Sequence[Mapping[str, Any]]],
        closed_wall_ms: float | None,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> list[bytes]:
        """:meth:`encode_batch` in as few messages as keep each under ``max_bytes``, whole
        sources each, in source order (stage 3 keeps one pending entry per message under its
        first source, so a source never spans two). A source larger than ``max_bytes`` goes
        alone. Raises EncodeError as :meth:`encode_batch`."""
        encoded = [(src, self._messages(parts[src])) for src in sorted(parts)]
        chunks: list[list[tuple[int, list[bytes]]]] = [[]]
        size = 0
        for src, windows in encoded:
            src_bytes = sum(len(w) + 3 for w in windows) + 8  # length prefixes, block counts
            if chunks[-1] and size + src_bytes > max_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append((src, windows))
            size += src_bytes
        return [
            self.batches.encode(
                {
                    "job_id": job_id,
                    "window_start_ms": window_start_ms,
                    "window_end_ms": window_end_ms,
                    "closed_wall_ms": closed_wall_ms,
                    "parts": [{"source": src, "windows": ws} for src, ws in chunk],
                }
            )
            for chunk in chunks
        ]

    def _messages(self, windows: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """Each window's GpuWindow message: the aggregator's lazy windows from their columns,
        no dict made (:meth:`~peerwatch.streams.core.window_dicts.LazyWindows.encoded`); other
        windows, or a value the columns cannot encode, record by record (whose encoder names a
        field at fault: EncodeError)."""
        if isinstance(windows, LazyWindows):
            got = windows.encoded(self._header)
            if got is not None:
                return got
        encode = self.windows.encode
        return [encode(w) for w in windows]

    # -- stage 3 --------------------------------------------------------------------------------
    def decode_batch(
        self, value: bytes
    ) -> tuple[dict[str, Any], dict[int, list[tuple[GpuIdent, bytes | None]]]]:
        """A WindowBatch as the message :func:`~peerwatch.streams.core.job_stage.batches_of_message`
        reads (``parts``: source -> GpuWindow dicts), and per source the (GPU, head) of each of
        its windows, in order (head None: that window is encoded whole when scored).

        Raises CodecError for undecodable bytes and ValueError for a window of another job or
        window than its batch, or a batch without windows."""
        batch = self.batches.decode(value)
        job_id, start, end = batch["job_id"], batch["window_start_ms"], batch["window_end_ms"]
        parts: dict[int, list[dict[str, Any]]] = {}
        heads: dict[int, list[tuple[GpuIdent, bytes | None]]] = {}
        decode = self._decode_window
        for part in batch["parts"]:
            src = part["source"]
            windows, src_heads = parts.setdefault(src, []), heads.setdefault(src, [])
            for message in part["windows"]:
                w = decode(message)
                if w["job_id"] != job_id or w["window_start_ms"] != start:
                    raise ValueError(
                        f"window batch of job {job_id!r} at {start} holds a window of job "
                        f"{w['job_id']!r} at {w['window_start_ms']}"
                    )
                if w["window_end_ms"] != end:
                    raise ValueError(f"window batch ending at {end}: a window ends at "
                                     f"{w['window_end_ms']}")  # fmt: skip
                windows.append(w)
                src_heads.append(((w["node"], w["gpu_index"]), self._head(message, w)))
        if not parts or not all(parts.values()):
            raise ValueError("window batch without parts, or a part without windows")
        message = {
            "kind": "windows", "job_id": job_id, "window_start_ms": start,
            "window_end_ms": end, "closed_wall_ms": batch["closed_wall_ms"], "parts": parts,
        }  # fmt: skip
        return message, heads

    def _decode_window(self, message: bytes) -> dict[str, Any]:
        """One GpuWindow message: the compiled reader straight away for the current schema (the
        codec's checks around it cost as much as the C reader itself), else the codec."""
        body = self._body
        if body is None or message[:HEADER_LEN] != self._header:
            return self.windows.decode(message)
        try:
            window, end = body(message, HEADER_LEN)
        except Exception:  # the codec below names what is wrong with these bytes
            return self.windows.decode(message)
        if end != len(message):
            return self.windows.decode(message)  # raises CorruptRecordError (trailing bytes)
        return window  # type: ignore[no-any-return]

    def _head(self, message: bytes, window: Mapping[str, Any]) -> bytes | None:
        """The bytes of ``message`` before its tail, None when they cannot be reused (another
        schema version, or a tail not in canonical form)."""
        if message[:HEADER_LEN] != self._header:
            return None
        try:
            tail: bytes = self._tail(window)
        except (TypeError, KeyError, ValueError, OverflowError):
            return None
        if not message.endswith(tail):
            return None
        return message[: len(message) - len(tail)]

    def scored(self, head: bytes | None, window: GpuWindow) -> bytes:
        """The GpuWindow message of a scored ``window`` whose received message had ``head``
        (None: encoded whole). Raises EncodeError for a value that does not fit."""
        if head is not None:
            try:
                return head + self._tail(window)
            except (TypeError, KeyError, ValueError, OverflowError):
                pass  # the whole encoding below names the field at fault
        return self.windows.encode(window)
