"""The node GPU agent's loop: one NodeGpuSample per tick, XIDs published at once.

Scheduling (all times from the injected wall clock, int ms):

* Ticks fall on the wall-clock grid ``k * interval_ms`` (every node of the cluster samples at the
  same instants, which is what peer comparison wants). The next target is computed from the
  previous *target*, never from "now", so sampling time does not accumulate into drift.
* A tick that could not run in time (the process was stopped, the machine stalled) is skipped:
  the loop jumps to the latest grid point not after now and samples once. ``seq`` counts records,
  not grid points, so it stays contiguous; ``stats.missed_ticks`` counts what was skipped.
* An XID (from the watcher thread, through :meth:`NodeAgent.on_xid`) wakes the loop at once and
  produces an extra sample that carries it, with the next ``seq``; the regular grid continues
  unchanged. One record type therefore serves both "every interval" and "at once".
* A GPU that falls off the bus is reported LOST by the sampler; the loop does not notice.
* ``stop()`` (signal handlers call it) wakes the loop; ``run`` then stops the XID watcher and
  closes the sampler. The record sink is the caller's: it closes it after ``run`` returns.

Nothing here blocks on Kafka: the sink's ``send`` must return at once (``Delivery.send`` does).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from peerwatch.clock import Clock
from peerwatch.errors import CodecError
from peerwatch.producers.nvml.xid import XidBuffer, XidCallback

log = logging.getLogger(__name__)


class RecordSink(Protocol):
    """Where encoded records go. Must not block (``producers.delivery.Delivery`` fits)."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        ts_ms: int = 0,
    ) -> None: ...


class Sampler(Protocol):
    """Reads the node's GPUs into a NodeGpuSample dict (``nvml.sampler.GpuSampler`` fits)."""

    def sample(self, seq: int, xids: Iterable[dict[str, Any]] = ()) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Wakeup(Protocol):
    """An interruptible sleep (``threading.Event`` fits): ``wait`` returns early once ``set``."""

    def wait(self, timeout: float | None = None) -> bool: ...

    def set(self) -> None: ...

    def clear(self) -> None: ...


class XidSource(Protocol):
    """Something that calls back with XID events from its own thread (``XidWatcher`` fits)."""

    def start(self) -> list[int]: ...

    def stop(self, timeout_s: float | None = None) -> None: ...


Encoder = Callable[[Mapping[str, Any]], bytes]


@dataclass(frozen=True)
class TickChannel:
    """A second record published on every regular tick, after the GPU sample (the NIC sample):
    ``sample(seq, ts_ms)`` builds it with the tick's time, the GPU record's ``ts_ms``, so the two
    join on it (must not raise for bad input, ``NicSampler.sample`` fits); ``encode`` turns it
    into bytes, and it goes to ``topic`` under the node key. Its ``seq`` counts its own
    records."""

    sample: Callable[[int, int], dict[str, Any]]
    encode: Encoder
    topic: str


@dataclass
class AgentStats:
    """What one agent run did. ``cpu_ms`` is the loop thread's own CPU time (sample + encode +
    hand-off), not the Kafka client's threads."""

    records: int = 0
    ticks: int = 0
    xid_records: int = 0
    xid_events: int = 0
    missed_ticks: int = 0
    encode_errors: int = 0
    cpu_ms_total: float = 0.0
    cpu_ms_max: float = 0.0
    #: The tick channel's (NIC) records, failures and loop-thread CPU, apart from the GPU's.
    nic_records: int = 0
    nic_errors: int = 0
    nic_read_errors: int = 0
    nic_cpu_ms_total: float = 0.0

    @property
    def cpu_ms_per_record(self) -> float:
        return self.cpu_ms_total / self.records if self.records else 0.0


class NoGpuSampler:
    """Stands in for the GPU sampler on a node without NVML (``--allow-no-gpu``): every record
    has an empty ``gpus`` array, so a CPU node still heartbeats with contiguous ``seq``."""

    def __init__(self, node: str, interval_ms: int, clock: Clock, agent_run_id: str) -> None:
        self.node = node
        self.interval_ms = interval_ms
        self.agent_run_id = agent_run_id
        self._clock = clock

    def sample(self, seq: int, xids: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
        return {
            "node": self.node,
            "ts_ms": self._clock.now_ms(),
            "seq": seq,
            "agent_run_id": self.agent_run_id,
            "interval_ms": self.interval_ms,
            "driver_version": None,
            "gpus": [],
            "xids": list(xids),
        }

    def close(self) -> None:
        pass


def new_run_id() -> str:
    """A random agent run id (32 hex digits)."""
    return uuid.uuid4().hex


def first_target_ms(now_ms: int, interval_ms: int) -> int:
    """The first grid point ``k * interval_ms`` not before ``now_ms``."""
    return -(-now_ms // interval_ms) * interval_ms


def catch_up(target_ms: int, now_ms: int, interval_ms: int) -> tuple[int, int]:
    """(target to sample now, grid points skipped) when ``now_ms`` is at or past ``target_ms``:
    the latest grid point not after ``now_ms``, and how many earlier ones were missed."""
    missed = max(0, (now_ms - target_ms) // interval_ms)
    return target_ms + missed * interval_ms, missed


class NodeAgent:
    """Samples every ``interval_ms`` on the wall-clock grid and hands each record to ``sink``.

    ``encode`` turns a NodeGpuSample dict into bytes (``AvroCodec("NodeGpuSample").encode``).
    ``watcher_factory`` builds the XID source from the agent's callback (None: no XID watching).
    ``xid_listeners`` are also called with each XidEvent (e.g. to append it to a state file the
    health checks read); their exceptions are logged, never raised. ``channel`` (the NIC sample)
    is published on every regular tick after the GPU record; its failure is counted and logged
    and never stops the GPU records.
    """

    def __init__(
        self,
        *,
        sampler: Sampler,
        sink: RecordSink,
        encode: Encoder,
        topic: str,
        node: str,
        interval_ms: int,
        clock: Clock,
        wakeup: Wakeup | None = None,
        watcher_factory: Callable[[XidCallback], XidSource] | None = None,
        xid_listeners: Sequence[XidCallback] = (),
        cpu_time: Callable[[], float] = time.thread_time,
        channel: TickChannel | None = None,
    ) -> None:
        if interval_ms <= 0:
            raise ValueError(f"interval_ms must be positive, got {interval_ms}")
        self._sampler = sampler
        self._sink = sink
        self._encode = encode
        self.topic = topic
        self._key = node.encode()
        self.interval_ms = interval_ms
        self._clock = clock
        self._wakeup: Wakeup = wakeup if wakeup is not None else threading.Event()
        self._watcher_factory = watcher_factory
        self._xid_listeners = tuple(xid_listeners)
        self._cpu_time = cpu_time
        self._xids = XidBuffer()
        self._stop = threading.Event()
        self.next_seq = 0
        self._channel = channel
        self.next_channel_seq = 0
        self.stats = AgentStats()

    # -- called from other threads -------------------------------------------------------------
    def on_xid(self, event: dict[str, Any]) -> None:
        """Take one XidEvent (from the watcher thread): queue it and wake the loop at once."""
        self._xids.add(event)
        self._wakeup.set()
        for listener in self._xid_listeners:
            try:
                listener(event)
            except Exception:
                log.exception("XID listener failed for %s", event)

    def stop(self) -> None:
        """Ask ``run`` to return (safe from signal handlers and other threads)."""
        self._stop.set()
        self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- the loop ------------------------------------------------------------------------------
    def run(self, count: int | None = None) -> AgentStats:
        """Sample until ``stop()`` or, when ``count`` is given, after ``count`` regular ticks
        (XID-triggered extra samples do not count). Starts the XID watcher first and always stops
        it and closes the sampler before returning. Returns the run's statistics."""
        watcher = self._watcher_factory(self.on_xid) if self._watcher_factory else None
        try:
            if watcher is not None:
                watched = watcher.start()
                log.info("agent: watching XIDs on GPUs %s", watched or "none")
            self._loop(count)
        finally:
            try:
                if watcher is not None:
                    watcher.stop()
                # XIDs that arrived while stopping still deserve a record.
                late = self._xids.drain()
                if late:
                    self.stats.xid_records += 1
                    self._emit(late)
            finally:
                self._sampler.close()
        s = self.stats
        log.info(
            "agent stopped: %d records (%d ticks, %d XID records, %d missed ticks), "
            "CPU %.2f ms/record (max %.2f)",
            s.records, s.ticks, s.xid_records, s.missed_ticks, s.cpu_ms_per_record, s.cpu_ms_max,
        )  # fmt: skip
        return s

    def _loop(self, count: int | None) -> None:
        target_ms = first_target_ms(self._clock.now_ms(), self.interval_ms)
        while not self._stop.is_set() and (count is None or self.stats.ticks < count):
            # Clear before draining: an XID added after the drain sets the event again.
            self._wakeup.clear()
            now_ms = self._clock.now_ms()
            due = now_ms >= target_ms
            xids = self._xids.drain()
            if due:
                _, missed = catch_up(target_ms, now_ms, self.interval_ms)
                if missed:
                    log.warning(
                        "agent: %d ticks missed (loop late by %d ms)", missed, now_ms - target_ms
                    )
                    self.stats.missed_ticks += missed
                target_ms += (missed + 1) * self.interval_ms
                self.stats.ticks += 1
                tick_ms = self._emit(xids)
                if self._channel is not None and tick_ms is not None:
                    self._emit_channel(self._channel, tick_ms)
            elif xids:
                self.stats.xid_records += 1
                self._emit(xids)
            else:
                self._wakeup.wait((target_ms - now_ms) / 1000)

    def _emit(self, xids: list[dict[str, Any]]) -> int | None:
        """Sample, encode and send one record; its ``ts_ms``, None when it was dropped."""
        cpu0 = self._cpu_time()
        seq = self.next_seq
        # The seq is spent even if encoding fails: the gap shows the loss downstream.
        self.next_seq += 1
        record = self._sampler.sample(seq, xids)
        try:
            value = self._encode(record)
        except CodecError:
            self.stats.encode_errors += 1
            log.exception("agent: record seq %d does not fit the schema; dropped", seq)
            return None
        self._sink.send(self.topic, self._key, value, ts_ms=int(record["ts_ms"]))
        self.stats.records += 1
        self.stats.xid_events += len(xids)
        cpu_ms = (self._cpu_time() - cpu0) * 1000
        self.stats.cpu_ms_total += cpu_ms
        self.stats.cpu_ms_max = max(self.stats.cpu_ms_max, cpu_ms)
        return int(record["ts_ms"])

    def _emit_channel(self, channel: TickChannel, tick_ms: int) -> None:
        cpu0 = self._cpu_time()
        seq = self.next_channel_seq
        self.next_channel_seq += 1
        try:
            record = channel.sample(seq, tick_ms)
            value = channel.encode(record)
        except Exception:
            # A sampler bug or a record that does not fit the schema: the GPU records go on.
            self.stats.nic_errors += 1
            log.exception("agent: %s record seq %d failed; dropped", channel.topic, seq)
            return
        self._sink.send(channel.topic, self._key, value, ts_ms=tick_ms)
        self.stats.nic_records += 1
        self.stats.nic_read_errors += int(record.get("read_errors") or 0)
        self.stats.nic_cpu_ms_total += (self._cpu_time() - cpu0) * 1000


class JsonLinesSink:
    """A sink for ``--dry-run``: decodes each record and writes it as one JSON line.

    ``decode`` decodes every topic's records except those named in ``by_topic``."""

    def __init__(
        self,
        decode: Callable[[bytes], dict[str, Any]],
        out: IO[str],
        by_topic: Mapping[str, Callable[[bytes], dict[str, Any]]] | None = None,
    ) -> None:
        self._decode = decode
        self._out = out
        self._by_topic = dict(by_topic or {})

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
        ts_ms: int = 0,
    ) -> None:
        decode = self._by_topic.get(topic, self._decode)
        self._out.write(json.dumps(decode(value), sort_keys=True) + "\n")
        self._out.flush()
