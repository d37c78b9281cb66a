"""Archive input for the native replay path (:mod:`peerwatch.streams.windows_native`).

Same records, same order as :func:`~peerwatch.exporters.replay.archive_records`, but the samples
of each hour are not decoded: their blocks go into a C ``SampleIndex`` (time, node, position per
sample, sorted in replay order) and reach the pipeline as :class:`SampleRun` s, cut wherever a
record of another stream (job events, node events, health, step times: few) falls between them.
A record of another stream at time T comes before the samples of T, as in ``sort_records``.

Damaged files are handled as ``read_container`` handles them (a bad block ends its file with a
warning). Sample files written with another schema version raise ``NativeUnsupported``: the
caller replays through the Python path, which resolves versions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import to_parsing_canonical_form

from peerwatch.exporters.archive_files import archive_files, record_time_ms
from peerwatch.exporters.replay import (
    INPUT_STREAMS,
    SAMPLE_RUN,
    Record,
    TimeRange,
    _admitted,
    _decode_task,
)
from peerwatch.schemas.registry import raw_schema, strip_logical_types
from peerwatch.streams.windows_native import NativeUnsupported, SampleRun, new_index, sort_index

log = logging.getLogger(__name__)


def _canonical(schema: Any) -> str:
    return str(to_parsing_canonical_form(schema))


def index_samples(
    paths: list[Path], span: TimeRange, node_ids: dict[str, int],
    keep_nodes: frozenset[str] | None = None,
) -> Any:  # fmt: skip
    """A sorted SampleIndex of the samples in ``paths`` within ``span`` (of ``keep_nodes``
    only, when given). Raises NativeUnsupported for a file of another schema version."""
    wire = strip_logical_types(raw_schema("NodeGpuSample"))
    current = _canonical(wire)
    index = new_index(wire)
    for path in paths:
        with path.open("rb") as fh:
            try:
                blocks = fastavro.block_reader(fh)
            except Exception as exc:  # a header cut short: nothing durable in this file yet
                log.warning("%s: unreadable header (%s), skipped", path, exc)
                continue
            if _canonical(blocks.writer_schema) != current:
                raise NativeUnsupported(f"{path}: written with another NodeGpuSample version")
            while True:
                try:
                    block = next(blocks)
                    data = block.bytes_.getvalue()  # type: ignore[attr-defined]
                    index.add_block(data, block.num_records, span.from_ms, span.to_ms,
                                    node_ids, keep_nodes)  # fmt: skip
                except StopIteration:
                    break
                except Exception as exc:  # as read_container: the writer died here
                    log.warning("%s: truncated tail ignored (%s: %s)", path,
                                type(exc).__name__, exc)  # fmt: skip
                    break
    sort_index(index, node_ids)
    return index


def native_archive_records(
    root: Path,
    span: TimeRange,
    node_ids: dict[str, int],
    topic_prefix: str = "",
    keep_nodes: frozenset[str] | None = None,
) -> Iterator[Record]:
    """The replay input under ``root`` in ``span``, hour by hour: records of the other streams
    decoded, samples as ``(SAMPLE_RUN, "", SampleRun)``. ``node_ids`` is filled as nodes are
    met (give the same dict to the NativePipeline)."""
    hours: dict[str, list[tuple[str, Path]]] = {}
    for stream, spec in INPUT_STREAMS.items():
        lo = span.from_ms - (span.lookback_ms if stream == "job-events" else 0)
        for path in archive_files(Path(root), topic_prefix + spec.name, lo, span.to_ms):
            hours.setdefault(path.name[:13], []).append((stream, path))
    for hour in sorted(hours):
        files = hours[hour]
        decoded = [r for s, p in files if s != "samples" for r in _decode_task((s, str(p), None))]
        others = _admitted(decoded, span)
        del decoded
        index = index_samples([p for s, p in files if s == "samples"], span, node_ids, keep_nodes)
        pos = 0
        for record in others:
            cut = index.bisect(record_time_ms(record[2]))
            if cut > pos:
                yield SAMPLE_RUN, "", SampleRun(index, pos, cut)  # type: ignore[misc]
                pos = cut
            yield record
        if pos < len(index):
            yield SAMPLE_RUN, "", SampleRun(index, pos, len(index))  # type: ignore[misc]
