"""Archive input for the native replay path (:mod:`peerwatch.streams.offline.windows_native`).

Same records, same order as :func:`~peerwatch.streams.offline.replay.archive_records`, but the samples
of each hour are not decoded: their blocks go into a C ``SampleIndex`` (time, node, position per
sample, sorted in replay order) and reach the pipeline as :class:`SampleRun` s, cut wherever a
record of another stream (job events, node events, health, step times: few) falls between them.
A record of another stream at time T comes before the samples of T, as in ``sort_records``.

Damaged files are handled as ``read_container`` handles them (a bad block ends its file with a
warning). Sample files written with another schema version raise ``NativeUnsupported``: the
caller replays through the Python path, which resolves versions.

:func:`replay_split` runs that input on two cores (stage 2 here, stages 3 and 4 in a forked
process); the result is the one of a one-process replay.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fastavro.schema import to_parsing_canonical_form

from peerwatch.exporters.archive_files import raw_blocks, record_time_ms
from peerwatch.schemas.registry import raw_schema, strip_logical_types
from peerwatch.streams.core.pipeline import PipelineSettings
from peerwatch.streams.offline.pipeline_split import BackPipeline, FrontPipeline
from peerwatch.streams.offline.replay import (
    INPUT_STREAMS,
    SAMPLE_RUN,
    Progress,
    Record,
    ReplayResult,
    TimeRange,
    _admitted,
    _decode_task,
    archive_hours,
    collect,
    replay,
    sort_records,
)
from peerwatch.streams.offline.windows_native import (
    ArchiveUnordered,
    NativeUnsupported,
    SampleRun,
    kernel,
    new_index,
    node_ranks,
    sort_index,
)

log = logging.getLogger(__name__)

#: How far (event time) samples of an archive may be out of order for the streaming read.
DEFAULT_REORDER_MS = 30_000
_FAR_FUTURE = 1 << 62


def _canonical(schema: Any) -> str:
    return str(to_parsing_canonical_form(schema))


def index_samples(
    paths: list[Path], span: TimeRange, node_ids: dict[str, int],
    keep_nodes: frozenset[str] | None = None,
) -> Any:  # fmt: skip
    """A SampleIndex of every sample in ``paths`` within ``span`` (of ``keep_nodes`` only, when
    given), all released in replay order. Raises NativeUnsupported for a file of another
    schema version."""
    index = new_index(strip_logical_types(raw_schema("NodeGpuSample")))
    for _ in _add_blocks(index, paths, span, node_ids, keep_nodes):
        pass
    sort_index(index, node_ids)
    return index


def native_archive_records(
    root: Path,
    span: TimeRange,
    node_ids: dict[str, int],
    topic_prefix: str = "",
    keep_nodes: frozenset[str] | None = None,
    reorder_ms: int | None = DEFAULT_REORDER_MS,
) -> Iterator[Record]:
    """The replay input under ``root`` in ``span``, hour by hour: records of the other streams
    decoded, samples as ``(SAMPLE_RUN, "", SampleRun)``. ``node_ids`` is filled as nodes are
    met (give the same dict to the NativePipeline).

    ``reorder_ms``: samples are read block by block and released in replay order once the
    newest sample read is that much later (memory: that span of samples, not the hour), so the
    pipeline starts while the files are still being read. A sample older than what was released
    raises :class:`ArchiveUnordered` (the archive is out of order by more than ``reorder_ms``):
    replay again with ``reorder_ms=None``, which releases each hour once it is all read.
    """
    for files in (v for _, v in sorted(archive_hours(root, span, topic_prefix).items())):
        decoded = [r for s, p in files if s != "samples" for r in _decode_task((s, str(p), None))]
        waiting = deque(_admitted(decoded, span))
        del decoded
        index = new_index(strip_logical_types(raw_schema("NodeGpuSample")))
        paths = [p for s, p in files if s == "samples"]
        for _ in _add_blocks(index, paths, span, node_ids, keep_nodes):
            newest = index.max_ts
            below = None if reorder_ms is None or newest is None else newest - reorder_ms
            if below is not None and below > index.released_below:
                yield from _release(index, below, node_ids, waiting)
        yield from _release(index, _FAR_FUTURE, node_ids, waiting)


def _add_blocks(
    index: Any, paths: list[Path], span: TimeRange, node_ids: dict[str, int],
    keep_nodes: frozenset[str] | None,
) -> Iterator[None]:  # fmt: skip
    """Add the blocks of the sample files to ``index``, yielding after each one. A bad block
    ends its file (a warning, as ``read_container``); a sample older than what the index
    already released raises ArchiveUnordered."""
    for path, blocks in _sample_files(paths):
        for count, data in blocks:
            try:
                index.add_block(data, count, span.from_ms, span.to_ms, node_ids, keep_nodes)
            except kernel.Unordered as exc:
                raise ArchiveUnordered(f"{path}: {exc}") from exc
            except ValueError as exc:  # as read_container: the writer died here
                log.warning("%s: truncated tail ignored (%s)", path, exc)
                break
            yield


def _sample_files(paths: list[Path]) -> Iterator[tuple[Path, Iterator[tuple[int, bytes]]]]:
    """``(file, its blocks)`` of the sample files (see ``raw_blocks``); a file whose header is
    cut short is skipped with a warning; one of another schema version or codec raises
    NativeUnsupported."""
    current = _canonical(strip_logical_types(raw_schema("NodeGpuSample")))
    for path in paths:
        try:
            writer_schema, blocks = raw_blocks(path)
        except ValueError as exc:  # a header cut short (nothing durable yet), or another codec
            if "codec" in str(exc):
                raise NativeUnsupported(str(exc)) from exc
            log.warning("%s: unreadable header (%s), skipped", path, exc)
            continue
        if _canonical(writer_schema) != current:
            raise NativeUnsupported(f"{path}: written with another NodeGpuSample version")
        yield path, blocks


def _release(
    index: Any, threshold_ms: int, node_ids: dict[str, int], waiting: deque[Record]
) -> Iterator[Record]:
    """Release the samples under ``threshold_ms`` and yield them with the waiting records of
    other streams under it (:func:`merge_runs`); then forget the samples yielded."""
    index.release(threshold_ms, node_ranks(node_ids))
    yield from merge_runs(waiting, index, threshold_ms)
    index.compact(len(index))


def merge_runs(waiting: deque[Record], index: Any, below_ms: int = _FAR_FUTURE) -> Iterator[Record]:
    """The released samples of ``index`` as SampleRuns, with the records of other streams (in
    replay order) taken from ``waiting`` while under ``below_ms`` in between: a record at
    time T comes before the samples of T."""
    pos = 0
    while waiting and record_time_ms(waiting[0][2]) < below_ms:  # type: ignore[operator]
        record = waiting.popleft()
        cut = index.bisect(record_time_ms(record[2]))
        if cut > pos:
            yield SAMPLE_RUN, "", SampleRun(index, pos, cut)  # type: ignore[misc]
            pos = cut
        yield record
    if pos < len(index):
        yield SAMPLE_RUN, "", SampleRun(index, pos, len(index))  # type: ignore[misc]


def kafka_native_records(
    kafka_settings: Any,
    span: TimeRange,
    node_ids: dict[str, int],
    topic_prefix: str = "",
    keep_nodes: frozenset[str] | None = None,
    block_bytes: int = 1 << 20,
) -> tuple[list[Record], int]:
    """:func:`~peerwatch.streams.offline.replay_kafka.kafka_records` for the native path: the other
    streams decoded, the samples' bodies indexed undecoded (gathered into blocks of about
    ``block_bytes``), merged into SampleRuns; and how many messages were undecodable (skipped,
    one by one, as the Python path skips them). Raises NativeUnsupported for a sample written
    with another schema version."""
    from peerwatch.errors import CodecError
    from peerwatch.schemas.codec import AvroCodec, split_header
    from peerwatch.streams.offline.replay_kafka import range_messages

    codecs = {stream: AvroCodec(str(spec.value_schema)) for stream, spec in INPUT_STREAMS.items()}
    samples = codecs["samples"]
    index = new_index(strip_logical_types(raw_schema("NodeGpuSample")))
    keep_keys = None if keep_nodes is None else {n.encode() for n in keep_nodes}
    pairs: list[tuple[str, dict[str, Any]]] = []
    block: list[Any] = []
    size = bad = 0

    def add(bodies: list[Any]) -> int:
        """Index ``bodies``; the undecodable ones are skipped one by one: their count."""
        try:
            index.add_block(b"".join(bodies), len(bodies), span.from_ms, span.to_ms,
                            node_ids, keep_nodes)  # fmt: skip
            return 0
        except ValueError:
            if len(bodies) == 1:
                return 1
            return sum(add([body]) for body in bodies)

    for stream, msg in range_messages(kafka_settings, span, topic_prefix):
        value = msg.value() or b""
        if stream != "samples":
            try:
                pairs.append((stream, codecs[stream].decode(value)))
            except CodecError:
                bad += 1
            continue
        if keep_keys is not None and msg.key() not in keep_keys:
            continue
        body = samples.current_body(value)
        if body is None:
            try:
                known = split_header(value) in samples.known_fingerprints
            except CodecError:
                known = False
            if known:
                raise NativeUnsupported("a sample written with another schema version")
            bad += 1
            continue
        block.append(body)
        size += len(body)
        if size >= block_bytes:
            bad += add(block)
            block, size = [], 0
    if block:
        bad += add(block)
    sort_index(index, node_ids)
    others = sort_records((s, v) for s, v in pairs if span.admits(s, record_time_ms(v)))
    return list(merge_runs(deque(others), index)), bad


def replay_split(
    records: Iterable[Record],
    settings: PipelineSettings,
    node_ids: dict[str, int],
    *,
    job: str | None = None,
    node: str | None = None,
    keep_windows: bool = False,
    progress: Progress | None = None,
) -> ReplayResult:
    """:func:`~peerwatch.streams.offline.replay.replay` on two cores: stage 2 here, stages 3 and 4
    in a forked process (:mod:`peerwatch.streams.offline.pipeline_split`); the same result. Raises
    NativeUnsupported as the native path does (the second process is stopped first)."""
    t0 = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(
        target=_stages_main,
        args=(there, settings, job, node, keep_windows),
        name="peerwatch-replay-stages",
        daemon=True,
    )
    proc.start()
    there.close()
    done = False
    try:
        front = FrontPipeline(settings, node_ids, here.send)
        result = replay(records, settings, job=job, node=node, keep_windows=keep_windows,
                        progress=progress, pipeline=front)  # fmt: skip
        try:
            back: ReplayResult = here.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(
                f"the replay's stages process ended early (exit code {proc.exitcode})"
            ) from exc
        done = True
    finally:
        if not done:
            proc.kill()
        proc.join()
        here.close()
    result.findings, result.recommendations = back.findings, back.recommendations
    result.windows, result.late, result.invalid = back.windows, back.late, back.invalid
    result.wall_s = time.perf_counter() - t0
    return result


def _stages_main(
    conn: Any, settings: PipelineSettings, job: str | None, node: str | None, keep_windows: bool
) -> None:
    """The second process of :func:`replay_split`: every message through a BackPipeline, the
    kept outputs sent back at the end."""
    back = BackPipeline(settings)
    result = ReplayResult()
    try:
        while True:
            message = conn.recv()
            collect(result, back.handle(message), job, node, keep_windows)
            if message[0] == "finish":
                break
    except EOFError:  # the reading process stopped (an error there, reported there)
        return
    conn.send(result)
    conn.close()
