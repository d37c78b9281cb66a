"""The watcher's loop: read Slurm, :func:`~peerwatch.producers.slurm.watcher.diff`, publish, persist.

The state file is written (atomically: temporary file, fsync, rename) only after the poll's
events were handed to the sink, so a crash in between republishes those events with the same
ids, and a clean restart publishes nothing new.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from peerwatch.errors import CodecError, PeerwatchError
from peerwatch.files import write_atomic
from peerwatch.producers.slurm.client import SlurmClient
from peerwatch.producers.slurm.parse import (
    Skipped,
    SlurmNode,
    parse_sacct_jobs,
    parse_sinfo_nodes,
    parse_squeue_jobs,
)
from peerwatch.producers.slurm.watcher import (
    WatchEvent,
    WatchState,
    diff,
    restart_counts,
    vanished_jobs,
)

log = logging.getLogger(__name__)

__all__ = [
    "EventSink",
    "JsonLinesSink",
    "KafkaSink",
    "StateFile",
    "WatchStats",
    "poll_once",
    "run_watch",
    "topic_names",
]

#: How far back sacct is asked about a vanished job beyond its submit/start time.
SACCT_MARGIN_MS = 3_600_000


class EventSink(Protocol):
    def publish(self, event: WatchEvent) -> None: ...


class JsonLinesSink:
    """``--dry-run``: one JSON object per event (``topic``, ``key``, ``value``) on ``out``."""

    def __init__(self, out: TextIO, topics: dict[str, str]) -> None:
        self._out = out
        self._topics = topics

    def publish(self, event: WatchEvent) -> None:
        line = {"topic": self._topics[event.schema], "key": event.key, "value": event.record}
        self._out.write(json.dumps(line, sort_keys=True) + "\n")
        self._out.flush()


class StateFile:
    """The persisted :class:`WatchState` (JSON)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> WatchState:
        """The saved state; empty when the file does not exist. An unreadable file is renamed
        ``*.corrupt`` and an empty state returned (events are then republished with the same
        ids). Raises OSError for I/O failures other than a missing file."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return WatchState()
        try:
            return WatchState.from_json(json.loads(text))
        except ValueError as exc:
            bad = self.path.with_suffix(self.path.suffix + ".corrupt")
            log.error("watch state %s unreadable (%s); moved to %s", self.path, exc, bad)
            os.replace(self.path, bad)
            return WatchState()

    def save(self, state: WatchState) -> None:
        """Replace the file atomically. Raises OSError."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(state.to_json(), separators=(",", ":")).encode())


@dataclass
class WatchStats:
    """What the watcher skipped: jobs and nodes Slurm listed that could not be read (each
    skipped alone, with a warning naming it), events that could not be published (a value no
    record holds), and polls that failed whole."""

    polls: int = 0
    skipped_jobs: int = 0
    skipped_nodes: int = 0
    unpublishable: int = 0
    failed_polls: int = 0


def poll_once(
    client: SlurmClient, state: WatchState, now_ms: int, vanish_grace_ms: int = 600_000,
    stats: WatchStats | None = None,
) -> tuple[WatchState, list[WatchEvent]]:  # fmt: skip
    """Read squeue and the nodes (and sacct when jobs vanished); return the new state and events.

    Raises SlurmCommandError / SlurmParseError when squeue cannot be read (nothing changes
    then). A job or node entry that cannot be read is skipped (counted in ``stats``, a warning
    naming it) and what was reported about it kept; the others are read. A failing node read
    leaves node state as it was; a failing sacct lets vanished jobs wait (closed with state
    None after ``vanish_grace_ms``)."""
    stats = stats if stats is not None else WatchStats()
    squeue_doc = client.squeue_json()
    jobs, bad_jobs = parse_squeue_jobs(squeue_doc)
    _note_skipped("squeue job", bad_jobs)
    stats.skipped_jobs += len(bad_jobs)
    restarts = restart_counts(squeue_doc)
    bad_nodes: list[Skipped] = []
    nodes: list[SlurmNode] | None
    try:
        nodes, bad_nodes = parse_sinfo_nodes(client.nodes_json())
    except PeerwatchError as exc:
        log.warning("watch: node states not read: %s", exc)
        nodes = None
    _note_skipped("node", bad_nodes)
    stats.skipped_nodes += len(bad_nodes)
    held = frozenset(b.ident for b in bad_jobs if b.ident is not None)
    accounted = None
    gone = vanished_jobs(state, jobs, held)
    if gone:
        times = [t for i in gone for t in (state.jobs[i].submit_ms, state.jobs[i].start_ms) if t]
        since_ms = min(times, default=now_ms) - SACCT_MARGIN_MS
        try:
            acct, bad_acct = parse_sacct_jobs(client.sacct_json(since_ms))
            _note_skipped("sacct job", bad_acct)
            stats.skipped_jobs += len(bad_acct)
            accounted = [j for j in acct if j.job_id in gone]
        except PeerwatchError as exc:
            log.warning("watch: sacct failed for vanished jobs %s: %s", gone, exc)
            accounted = []
    return diff(
        state, jobs, nodes, now_ms,
        restarts=restarts, accounted=accounted, vanish_grace_ms=vanish_grace_ms,
        held_jobs=held, held_nodes=frozenset(b.ident for b in bad_nodes if b.ident is not None),
    )  # fmt: skip


def _note_skipped(what: str, skipped: list[Skipped]) -> None:
    for b in skipped:
        log.warning("watch: %s %r skipped: %s", what, b.ident, b.reason)


def run_watch(
    client: SlurmClient,
    sink: EventSink,
    state_file: StateFile | None,
    *,
    interval_s: float = 10.0,
    once: bool = False,
    stop: threading.Event | None = None,
    clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    state: WatchState | None = None,
    stats: WatchStats | None = None,
) -> WatchState:
    """Poll every ``interval_s`` seconds until ``stop`` is set (or once). Returns the last state.

    Without ``state_file`` (dry run) the state lives in memory only. With ``once`` a Slurm
    error is raised (SlurmCommandError / SlurmParseError); in the loop it is logged and the
    poll retried at the next interval. ``stats``: what was skipped (see :class:`WatchStats`)."""
    stop = stop or threading.Event()
    stats = stats if stats is not None else WatchStats()
    if state is None:
        state = state_file.load() if state_file else WatchState()
    while True:
        started = time.monotonic()
        stats.polls += 1
        try:
            new_state, events = poll_once(client, state, clock_ms(), stats=stats)
        except PeerwatchError as exc:
            stats.failed_polls += 1
            if once:
                raise
            log.warning("watch: poll failed: %s", exc)
        else:
            for event in events:
                try:
                    sink.publish(event)
                except CodecError as exc:  # a value no record holds: that event only
                    stats.unpublishable += 1
                    log.warning("watch: %s event for %r not published: %s", event.schema,
                                event.key, exc)  # fmt: skip
            if events:
                log.info("watch: published %d events", len(events))
            if state_file is not None and new_state != state:
                state_file.save(new_state)
            state = new_state
        if once or stop.wait(max(0.0, interval_s - (time.monotonic() - started))):
            return state


def topic_names(prefix: str) -> dict[str, str]:
    """Schema name -> topic name (with the settings' prefix) for the two watcher topics."""
    from peerwatch.topics import JOB_EVENTS, NODE_EVENTS

    return {
        "JobEvent": prefix + JOB_EVENTS.name,
        "NodeStateEvent": prefix + NODE_EVENTS.name,
    }


def describe(events: list[WatchEvent]) -> list[dict[str, Any]]:
    """Short summaries of events for logs and test failure messages."""
    return [
        {"key": e.key, **{k: e.record.get(k) for k in ("kind", "state", "node")}} for e in events
    ]


class KafkaSink:
    """Publishes through a non-blocking ``send(topic, key, value, ts_ms=...)`` (``Delivery``).

    ``encode(schema_name, record)`` gives the wire bytes (``AvroCodec(...).encode``)."""

    def __init__(
        self,
        send: Callable[..., None],
        encode: Callable[[str, Mapping[str, Any]], bytes],
        topics: dict[str, str],
    ) -> None:
        self._send = send
        self._encode = encode
        self._topics = topics

    def publish(self, event: WatchEvent) -> None:
        value = self._encode(event.schema, event.record)
        self._send(
            self._topics[event.schema], event.key.encode(), value, ts_ms=event.record["ts_ms"]
        )
