"""Read one job's records for ``peerwatch job``: from an archive directory or from Kafka.

Both sources give a :class:`JobRecords`: the job's events, GpuWindows, StragglerFindings, and the
recommendations, drain actions and node events of its nodes, plus how many records could not be
decoded (skipped, counted). The summary itself is :mod:`peerwatch.report.job_summary`. The NIC
samples of the nodes whose ports the stream named (cause NETWORK) are folded per port as they are
read (:class:`peerwatch.report.network.PortTotals`: never held), for the network line.

* Archive (``peerwatch archive``'s layout): the job's events are read first; the other topics
  only for the hours of the job's time span (all hours when its events are not archived).
* Kafka: topics keyed by job id (job events, windows, findings) are read from the one partition
  that key lands in (Kafka's murmur2 partitioner, as the producers and faust use), topics keyed
  by node from the partitions of the job's nodes; each from ``offsets_for_times(start)`` to its
  end offset as of the read, stopping once message times are ``slack_ms`` past the end. Nothing
  is committed: reading changes nothing on the cluster.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peerwatch.io.archive.layout import HOUR_MS, archive_files, record_time_ms
from peerwatch.io.archive.reader import read_file
from peerwatch.topics import (
    ACTIONS,
    JOB_EVENTS,
    JOB_WINDOWS,
    NIC_SAMPLES,
    NODE_EVENTS,
    RECOMMENDATIONS,
    STRAGGLERS,
    TopicSpec,
)

log = logging.getLogger(__name__)


@dataclass
class JobRecords:
    """What was read about one job (records of other jobs may be included; the summary filters)."""

    job_events: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    node_events: list[dict[str, Any]] = field(default_factory=list)
    #: The named ports' NIC samples over the job, folded: (node, port) -> its window.
    nic_ports: dict[tuple[str, str], Any] = field(default_factory=dict)
    undecodable: int = 0

    def knows(self, job_id: str) -> bool:
        """Whether anything was read of ``job_id`` itself: an event, a window or a finding."""
        return any(
            str(r.get("job_id")) == job_id
            for rows in (self.job_events, self.windows, self.findings)
            for r in rows
        )

    def span_ms(self, job_id: str) -> tuple[int | None, int | None]:
        """The job's [start, end] from its events (None where unknown)."""
        starts: list[int] = []
        ends: list[int] = []
        for ev in self.job_events:
            if str(ev.get("job_id")) != job_id:
                continue
            for name, out in (("start_ms", starts), ("end_ms", ends)):
                if isinstance(ev.get(name), int):
                    out.append(int(ev[name]))
            if ev.get("kind") == "STARTED" and isinstance(ev.get("ts_ms"), int):
                starts.append(int(ev["ts_ms"]))
            if ev.get("kind") == "ENDED" and isinstance(ev.get("ts_ms"), int):
                ends.append(int(ev["ts_ms"]))
        return (min(starts) if starts else None), (max(ends) if ends else None)

    def nodes(self, job_id: str) -> set[str]:
        out: set[str] = set()
        for ev in self.job_events:
            if str(ev.get("job_id")) == job_id:
                out |= {str(a.get("node")) for a in ev.get("allocations") or [] if a.get("node")}
        return out


def _schema(spec: TopicSpec) -> Any:
    from peerwatch.schemas.registry import current_schema

    return current_schema(str(spec.value_schema))


def _read_topic(
    root: Path, topic: str, spec: TopicSpec, lo: int | None, hi: int | None
) -> list[dict[str, Any]]:
    out = []
    for path in archive_files(root, topic, lo, hi):
        out += list(read_file(path, _schema(spec)))
    return out


def archive_job_records(
    root: Path, job_id: str, topic_prefix: str = "", margin_ms: int = HOUR_MS
) -> JobRecords:
    """The records of ``job_id`` in the archive under ``root`` (see the module doc). A corrupt
    file tail is skipped with a warning by the file reader; the rest is kept."""
    root = Path(root)
    out = JobRecords()
    out.job_events = [
        r
        for r in _read_topic(root, topic_prefix + JOB_EVENTS.name, JOB_EVENTS, None, None)
        if str(r.get("job_id")) == job_id
    ]
    start, end = out.span_ms(job_id)
    lo = None if start is None else start - margin_ms
    hi = None if end is None else end + margin_ms
    by_job = ((JOB_WINDOWS, "windows"), (STRAGGLERS, "findings"))
    for spec, name in by_job:
        rows = _read_topic(root, topic_prefix + spec.name, spec, lo, hi)
        setattr(out, name, [r for r in rows if str(r.get("job_id")) == job_id])
    nodes = out.nodes(job_id) | {str(w.get("node")) for w in out.windows}
    by_node = ((RECOMMENDATIONS, "recommendations"), (ACTIONS, "actions"),
               (NODE_EVENTS, "node_events"))  # fmt: skip
    for spec, name in by_node:
        rows = _read_topic(root, topic_prefix + spec.name, spec, lo, hi)
        setattr(out, name, [r for r in rows if str(r.get("node")) in nodes])
    totals = _nic_totals(out, job_id)
    if totals is not None:
        for path in archive_files(root, topic_prefix + NIC_SAMPLES.name, lo, hi):
            for record in read_file(path, _schema(NIC_SAMPLES)):
                totals.add(record)
        out.nic_ports = totals.windows()
    return out


def _nic_totals(records: JobRecords, job_id: str) -> Any:
    """A :class:`~peerwatch.report.network.PortTotals` for the nodes whose ports the stream
    named for ``job_id``, over the job's span; None when it named none."""
    from peerwatch.report.network import PortTotals, network_nodes

    named = network_nodes(job_id, records.findings, records.recommendations)
    if not named:
        return None
    start, end = records.span_ms(job_id)
    return PortTotals(frozenset(named), start, end)


def archive_has_samples(root: Path, topic_prefix: str = "") -> bool:
    """Whether the archive holds sample files (so a job can be replayed from it)."""
    from peerwatch.topics import SAMPLES

    return bool(archive_files(Path(root), topic_prefix + SAMPLES.name))


def archive_prefixes(root: Path) -> list[str]:
    """The topic prefixes of the catalogue topics the archive under ``root`` holds folders of
    ("" for none), sorted."""
    from peerwatch.topics import TOPICS

    names = [t.name for t in TOPICS]
    found: set[str] = set()
    try:
        folders = [p.name for p in Path(root).iterdir() if p.is_dir()]
    except OSError:
        return []
    for folder in folders:
        found |= {folder[: -len(n)] for n in names if folder.endswith(n)}
    return sorted(found)


def check_archive_prefix(root: Path, topic_prefix: str, option: str = "--archive") -> None:
    """Raises ConfigError naming ``option`` when the archive under ``root`` holds topics, none
    with ``topic_prefix``: saying which prefixes it does hold (a mismatch otherwise reads as an
    archive where nothing happened)."""
    from peerwatch.errors import ConfigError

    held = archive_prefixes(root)
    if not held or topic_prefix in held:  # an empty archive: the caller says what is missing
        return
    names = ", ".join(repr(p) for p in held)
    raise ConfigError(
        option,
        f"{root} holds no topics with the prefix {topic_prefix!r} (setting topic_prefix, "
        f"PEERWATCH_TOPIC_PREFIX); it holds the prefix{'es' if len(held) > 1 else ''} {names}",
    )


def archive_span_ms(root: Path, topic_prefix: str = "") -> tuple[int, int] | None:
    """[first hour start, last hour end) of the archive's sample files; None if it has none."""
    from peerwatch.io.archive.layout import hour_start_ms, parse_file_name
    from peerwatch.topics import SAMPLES

    hours = [
        hour_start_ms(parsed[0])
        for p in archive_files(Path(root), topic_prefix + SAMPLES.name)
        if (parsed := parse_file_name(p.name)) is not None
    ]
    return (min(hours), max(hours) + HOUR_MS) if hours else None


def partition_of(key: str, partitions: int) -> int:
    """The partition Kafka's default keyed partitioner (murmur2) puts ``key`` in: the one the
    producers (librdkafka ``murmur2_random``) and faust (aiokafka) use."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def _kafka_read(
    consumer: Any,
    topic: str,
    keys: Iterable[str],
    from_ms: int,
    to_ms: int | None,
    slack_ms: int,
    timeout_s: float,
    fold: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """The decoded records keyed by one of ``keys`` in ``topic`` from ``from_ms``; and how many
    of them could not be decoded. With ``fold`` each record goes there instead of the list."""
    from peerwatch.errors import CodecError
    from peerwatch.io.topic_reader import TopicEndNotReached, TopicRange, read_to_end
    from peerwatch.schemas.codec import decode_any

    wanted_keys = {k.encode() for k in keys}
    if not wanted_keys:
        return [], 0
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return [], 0
    n = len(meta.partitions)
    until = None if to_ms is None else to_ms + slack_ms
    where = TopicRange(topic, {partition_of(k.decode(), n) for k in wanted_keys}, from_ms, until)
    out: list[dict[str, Any]] = []
    bad = 0
    try:
        for msg in read_to_end(consumer, [where], idle_timeout_s=timeout_s,
                               metadata_timeout_s=timeout_s):  # fmt: skip
            if msg.key() not in wanted_keys:
                continue
            try:
                record = decode_any(msg.value() or b"")[1]
            except CodecError:
                bad += 1
                continue
            if fold is None:
                out.append(record)
            else:
                fold(record)
    except TopicEndNotReached as exc:  # the cluster stopped answering: what was read is returned
        log.warning("%s: %s; the job view may be incomplete", topic, exc)
    return out, bad


def kafka_job_records(
    kafka_settings: Any,
    job_id: str,
    topic_prefix: str = "",
    *,
    from_ms: int = 0,
    slack_ms: int = 300_000,
    timeout_s: float = 10.0,
) -> JobRecords:
    """The records of ``job_id`` on the cluster (see the module doc). ``from_ms``: where to
    start reading the job's events (default: the topics' retention). Raises
    confluent_kafka.KafkaException when the cluster does not answer."""
    from confluent_kafka import Consumer

    from peerwatch.kafka_config import consumer_config

    consumer = Consumer(consumer_config(kafka_settings, f"peerwatch-job-{uuid.uuid4().hex[:8]}"))
    out = JobRecords()
    try:

        def read(
            spec: TopicSpec, keys: Iterable[str], lo: int, hi: int | None, fold: Any = None
        ) -> list[Any]:
            rows, bad = _kafka_read(
                consumer, topic_prefix + spec.name, keys, lo, hi, slack_ms, timeout_s, fold
            )
            out.undecodable += bad
            return rows

        out.job_events = read(JOB_EVENTS, [job_id], from_ms, None)
        start, end = out.span_ms(job_id)
        lo = from_ms if start is None else max(0, start - HOUR_MS)
        out.windows = read(JOB_WINDOWS, [job_id], lo, end)
        out.findings = read(STRAGGLERS, [job_id], lo, end)
        nodes = out.nodes(job_id) | {str(w.get("node")) for w in out.windows}
        # A drain or an alert may come a while after the job's last finding: no end bound.
        out.recommendations = read(RECOMMENDATIONS, nodes, lo, None)
        out.actions = read(ACTIONS, nodes, lo, None)
        out.node_events = read(NODE_EVENTS, nodes, lo, None)
        totals = _nic_totals(out, job_id)
        if totals is not None:
            read(NIC_SAMPLES, totals.nodes, lo, end, totals.add)
            out.nic_ports = totals.windows()
    finally:
        consumer.close()
    for name in ("windows", "findings", "recommendations", "actions", "node_events"):
        setattr(out, name, [r for r in getattr(out, name) if record_time_ms(r) is not None])
    return out
