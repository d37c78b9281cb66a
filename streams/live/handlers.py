"""What the live worker's faust agents (stages 3 and 4) do with one Kafka message, without faust.

The agents in :mod:`~peerwatch.streams.live.app` only read messages, hand each message's topic,
partition, key and value bytes to :meth:`JobsHandler.handle` / :meth:`PolicyHandler.handle`, send
the outputs these return, and dead-letter the message when its handling raises one of
:data:`RECORD_ERRORS`: each message is hostile input (any key, no key, any bytes), and anything
else escaping would stop the agent. The state tables are the agents' changelog-backed faust
tables (any mutable mapping here; plain dicts in the input fuzzer, scripts/fuzz_inputs.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, MutableMapping
from typing import Any, NamedTuple

from peerwatch.errors import CodecError
from peerwatch.schemas.codec import AvroCodec
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.fleet import FLEET_CHANNEL, FleetVerdicts, FleetWatch, SourceCensus
from peerwatch.streams.core.job_stage import (
    JobReleaser,
    PendingEntry,
    Released,
    batches_of_message,
)
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.network_jobs import NETWORK_KIND, JobNetwork
from peerwatch.streams.core.policy_stage import PolicyStage
from peerwatch.streams.core.policy_state import NodePolicyState
from peerwatch.streams.live.job_network import LiveJobNetwork
from peerwatch.streams.live.window_batches import WindowBatchCodec, is_window_batch

log = logging.getLogger(__name__)

#: What the handling of one bad message may raise: the agent dead-letters the message (reason
#: ``invalid``) and goes on. OverflowError: a JSON number beyond an int (``1e999`` is infinity).
RECORD_ERRORS: tuple[type[Exception], ...] = (
    CodecError, InvalidRecordError, KeyError, ValueError, TypeError, OverflowError,
)  # fmt: skip

#: What restoring a damaged saved state may raise (its values of the wrong type too).
STATE_ERRORS: tuple[type[Exception], ...] = (*RECORD_ERRORS, AttributeError)

#: How often stage 3 walks its pending table for jobs pending from before a restart.
PENDING_SCAN_EVERY_S = 5.0


def key_text(key: Any) -> str:
    """A record key as text. Raises ValueError for a missing or non-UTF-8 key (dead-lettered by
    the agents, which go on)."""
    if key is None:
        raise ValueError("record without a key")
    if not isinstance(key, bytes):
        raise TypeError(f"record key of type {type(key).__name__}")
    return key.decode()


def json_object(value: Any) -> dict[str, Any]:
    """The JSON object of an internal topic's message value. Raises ValueError for anything else
    (not UTF-8, not JSON, nested too deep, not an object)."""
    if not isinstance(value, bytes | bytearray):
        raise TypeError(f"value of type {type(value).__name__}")
    try:
        out = json.loads(value)
    except RecursionError:  # json.loads recurses: a hostile value nests thousands deep
        raise ValueError("JSON nested too deep") from None
    if not isinstance(out, dict):
        raise ValueError(f"JSON {type(out).__name__}, not an object")
    return out


def watermarks(message: dict[str, Any]) -> dict[int, int]:
    """Source -> closed until (ms) of a heartbeat message: ``marks`` (one per source that closed
    windows in a hot batch), or one ``src`` and its ``closed_until_ms`` (older workers). Raises
    KeyError, ValueError or TypeError for a malformed one."""
    if "marks" not in message:
        return {int(message["src"]): int(message["closed_until_ms"])}
    marks = message["marks"]
    if not isinstance(marks, dict):
        raise TypeError(f"watermark marks of type {type(marks).__name__}")
    return {int(src): int(until) for src, until in marks.items()}


def pending_entry(channel: int, message: bytes) -> bytes:
    """A pending-table entry: the batch message as it came (no second encoding of its windows)
    after the stage-3 partition it came on, ``b"<channel>\\n<message>"``."""
    return b"%d\n" % channel + message


def pending_message(entry: Any) -> dict[str, Any]:
    """A pending-table entry as the batch message it holds, with its ``channel``
    (:func:`pending_entry`). Entries of older versions still read: JSON objects holding the
    message's text under ``raw``, or the message's fields themselves. Raises ValueError or
    TypeError for a damaged entry."""
    if isinstance(entry, bytes | bytearray):
        if entry[:1] == b"{":  # an older version's entry, JSON
            entry = json_object(entry)
        else:
            head, sep, body = bytes(entry).partition(b"\n")
            if not sep or not head.isdigit() or len(head) > 9:
                raise ValueError("pending entry without its channel")
            return {**json_object(body), "channel": int(head)}
    if not isinstance(entry, dict):
        raise TypeError(f"pending entry of type {type(entry).__name__}")
    if "raw" not in entry:
        return dict(entry)
    raw = entry["raw"]
    if not isinstance(raw, str):
        raise TypeError(f"pending entry text of type {type(raw).__name__}")
    message = json_object(raw.encode())
    return {**message, "channel": entry.get("channel")}


#: The ``job_table`` key of a channel's fleet watch memory, or of the verdicts it holds (no job
#: id starts with "~").
FLEET_KEY = "~fleet|{channel}"
#: The key of a fleet verdict message (channel FLEET_CHANNEL to the others).
VERDICT_KEY = b"~fleet"


class Output(NamedTuple):
    """One record to send: ``topic`` is ``windows``, ``stragglers`` (Avro bytes), ``findings``
    (the JSON-serialised dict for the internal topic keyed by node) or ``batches`` (a fleet
    verdict, a JSON-serialised dict too, to the window-batches ``partition``);
    ``closed_wall_ms``: when the window closed in the hot stage (finding latency), else None.
    A named tuple: one is made per GPU window."""

    topic: str
    key: bytes
    value: Any
    closed_wall_ms: float | None = None
    partition: int | None = None


class HeldBatch(NamedTuple):
    """A pending window batch kept in memory only: the stage-3 ``channel`` it came on, its
    message ``value`` and ``offset`` on the window-batches topic, and since when it waits
    (monotonic s)."""

    channel: int
    value: bytes
    offset: int
    since_s: float


class JobsHandler:
    """Stage 3 (job events, window batches and step times, key job): the pure
    :class:`~peerwatch.streams.core.job_stage.JobReleaser` fed one message at a time, its state
    kept in ``job_table`` (job -> state and latest job events) and ``pending_table`` (one entry
    per pending (job, window, source)).

    Held batches: a caller that passes each window batch's ``offset`` to :meth:`handle`, and
    commits no offset of a channel past its :meth:`commit_floor`
    (:mod:`~peerwatch.streams.live.commit_floor`), lets a pending batch wait in memory only; it
    is written to the pending table at the first heartbeat or verdict of its channel after
    ``hold_s`` (``stream.pending_hold_s``). Most batches are released by the heartbeat or
    verdict that follows them and never reach the changelog (writing each there, and a
    tombstone after it, cost about a tenth of the worker's CPU); a crash meanwhile re-reads the
    message from the committed offset. Without an offset, a pending batch is written at once.

    Censuses waiting to be judged (channel FLEET_CHANNEL) hold that channel's commit floor the
    same way, until the fleet watch judged their window start: the watch keeps only what it
    judged in ``job_table``, so a rebalance or a crash before the judgement reads them again
    (else the next owner judges that start without them: another decision than replay's)."""

    def __init__(
        self,
        releaser: JobReleaser,
        job_meta: AllocationTable,
        job_table: MutableMapping[bytes, Any],
        pending_table: MutableMapping[bytes, Any],
        *,
        job_events_topic: str,
        step_times_topic: str,
        retention_ms: int,
        counters: Any,
        channels: int = 1,
        monotonic_s: Callable[[], float] = time.monotonic,
        network: JobNetwork | None = None,
        hold_s: float = 0.0,
    ) -> None:
        """``network``: stage 3's network comparison (default: one with default settings);
        ``hold_s``: how long a pending batch with an offset stays in memory only (s, see the
        class)."""
        self.hold_s = hold_s
        self.stage3 = releaser
        self.job_meta = job_meta
        self.job_table = job_table
        self.pending_table = pending_table
        self.job_events_topic = job_events_topic
        self.step_times_topic = step_times_topic
        self.retention_ms = retention_ms
        self.counters = counters
        #: stage-3 channels (window-batches partitions): the fleet verdicts go to the others
        self.channels = channels
        self.monotonic_s = monotonic_s
        #: The jobs' network compared at each released window (network messages held first).
        self.network = LiveJobNetwork(network or JobNetwork(), job_table, counters)
        self.codecs = {n: AvroCodec(n) for n in ("JobEvent", "StepTime", "GpuWindow",
                                                 "StragglerFinding")}  # fmt: skip
        self._pending_scan_s = 0.0  # monotonic s of the next walk of the pending table
        #: (job, window start) -> wall ms when the last samples partition closed it (latency).
        self.closed_wall: dict[tuple[str, int], float] = {}
        self.batch_codec = WindowBatchCodec()
        #: Channels whose fleet watch was recovered from ``job_table`` (:meth:`fleet`).
        self._fleet_restored: set[int] = set()
        #: Pending batches in memory only, their offsets not to be committed (see the class).
        self.held: dict[PendingEntry, HeldBatch] = {}
        #: Window start -> the offset of its first census on FLEET_CHANNEL, while not judged.
        self.census_offsets: dict[int, int] = {}

    def forget(self) -> None:
        """Partitions were revoked (a rebalance; faust's eager protocol revokes them all): forget
        what memory holds of every job. A job handed back after another worker held it would
        otherwise be released from stale memory, without the batches that worker kept pending
        in the table. Each job is restored from the tables at its next message; the next
        heartbeat walks the pending table for jobs that get no batch."""
        self.stage3.forget()
        self.network.forget()
        self.closed_wall.clear()
        self._pending_scan_s = 0.0
        self._fleet_restored.clear()
        # Their offsets were not committed (faust commits before it tells of a revocation):
        # whoever gets their partitions reads them again.
        self.held.clear()
        self.census_offsets.clear()

    def fleet(self, channel: int) -> FleetWatch | FleetVerdicts:
        """The fleet watch (channel FLEET_CHANNEL) or the verdicts of another channel, recovered
        from ``job_table`` (key :data:`FLEET_KEY`) at its first use in this process (after a
        restart or rebalance)."""
        watch = self.stage3.decisions(channel)
        if channel in self._fleet_restored:
            return watch
        self._fleet_restored.add(channel)
        key = FLEET_KEY.format(channel=channel).encode()
        saved = self.job_table.get(key)
        if saved:
            try:
                watch.restore(saved)
            except STATE_ERRORS as exc:  # damaged: dropped, the watch learns again
                self.counters.state_damaged += 1
                log.warning("stage 3: saved fleet watch of channel %d dropped: %s", channel, exc)
                self.job_table.pop(key, None)
        return watch

    def _keep_fleet(self, channel: int) -> None:
        """Write the channel's fleet watch, or verdicts, to ``job_table``."""
        held = self.stage3.decisions(channel)
        self.job_table[FLEET_KEY.format(channel=channel).encode()] = held.to_dict()

    def _judged(self, judged_before: int | None) -> list[Output]:
        """After a heartbeat on the judging channel: when the fleet watch judged a window start,
        its state kept and its verdict to every other channel (one message each)."""
        watch = self.stage3.fleet()
        if watch.last_start_ms == judged_before:
            return []
        self._keep_fleet(FLEET_CHANNEL)
        verdict = watch.verdict(judged_before)  # JSON on the topic (faust's serializer)
        return [Output("batches", VERDICT_KEY, verdict, partition=q)
                for q in range(self.channels) if q != FLEET_CHANNEL]  # fmt: skip

    def restore(self, job_id: str) -> None:
        """First sight of the job in this process: recover its state from the tables."""
        if self.stage3.seen(job_id):
            return
        saved = self.job_table.get(job_id.encode()) or {}
        pending = []
        for held, b in self.pending_entries():
            if not b or held.job_id != job_id:
                continue
            try:
                pending.append(self.read_pending(b))
            except (CodecError, ValueError, TypeError) as exc:  # damaged: dropped, rest kept
                self.counters.pending_damaged += 1
                log.warning("stage 3: pending entry %r dropped: %s", held.key, exc)
                self.pending_table.pop(held.key.encode(), None)
        try:
            for ev in saved.get("events") or []:
                self.job_meta.apply_event(ev)
            stale = self.stage3.restore(job_id, saved, pending)
        except STATE_ERRORS as exc:
            if not saved:
                raise  # the pending messages (read_pending took their bytes)
            # The job's saved state is damaged: dropped, the job goes on without it.
            self.counters.state_damaged += 1
            log.warning("stage 3: saved state of job %s dropped: %s", job_id, exc)
            self.job_table.pop(job_id.encode(), None)
            stale = self.stage3.restore(job_id, {}, pending)
        for entry in stale:
            self.pending_table.pop(entry.key.encode(), None)

    def pending_entries(self) -> list[tuple[PendingEntry, Any]]:
        """The pending table's entries by key; a key that is not an entry's (damaged) is
        counted, logged and deleted (it would fail every walk of the table)."""
        out = []
        for key, value in list(self.pending_table.items()):
            try:
                out.append((PendingEntry.from_key(key.decode()), value))
            except (ValueError, AttributeError) as exc:
                self.counters.pending_damaged += 1
                log.warning("stage 3: pending key %r dropped: %s", key[:80], exc)
                self.pending_table.pop(key, None)
        return out

    def read_pending(self, entry: Any) -> dict[str, Any]:
        """A pending-table entry as its batch message (with ``channel``). Raises CodecError,
        ValueError or TypeError for a damaged entry."""
        if isinstance(entry, bytes | bytearray):
            head, sep, body = bytes(entry).partition(b"\n")
            if sep and head.isdigit() and len(head) <= 9 and is_window_batch(body):
                return {**self.batch_codec.decode_batch(body), "channel": int(head)}
        return pending_message(entry)

    def commit_floor(self, channel: int) -> int | None:
        """The lowest window-batches offset of ``channel`` held in memory only: no offset past it
        may be committed (None: no limit)."""
        offsets = [h.offset for h in self.held.values() if h.channel == channel]
        if channel == FLEET_CHANNEL and self.census_offsets:
            watch = self.stage3.fleets.get(FLEET_CHANNEL)
            waiting = watch.waiting if isinstance(watch, FleetWatch) else {}
            for start in [s for s in self.census_offsets if s not in waiting]:  # judged
                del self.census_offsets[start]
            offsets += self.census_offsets.values()
        return min(offsets) if offsets else None

    def handle(
        self, topic: str, partition: int, key: Any, value: Any, offset: int | None = None
    ) -> list[Output]:
        """Handle one message; returns the records to send. ``offset``: the message's (a
        pending window batch then waits in memory, see the class; None: it is written to the
        pending table at once). Raises one of :data:`RECORD_ERRORS` for a message it cannot use
        (the agent dead-letters it)."""
        if topic == self.step_times_topic:
            step = self.codecs["StepTime"].decode(_bytes(value))
            self.counters.step_times += 1
            self.restore(str(step["job_id"]))
            self.stage3.add_step(step)
            return []
        if topic == self.job_events_topic:
            job_id = key_text(key)
            self.restore(job_id)
            job = self.codecs["JobEvent"].decode(_bytes(value))
            self.job_meta.apply_event(job)
            saved = dict(self.job_table.get(key) or {})
            saved["events"] = [*(saved.get("events") or []), job][-8:]
            self.job_table[key] = saved
            return []
        binary = isinstance(value, bytes | bytearray) and is_window_batch(value)
        # JSON: a heartbeat, or a window batch of an older worker
        b = self.batch_codec.decode_batch(bytes(value)) if binary else json_object(value)
        if b.get("kind") == "census":  # a source's fleet census of a window start
            if partition != FLEET_CHANNEL:
                return []  # an older hot stage sent it to every channel: judged on one only
            census = b["census"]
            if not isinstance(census, dict):
                raise TypeError(f"census of type {type(census).__name__}")
            seen = {str(n): SourceCensus.from_json(c) for n, c in census.items()}
            watch = self.fleet(partition)
            start = int(b["start"])
            self.stage3.census(int(b["src"]), start, int(b["end"]), seen)
            if offset is not None and isinstance(watch, FleetWatch) and start in watch.waiting:
                self.census_offsets.setdefault(start, offset)  # read again until judged
            return []
        if b.get("kind") == NETWORK_KIND:  # a job's ports over a window, before its batches
            self.network.add(b)
            return []
        if b.get("kind") in ("fleet", "watermark"):
            self._write_held(partition, self.monotonic_s() - self.hold_s)
        if b.get("kind") == "fleet":  # the judging channel's verdict
            self.fleet(partition)
            released = self.stage3.verdict(b, partition)
            self._keep_fleet(partition)
            return self.outputs(released)
        if b.get("kind") == "watermark":
            # Jobs with windows pending from before a restart (or a rebalance) and no batch
            # since: the table is walked every few seconds, not at every heartbeat (there are
            # several per batch, and the table can be large).
            now_s = self.monotonic_s()
            if now_s >= self._pending_scan_s:
                self._pending_scan_s = now_s + PENDING_SCAN_EVERY_S
                for entry, _ in self.pending_entries():
                    self.restore(entry.job_id)
                # Ended jobs are forgotten here as in replay (Pipeline._closed_to).
                low_ms = self.stage3.low_watermark_ms()
                if low_ms is not None:
                    self.job_meta.prune(low_ms)
                    self.stage3.prune(low_ms, self.retention_ms)
                    self.network.prune(low_ms - self.retention_ms)
            decides = self.fleet(partition)
            judges = isinstance(decides, FleetWatch)
            judged_before = decides.last_start_ms if isinstance(decides, FleetWatch) else None
            released = self.stage3.heartbeats(watermarks(b), channel=partition)
            verdicts = self._judged(judged_before) if judges else []
            return self.fleet_outputs(released) + verdicts + self.outputs(released)
        parts = batches_of_message(b)
        if not binary:
            bytes(value).decode()  # JSON in UTF-16 or -32 parses, but is not kept (ValueError)
        wall = b.get("closed_wall_ms")
        wall_ms = None if wall is None else float(wall)
        job_id, start = parts[0][0].job_id, parts[0][0].window_start_ms
        self.restore(job_id)
        self.counters.last_window_batch_wall_s = time.time()
        held = [src for batch, srcs in parts if self.stage3.add(batch, srcs, channel=partition)
                for src in srcs]  # fmt: skip
        if not held:
            return []  # a window already released (re-sent after a hot-stage restart)
        if wall_ms is not None:
            before = self.closed_wall.get((job_id, start), 0.0)
            self.closed_wall[(job_id, start)] = max(before, wall_ms)
        # The message as it came (no second encoding of every window; see restore), once,
        # under its first source: the window's sources are retired together. A batch that
        # completes its window is released here and now: keeping it would only send it to the
        # changelog and a tombstone after it (most batches of a worker that keeps up).
        entry = PendingEntry(job_id, start, min(held))
        released = self.stage3.release(job_id)
        if entry not in released.retired:
            if offset is None:
                self.pending_table[entry.key.encode()] = pending_entry(partition, bytes(value))
            else:  # in memory until released, or written after hold_s (see the class)
                older = self.held.get(entry)  # re-sent: the newer message stands for it
                since_s = self.monotonic_s() if older is None else older.since_s
                low = offset if older is None else min(older.offset, offset)
                self.held[entry] = HeldBatch(partition, bytes(value), low, since_s)
        return self.outputs(released)

    def _write_held(self, channel: int, before_s: float) -> None:
        """Write the batches of ``channel`` held in memory since ``before_s`` or earlier
        (monotonic s) to the pending table; their offsets may then be committed. Called while
        handling a message of that channel: faust writes a table entry to the changelog
        partition of the message being handled."""
        for entry, held in list(self.held.items()):
            if held.channel == channel and held.since_s <= before_s:
                self.pending_table[entry.key.encode()] = pending_entry(channel, held.value)
                del self.held[entry]

    def fleet_outputs(self, released: Released) -> list[Output]:
        """The fleet findings a heartbeat judged (on channel FLEET_CHANNEL, the only one that
        judges: DETECTION.md item 12, one FLEET_WIDE finding however many partitions)."""
        out = []
        for f in released.fleet:
            self.counters.fleet_findings += 1
            value = self.codecs["StragglerFinding"].encode(f)
            out.append(Output("stragglers", str(f["job_id"]).encode(), value))
        return out

    def outputs(self, released: Released) -> list[Output]:
        """Keep what ``released`` changed in the tables; its windows and findings, encoded."""
        for entry in released.retired:
            if self.held.pop(entry, None) is None:  # held ones were never written
                self.pending_table.pop(entry.key.encode(), None)
        for job_id, state in released.saved.items():
            old = self.job_table.get(job_id.encode()) or {}
            self.job_table[job_id.encode()] = {**old, **state}
        out: list[Output] = []
        for r in released.releases:
            key = r.context.job_id.encode()
            closed_ms = self.closed_wall.pop((r.context.job_id, r.window_start_ms), None)
            if r.result.scored is not None:
                scored = self.batch_codec.scored(r.result.scored)
                self.counters.windows += len(scored)
                out += [Output("windows", key, value) for value in scored]
            for f, copies in zip(r.result.findings, r.to_nodes, strict=True):
                self.counters.findings += 1
                value = self.codecs["StragglerFinding"].encode(f)
                out.append(Output("stragglers", key, value, closed_ms))
                out.extend(Output("findings", str(c["node"]).encode(), c) for c in copies)
            for f in self.network.release(r, self.stage3.settings.window_ms):
                self.counters.findings += 1
                out.append(Output("stragglers", key, self.codecs["StragglerFinding"].encode(f)))
                out.append(Output("findings", str(f["node"]).encode(), dict(f)))
        return out


class PolicyHandler:
    """Stage 4 (findings, health results and node events, key node): the pure
    :class:`~peerwatch.streams.core.policy_stage.PolicyStage`, each node's state kept in
    ``policy_table``."""

    def __init__(
        self,
        policy: PolicyStage,
        policy_table: MutableMapping[bytes, Any],
        *,
        findings_topic: str,
        health_topic: str,
        counters: Any,
    ) -> None:
        self.policy = policy
        self.policy_table = policy_table
        self.findings_topic = findings_topic
        self.health_topic = health_topic
        self.counters = counters
        self.loaded_nodes: set[str] = set()
        self.codecs = {n: AvroCodec(n) for n in ("HealthCheckResult", "NodeStateEvent",
                                                 "DrainRecommendation")}  # fmt: skip

    def forget(self) -> None:
        """Partitions were revoked (a rebalance): forget every node's state; each is read from
        the table again at its next message (another worker may have changed it meanwhile)."""
        self.policy.state.nodes.clear()
        self.loaded_nodes.clear()

    def handle(self, topic: str, key: Any, value: Any) -> list[tuple[bytes, bytes]]:
        """Handle one message; returns the DrainRecommendations to send, (key, Avro bytes).
        Raises one of :data:`RECORD_ERRORS` for a message it cannot use (the agent
        dead-letters it)."""
        node = key_text(key)  # no key, or not UTF-8: nothing to key the node's state by
        if node not in self.loaded_nodes:
            saved = self.policy_table.get(key)
            if saved:
                try:
                    self.policy.state.nodes[node] = NodePolicyState.from_dict(saved)
                except STATE_ERRORS as exc:
                    self.counters.state_damaged += 1  # the node starts afresh
                    log.warning("stage 4: saved state of node %r dropped: %s", node, exc)
                    self.policy_table.pop(key, None)
            self.loaded_nodes.add(node)
        record: Any
        if topic == self.findings_topic:
            record = json_object(value)
        elif topic == self.health_topic:
            record = self.codecs["HealthCheckResult"].decode(_bytes(value))
        else:
            record = self.codecs["NodeStateEvent"].decode(_bytes(value))
        recs = self.policy.apply(record)
        if node in self.policy.state.nodes:
            self.policy_table[key] = self.policy.state.nodes[node].to_dict()
        out = []
        for r in recs:
            self.counters.recommendations += 1
            out.append((str(r["node"]).encode(), self.codecs["DrainRecommendation"].encode(r)))
        return out


def _bytes(value: Any) -> bytes:
    """A message value for a decoder: a missing one is empty (undecodable, dead-lettered)."""
    if value is None:
        return b""
    if not isinstance(value, bytes):
        raise TypeError(f"value of type {type(value).__name__}")
    return value
