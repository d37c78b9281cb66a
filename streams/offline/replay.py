"""Offline replay: a time range of the input topics (from the archive or from Kafka) through the
same four stages as the live stream (:class:`~peerwatch.streams.core.pipeline.Pipeline`).

Live == replay. The live app (:mod:`peerwatch.streams.live.app`) and the offline pipeline share every
stage's code; what can make them differ is settings and input order:

* settings: the pipeline takes the live worker's own settings objects (the tree's ``[stream]``,
  ``[detector]`` and ``[policy]`` tables), so there are no offline defaults to drift;
* order: records are merged by event time, ties broken deterministically (job events, node
  events and health results before the samples of the same millisecond, then by key, then by
  read order), so the same input always gives the same output. Live, each samples partition is
  processed in its own order; windows hold the same readings either way as long as no sample is
  late (skew and jitter within the 5 s lateness), which is what the live==replay test checks.
* range: job events are read from ``lookback_s`` before ``--from`` so that jobs that started
  earlier are attributed; detector persistence and the policy's repeat-offender memory start
  empty at ``--from`` (replay from the start of a job to reproduce its live findings exactly).

``--job``/``--node`` filter the OUTPUTS: the detector still sees every GPU of a job, or the peer
groups (and so every z-score) would change. Samples of nodes that cannot change those outputs
(:func:`scope_nodes`: not the job's, and no job of theirs shared a node with it) are skipped
without being decoded, so replaying one job out of a whole cluster's archive costs about what
the job's own nodes cost.
"""

from __future__ import annotations

import contextlib
import gc
import io
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from peerwatch.io.archive.layout import HOUR_MS, ReadStats, archive_files, record_time_ms
from peerwatch.io.archive.reader import in_current_version, read_container, read_file, split_file
from peerwatch.schemas.registry import current_schema
from peerwatch.settings import Settings
from peerwatch.streams.core.pipeline import (
    FINDING,
    INVALID,
    LATE_SAMPLE,
    RECOMMENDATION,
    WINDOW,
    Output,
    Pipeline,
)
from peerwatch.streams.core.settings import StageSettings
from peerwatch.streams.offline.sample_runs import (
    DEFAULT_REORDER_MS,
    FAR_FUTURE_MS,
    SAMPLE_RUN,
    SampleRuns,
    TablesOf,
    decoded_here,
    file_tables,
    in_scope,
    merge,
    sample_decoder,
)
from peerwatch.topics import (
    HEALTH,
    JOB_EVENTS,
    NIC_SAMPLES,
    NODE_EVENTS,
    SAMPLES,
    STEP_TIMES,
    TopicSpec,
)

#: Pipeline stream -> topic. Order = tie-break rank at equal event time.
INPUT_STREAMS: dict[str, TopicSpec] = {
    "job-events": JOB_EVENTS,
    "node-events": NODE_EVENTS,
    "health": HEALTH,
    "step-times": STEP_TIMES,
    "samples": SAMPLES,
    # after the GPU samples: a node's NIC sample has its GPU sample's time, and follows it
    "nic-samples": NIC_SAMPLES,
}
_RANK = {s: i for i, s in enumerate(INPUT_STREAMS)}
_KEY_FIELD = {
    "job-events": "job_id",
    "node-events": "node",
    "health": "node",
    "step-times": "job_id",
    "samples": "node",
    "nic-samples": "node",
}
Record = tuple[str, str, dict[str, Any]]


def live_equivalent_settings(settings: Settings | None = None) -> Settings:
    """The settings a replay equal to a live worker runs with: the worker's own tree
    ``settings`` (default: the tree's defaults); the pipeline reads its ``[stream]``,
    ``[detector]`` and ``[policy]`` tables."""
    return settings or Settings()


@dataclass(frozen=True)
class TimeRange:
    """``[from_ms, to_ms)``; job events from ``from_ms - lookback_ms``."""

    from_ms: int
    to_ms: int
    lookback_ms: int = 24 * HOUR_MS

    def admits(self, stream: str, ts_ms: int | None) -> bool:
        """Whether a record of ``stream`` at ``ts_ms`` belongs to the replay."""
        if ts_ms is None:
            return False
        lo = self.from_ms - self.lookback_ms if stream == "job-events" else self.from_ms
        return lo <= ts_ms < self.to_ms


def sort_records(records: Iterable[tuple[str, dict[str, Any]]]) -> list[Record]:
    """``(stream, value)`` pairs as pipeline input in the deterministic replay order (see the
    module docstring); values without an event time are dropped."""
    keyed = []
    for seq, (stream, value) in enumerate(records):
        ts = record_time_ms(value)
        if ts is None:
            continue
        key = str(value.get(_KEY_FIELD[stream]) or "")
        keyed.append(((ts, _RANK[stream], key, seq), (stream, key, value)))
    keyed.sort(key=lambda kv: kv[0])
    return [rec for _, rec in keyed]


@contextlib.contextmanager
def bulk_load() -> Iterator[None]:
    """Decoding an hour of records builds millions of acyclic dicts and lists that stay alive;
    the cyclic garbage collector would traverse them again at every full collection (measured:
    about 30% of a replay). The collector is off while they are built, and what was built is
    then frozen out of later collections (refcounting still frees it)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def scope_nodes(
    job_events: Iterable[Mapping[str, Any]], job: str | None = None, node: str | None = None
) -> frozenset[str] | None:
    """The nodes whose samples decide every output about ``job``/``node``; None = all.

    Outputs about a job depend on its own GPUs (peers are the job's GPUs); a node's drain
    recommendations also depend on the findings of every other job that ran on it, and those on
    that job's GPUs. So: the nodes of the job (or the node), plus every node of any job that
    shared one of them. Records of other nodes cannot change what is kept, and are skipped.
    """
    if job is None and node is None:
        return None
    nodes_of: dict[str, set[str]] = {}
    for ev in job_events:
        nodes = {str(a["node"]) for a in ev.get("allocations") or [] if a.get("node")}
        nodes_of.setdefault(str(ev.get("job_id")), set()).update(nodes)
    core = {node} if node is not None else set(nodes_of.get(str(job), set()))
    out = set(core)
    for nodes in nodes_of.values():
        if nodes & core:
            out |= nodes
    return frozenset(out)


def archive_job_events(root: Path, span: TimeRange, topic_prefix: str = "") -> list[dict[str, Any]]:
    """The JobEvents of the archive in ``span`` (with its lookback): small, read first to
    scope a ``--job``/``--node`` replay."""
    spec = INPUT_STREAMS["job-events"]
    lo = span.from_ms - span.lookback_ms
    out: list[dict[str, Any]] = []
    schema = current_schema(str(spec.value_schema))
    for path in archive_files(Path(root), topic_prefix + spec.name, lo, span.to_ms):
        out += [r for r in read_file(path, schema) if span.admits("job-events", record_time_ms(r))]
    return out


def _decode_task(
    task: tuple[str, str | bytes, frozenset[str] | None],
) -> tuple[list[tuple[str, dict[str, Any]]], ReadStats]:
    """Decode one ``(stream, file path or container bytes, nodes to keep)``; the records and
    what was skipped (module level: runs in worker processes too)."""
    stream, src, keep = task
    schema = current_schema(str(INPUT_STREAMS[stream].value_schema))
    stats = ReadStats()
    if stream != "samples":
        keep = None
    if isinstance(src, bytes):
        records = read_container(io.BytesIO(src), schema, stream, keep, stats)
    else:
        records = read_file(Path(src), schema, keep, stats)
    return [(stream, r) for r in records], stats


def _decoded(task: tuple[str, str | bytes, frozenset[str] | None],
             stats: ReadStats | None) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    records, skipped = _decode_task(task)
    if stats is not None:
        stats.add(skipped)
    return records


def archive_hours(
    root: Path, span: TimeRange, topic_prefix: str = "", stats: ReadStats | None = None
) -> dict[str, list[tuple[str, Path]]]:
    """The input files under ``root`` for ``span`` (job events with the lookback), by hour
    (``YYYY-MM-DDTHH``): ``(stream, file)`` pairs, streams in :data:`INPUT_STREAMS` order.
    ``stats``: counts the misnamed entries skipped."""
    hours: dict[str, list[tuple[str, Path]]] = {}
    for stream, spec in INPUT_STREAMS.items():
        lo = span.from_ms - (span.lookback_ms if stream == "job-events" else 0)
        for path in archive_files(Path(root), topic_prefix + spec.name, lo, span.to_ms, stats):
            hours.setdefault(path.name[:13], []).append((stream, path))
    return hours


def archive_records(
    root: Path,
    span: TimeRange,
    topic_prefix: str = "",
    workers: int = 1,
    part_bytes: int = 2 << 20,
    keep_nodes: frozenset[str] | None = None,
    stats: ReadStats | None = None,
) -> Iterator[Record]:
    """The input records under ``root`` in ``span``, hour by hour in replay order (memory: one
    hour of records). ``workers`` > 1 decodes parts of ``part_bytes`` of each file in that many
    processes (Avro decoding is the replay's bottleneck); the order is the same.
    ``keep_nodes``: samples of other nodes are skipped undecoded (see :func:`scope_nodes`).
    ``stats``: counts what was skipped (bad records, blocks, files, misnamed entries)."""
    hours = archive_hours(root, span, topic_prefix, stats)
    if workers <= 1:
        for hour in sorted(hours):
            with bulk_load():
                decoded = [
                    r for s, p in hours[hour] for r in _decoded((s, str(p), keep_nodes), stats)
                ]
                admitted = _admitted(decoded, span)
                del decoded
            yield from admitted
        return
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        for hour in sorted(hours):
            tasks: list[tuple[str, str | bytes, frozenset[str] | None]] = []
            file_of: list[int] = []  # each task's file (its index in the hour)
            layouts: list[ReadStats] = []  # what cutting each file into parts skipped
            for i, (stream, path) in enumerate(hours[hour]):
                layout = ReadStats()
                parts: list[str | bytes] = []
                # Only a file of the current schema is cut into parts: fastavro reads another
                # version (or judges a bad header) and ends at its first fault, where each
                # part would go on past it.
                schema = current_schema(str(INPUT_STREAMS[stream].value_schema))
                if in_current_version(path, schema):
                    with contextlib.suppress(ValueError):
                        parts = list(split_file(path, part_bytes, layout))
                if not parts:  # read whole by read_file, as the other modes read it
                    parts, layout = [str(path)], ReadStats()
                tasks += [(stream, part, keep_nodes) for part in parts]
                file_of += [i] * len(parts)
                layouts.append(layout)
            with bulk_load():
                decoded = []
                bad_files: set[int] = set()
                for i, (part, skipped) in zip(file_of, pool.imap(_decode_task, tasks), strict=True):
                    decoded += part
                    if skipped.bad_files:  # every part carries the file's header: count it once
                        bad_files.add(i)
                        skipped.bad_files = 0
                    if stats is not None:
                        stats.add(skipped)
                if stats is not None:
                    # A file with an unreadable header counts once, as in the other modes: as a
                    # bad file, not also by what its blocks' layout skipped.
                    stats.bad_files += len(bad_files)
                    for i, layout in enumerate(layouts):
                        if i not in bad_files:
                            stats.add(layout)
                admitted = _admitted(decoded, span)
                del decoded
            yield from admitted


def column_archive_records(
    root: Path,
    span: TimeRange,
    strings: dict[str, int],
    topic_prefix: str = "",
    keep_nodes: frozenset[str] | None = None,
    reorder_ms: int | None = DEFAULT_REORDER_MS,
    stats: ReadStats | None = None,
    tables_of: TablesOf | None = None,
) -> Iterator[Record]:
    """The replay input under ``root`` in ``span``, hour by hour: the other streams' records
    decoded, the samples as ``(SAMPLE_RUN, "", tables)`` runs in between (string codes of
    ``strings``: the pipeline aggregator's). Samples are read block by block and released once
    ``reorder_ms`` older than the newest read (None: each hour once it is all read). Raises
    ArchiveUnordered (see :mod:`~peerwatch.streams.offline.sample_runs`), and Unsupported
    without the C decoder or for sample files of another schema version. ``stats``: counts
    what was skipped, as :func:`archive_records` does; ``tables_of``: how the sample files'
    blocks are read and decoded (see :func:`~peerwatch.streams.offline.sample_runs.file_tables`;
    default: here, by the C decoder)."""
    if tables_of is None:
        tables_of = decoded_here(sample_decoder())
    for files in (v for _, v in sorted(archive_hours(root, span, topic_prefix, stats).items())):
        decoded = [
            r for s, p in files if s != "samples" for r in _decoded((s, str(p), None), stats)
        ]
        waiting = deque(_admitted(decoded, span))
        del decoded
        runs = SampleRuns(strings)
        paths = [p for s, p in files if s == "samples"]
        for tables in file_tables(paths, tables_of, strings, stats):
            runs.add(in_scope(tables, span.from_ms, span.to_ms, strings, keep_nodes))
            if reorder_ms is not None and runs.newest is not None:
                below = runs.newest - reorder_ms
                if below > runs.released_below:
                    yield from merge(waiting, runs.release(below), below)
        yield from merge(waiting, runs.release(FAR_FUTURE_MS), FAR_FUTURE_MS)


def _admitted(decoded: list[tuple[str, dict[str, Any]]], span: TimeRange) -> list[Record]:
    return sort_records((s, v) for s, v in decoded if span.admits(s, record_time_ms(v)))


def keep_output(out: Output, job: str | None = None, node: str | None = None) -> bool:
    """Whether an output concerns ``job`` and ``node`` (None = any)."""
    v = out.value
    if out.kind == RECOMMENDATION:
        return (job is None or job in (v.get("job_ids") or [])) and (
            node is None or v.get("node") == node
        )
    if out.kind in (FINDING, WINDOW):
        return (job is None or v.get("job_id") == job) and (node is None or v.get("node") == node)
    return job is None and (node is None or out.key == node)


class Progress(Protocol):
    """Where a replay reports how far it got, in event time: ``update`` now and then with the
    event time reached and the records read, ``done`` at the end (the command's progress bar:
    :class:`peerwatch.console.EventTimeProgress`)."""

    def update(self, ts_ms: int, records: int, force: bool = False) -> None: ...

    def done(self, records: int) -> None: ...


@dataclass
class ReplayResult:
    """What a replay produced: the kept outputs (findings, recommendations; windows when asked)
    and the timeline events it read, with counts and the wall time."""

    findings: list[dict[str, Any]] = field(default_factory=list)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    records: int = 0
    node_records: int = 0
    late: int = 0
    invalid: int = 0
    wall_s: float = 0.0

    @property
    def node_records_per_s(self) -> float:
        return self.node_records / self.wall_s if self.wall_s else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "records": self.records, "node_records": self.node_records,
            "findings": len(self.findings), "recommendations": len(self.recommendations),
            "late_samples": self.late, "invalid": self.invalid, "wall_s": round(self.wall_s, 3),
            "node_records_per_s": round(self.node_records_per_s, 1),
        }  # fmt: skip


def collect(
    result: ReplayResult,
    outputs: Iterable[Output],
    job: str | None = None,
    node: str | None = None,
    keep_windows: bool = False,
) -> None:
    """Add ``outputs`` to ``result``: counted (late, invalid) or kept (concerning ``job`` and
    ``node``; windows only when asked)."""
    for out in outputs:
        if out.kind == LATE_SAMPLE:
            result.late += 1
        elif out.kind == INVALID:
            result.invalid += 1
        elif not keep_output(out, job, node):
            continue
        elif out.kind == FINDING:
            result.findings.append(out.value)
        elif out.kind == RECOMMENDATION:
            result.recommendations.append(out.value)
        elif out.kind == WINDOW and keep_windows:
            result.windows.append(out.value)


def replay(
    records: Iterable[Record],
    settings: StageSettings,
    *,
    job: str | None = None,
    node: str | None = None,
    keep_windows: bool = False,
    progress: Progress | None = None,
    pipeline: Pipeline | None = None,
) -> ReplayResult:
    """Run ``records`` (replay order) through a fresh pipeline; keep the outputs that concern
    ``job``/``node``. Deterministic. Raises nothing for bad records (they count as invalid).

    ``pipeline``: a fresh pipeline of ``settings`` to use."""
    result = ReplayResult()
    pipeline = pipeline if pipeline is not None else Pipeline(settings, keep_windows)
    t0 = time.perf_counter()
    last_ts = 0

    def take(outputs: Iterable[Output]) -> None:
        collect(result, outputs, job, node, keep_windows)

    for stream, key, value in records:
        if stream == SAMPLE_RUN:  # samples as columns (column_archive_records)
            n = value[""].n
            result.records += n
            result.node_records += n
            take(pipeline.feed_columns(value))
            if progress is not None and n:
                progress.update(int(value[""].values["ts_ms"][-1]), result.records)
            continue
        result.records += 1
        if stream == "samples":
            result.node_records += 1
            last_ts = int(value["ts_ms"])
        elif stream in ("job-events", "node-events"):
            result.events.append((stream, value))
        take(pipeline.feed(stream, key, value))
        if progress is not None and not result.records % 2048:
            progress.update(last_ts, result.records)
    take(pipeline.finish())
    result.wall_s = time.perf_counter() - t0
    if progress is not None:
        progress.done(result.records)
    return result


def output_lines(result: ReplayResult) -> Iterator[str]:
    """JSON lines: every finding, then every recommendation, as ``{"kind": ..., **record}``."""
    import json

    for kind, values in ((FINDING, result.findings), (RECOMMENDATION, result.recommendations)):
        for v in values:
            yield json.dumps({"kind": kind, **v}, sort_keys=True) + "\n"
