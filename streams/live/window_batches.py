"""The stage 2 -> 3 window-batch message (schema ``WindowBatch``) and the scored GpuWindow
records stage 3 writes from it.

The hot stage sends, per job and window, one ``WindowBatch``: every samples partition's
(source's) windows of that window, each part as columns (``WindowColumnsPart``): the
aggregator's per-window accumulators, little-endian arrays, one value per window. Stage 3
rebuilds the aggregator's :class:`~peerwatch.streams.core.windows.ClosedWindows` from them and
makes the job's windows and the detector's columns with the same code as replay
(:meth:`~peerwatch.streams.core.windows.ClosedWindows.by_job`): no GpuWindow dict or record
exists between the stages, and live and replay read the same arrays. A scored GpuWindow is
encoded from the columns with its ``score`` and ``gated`` (:meth:`WindowBatchCodec.scored`).

Parts written by older workers (the previous version: one Avro GpuWindow record per window)
are still read, as dicts, e.g. from a pending table written before an upgrade.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from peerwatch.schemas.codec import HEADER_LEN, MAGIC, AvroCodec
from peerwatch.streams.core.detector import ScoredValues
from peerwatch.streams.core.loops import COUNTS, DELTAS, SUMS
from peerwatch.streams.core.window_dicts import LazyWindows
from peerwatch.streams.core.windows import ClosedWindows, ColumnsBatch, merge_closed

#: The GpuWindow fields stage 3 sets.
STAGE3_FIELDS = ("step_ms", "score", "gated")

#: (node, GPU index): a window's GPU inside one job and window.
GpuIdent = tuple[str, int]

#: A job's window goes to stage 3 in messages of at most about this size, whole samples
#: partitions (sources) each: well under Kafka's default 1 MB record limit. A window's
#: accumulators are about 300 bytes, so one message holds some 1,700 GPUs; a 16,000-GPU job's
#: window is a few messages.
MAX_BATCH_BYTES = 512 * 1024

#: The accumulators a part carries (the aggregator's, see ``windows._Bucket``).
INT_NAMES = (*COUNTS, *DELTAS)
FLOAT_NAMES = SUMS
#: Windows one part may say it holds (a bound on what a hostile message makes us allocate).
MAX_PART_ROWS = 1 << 20


def is_window_batch(value: bytes | bytearray) -> bool:
    """Whether a stage 2 -> 3 message is Avro (a WindowBatch); older workers sent JSON."""
    return value[: len(MAGIC)] == MAGIC


def older_json(message: Mapping[str, Any]) -> bytes:
    """A decoded batch (:meth:`WindowBatchCodec.decode_batch`) in the JSON form of older
    workers, which stage 3 still reads: the columns' windows as dicts, under their first
    source (the fuzzer and the stage-3 benchmark feed both forms)."""
    parts = {str(src): ws for src, ws in message["parts"].items()}
    batch = message.get("batch")
    if batch is not None:
        parts[str(min(message["sources"]))] = list(batch.batch().windows)
    plain = {k: v for k, v in message.items() if k not in ("batch", "sources")}
    return json.dumps({**plain, "parts": parts}).encode()


def job_parts(closed: ClosedWindows) -> dict[str, dict[str, Any]]:
    """Each job's windows in ``closed`` (one source's closed window start) as a
    ``WindowColumnsPart`` record: job id -> record."""
    a = closed.accs
    if not len(a["job"]):
        return {}
    order = np.argsort(a["job"], kind="stable")
    codes = a["job"][order]
    cuts = (np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist()
    ints = np.stack([a[k] for k in INT_NAMES]).astype("<i8", copy=False)
    floats = np.stack([a[k] for k in FLOAT_NAMES]).astype("<f8", copy=False)
    row_of = None
    if closed.xids:
        row_of = np.full(len(codes), -1, np.int64)
    out = {}
    for lo, hi in zip([0, *cuts], [*cuts, len(codes)], strict=True):
        slots = order[lo:hi]
        job_id, user, partition, account = closed.jobs[int(codes[lo])]
        node, uuid = closed.node[slots], a["uuid"][slots]
        used = np.unique(np.concatenate([node, uuid]))
        used = used[used >= 0]
        local_uuid = np.where(uuid >= 0, np.searchsorted(used, uuid), -1)
        xids = []
        if row_of is not None:
            row_of[slots] = np.arange(len(slots))
            xids = [{"row": int(row_of[s]), "xids": list(x)}
                    for s, x in sorted(closed.xids.items()) if row_of[s] >= 0 and x]  # fmt: skip
            row_of[slots] = -1
        out[job_id] = {
            "rows": len(slots),
            "names": [closed.names[c] for c in used.tolist()],
            "node": np.searchsorted(used, node).astype("<i4").tobytes(),
            "gpu_index": closed.gpu_index[slots].astype("<i4").tobytes(),
            "uuid": local_uuid.astype("<i4").tobytes(),
            "user": user, "partition": partition, "account": account,
            "int_names": list(INT_NAMES),
            "ints": ints[:, slots].tobytes(),
            "float_names": list(FLOAT_NAMES),
            "floats": floats[:, slots].tobytes(),
            "xids": xids,
        }  # fmt: skip
    return out


def _part_size(part: Mapping[str, Any]) -> int:
    """About the encoded size of a part record (bytes)."""
    names = sum(len(n) + 2 for n in part["names"])
    arrays = sum(len(part[k]) for k in ("node", "gpu_index", "uuid", "ints", "floats"))
    return names + arrays + 16 * len(part["xids"]) + 64


def _array(raw: bytes, dtype: str, shape: tuple[int, ...], what: str) -> np.ndarray:
    """``raw`` as an array of ``shape``; ValueError when its length does not fit."""
    want = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if len(raw) != want:
        raise ValueError(f"window columns: {what} holds {len(raw)} bytes, not {want}")
    return np.frombuffer(raw, dtype).reshape(shape)


def _rows(raw: bytes, names: Sequence[str], wanted: Sequence[str], dtype: str, n: int,
          what: str) -> dict[str, np.ndarray]:  # fmt: skip
    """The accumulators ``wanted`` from a matrix of one row per name in ``names``."""
    missing = sorted(set(wanted) - set(names))
    if missing:
        raise ValueError(f"window columns: {what} lacks {', '.join(missing)}")
    if len(set(names)) != len(names):
        raise ValueError(f"window columns: {what} names an accumulator twice")
    matrix = _array(raw, dtype, (len(names), n), what).astype(dtype.lstrip("<"))
    at = {name: i for i, name in enumerate(names)}
    return {name: matrix[at[name]] for name in wanted}


def closed_of_part(
    job: tuple[str, str | None, str | None, str | None], start_ms: int, end_ms: int,
    part: Mapping[str, Any],
) -> ClosedWindows:  # fmt: skip
    """One ``WindowColumnsPart`` of job ``job`` (id, user, partition, account) as the
    aggregator's closed windows. Raises ValueError for arrays that do not fit each other."""
    n, names = part["rows"], part["names"]
    if not 0 < n <= MAX_PART_ROWS:
        raise ValueError(f"window columns: {n} rows")
    node = _array(part["node"], "<i4", (n,), "node").astype(np.int64)
    uuid = _array(part["uuid"], "<i4", (n,), "uuid").astype(np.int64)
    gpu_index = _array(part["gpu_index"], "<i4", (n,), "gpu_index").astype(np.int64)
    if node.min() < 0 or node.max() >= len(names) or uuid.min() < -1 or uuid.max() >= len(names):
        raise ValueError("window columns: a name index out of range")
    if gpu_index.min() < 0:
        raise ValueError("window columns: a negative GPU index")
    accs = _rows(part["ints"], part["int_names"], INT_NAMES, "<i8", n, "ints")
    accs.update(_rows(part["floats"], part["float_names"], FLOAT_NAMES, "<f8", n, "floats"))
    accs.update(gid=np.arange(n), job=np.zeros(n, np.int64), uuid=uuid)
    xids: dict[int, list[int]] = {}
    for x in part["xids"]:
        if not 0 <= x["row"] < n:
            raise ValueError(f"window columns: XIDs of row {x['row']} of {n}")
        xids.setdefault(x["row"], []).extend(x["xids"])
    return ClosedWindows(start_ms, end_ms, accs, node, gpu_index, list(names), {0: job}, xids)


class WindowBatchCodec:
    """Encode and decode WindowBatch messages; write scored GpuWindows."""

    def __init__(self) -> None:
        self.windows = AvroCodec("GpuWindow")
        self.batches = AvroCodec("WindowBatch")
        self._header = MAGIC + self.windows.fingerprint
        self._body = self.windows.compiled_decoder

    # -- hot stage ------------------------------------------------------------------------------
    def encode_batch(
        self,
        job_id: str,
        window_start_ms: int,
        window_end_ms: int,
        parts: Mapping[int, Mapping[str, Any]],
        closed_wall_ms: float | None,
    ) -> bytes:
        """One WindowBatch, whatever its size: ``parts`` is source -> its windows'
        ``WindowColumnsPart`` (:func:`job_parts`). Raises EncodeError for a part that does not
        fit the schema."""
        [value] = self.encode_batches(
            job_id, window_start_ms, window_end_ms, parts, closed_wall_ms, max_bytes=1 << 62
        )
        return value

    def encode_batches(
        self,
        job_id: str,
        window_start_ms: int,
        window_end_ms: int,
        parts: Mapping[int, Mapping[str, Any]],
        closed_wall_ms: float | None,
        max_bytes: int = MAX_BATCH_BYTES,
    ) -> list[bytes]:
        """:meth:`encode_batch` in as few messages as keep each under ``max_bytes``, whole
        sources each, in source order (stage 3 keeps one pending entry per message under its
        first source, so a source never spans two). A source larger than ``max_bytes`` goes
        alone. Raises EncodeError as :meth:`encode_batch`."""
        chunks: list[list[int]] = [[]]
        size = 0
        for src in sorted(parts):
            src_bytes = _part_size(parts[src])
            if chunks[-1] and size + src_bytes > max_bytes:
                chunks.append([])
                size = 0
            chunks[-1].append(src)
            size += src_bytes
        return [
            self.batches.encode(
                {
                    "job_id": job_id,
                    "window_start_ms": window_start_ms,
                    "window_end_ms": window_end_ms,
                    "closed_wall_ms": closed_wall_ms,
                    "parts": [
                        {"source": src, "windows": [], "columns": parts[src]} for src in chunk
                    ],
                }
            )
            for chunk in chunks
        ]

    # -- stage 3 --------------------------------------------------------------------------------
    def decode_batch(self, value: bytes) -> dict[str, Any]:
        """A WindowBatch as the message :func:`~peerwatch.streams.core.job_stage.batches_of_message`
        reads: ``batch`` (one :class:`~peerwatch.streams.core.windows.ColumnsBatch` of every
        part given as columns: the windows are made by the replay's code when released) with
        its ``sources``, and
        ``parts`` (source -> GpuWindow dicts, for the parts of older workers).

        Raises CodecError for undecodable bytes and ValueError for a window of another job or
        window than its batch, arrays that do not fit, or a batch without windows."""
        batch = self.batches.decode(value)
        job_id, start, end = batch["job_id"], batch["window_start_ms"], batch["window_end_ms"]
        dicts: dict[int, list[dict[str, Any]]] = {}
        closed: list[ClosedWindows] = []
        sources: list[int] = []
        for part in batch["parts"]:
            src, columns = part["source"], part.get("columns")
            if columns is not None:
                meta = (job_id, columns["user"], columns["partition"], columns["account"])
                closed.append(closed_of_part(meta, start, end, columns))
                sources.append(src)
                continue
            got = dicts.setdefault(src, [])
            for one in part["windows"]:
                w = self._decode_window(one)
                if w["job_id"] != job_id or w["window_start_ms"] != start:
                    raise ValueError(
                        f"window batch of job {job_id!r} at {start} holds a window of job "
                        f"{w['job_id']!r} at {w['window_start_ms']}"
                    )
                if w["window_end_ms"] != end:
                    raise ValueError(f"window batch ending at {end}: a window ends at "
                                     f"{w['window_end_ms']}")  # fmt: skip
                got.append(w)
        if (not closed and not dicts) or not all(dicts.values()):
            raise ValueError("window batch without parts, or a part without windows")
        message: dict[str, Any] = {
            "kind": "windows", "job_id": job_id, "window_start_ms": start,
            "window_end_ms": end, "closed_wall_ms": batch["closed_wall_ms"], "parts": dicts,
        }  # fmt: skip
        if closed:  # the windows are made when released (once, all sources merged)
            message["batch"] = ColumnsBatch(job_id, start, end, merge_closed(closed))
            message["sources"] = sources
        return message

    def _decode_window(self, message: bytes) -> dict[str, Any]:
        """One GpuWindow message (an older worker's part): the compiled reader straight away
        for the current schema (the codec's checks around it cost as much as the C reader
        itself), else the codec."""
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

    def scored(self, scored: ScoredValues) -> list[bytes]:
        """The GpuWindow message of each scored window, in order: from the columns when the
        windows are the aggregator's untouched (no dict made), else each dict with its score.
        Raises EncodeError for a value that does not fit (naming the field)."""
        windows = scored.windows
        if isinstance(windows, LazyWindows):
            got = windows.scored_messages(self._header, scored.scores, scored.gates)
            if got is not None:
                return got
        encode = self.windows.encode
        return [
            encode({**w, "score": score, "gated": gated})
            for w, score, gated in zip(windows, scored.scores, scored.gates, strict=True)
        ]
