"""The live worker's stage 3 and 4 message handling (streams/live/handlers.py, what the faust
agents call) with hostile messages found by the input fuzzer (scripts/fuzz_inputs.py, target
kafka): each is refused with one of RECORD_ERRORS, which the agent dead-letters before going on;
nothing else escapes. Also the dead letters over the producers' size limit."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from peerwatch.exporters.archive import ArchiveWriter
from peerwatch.exporters.archive_loop import ArchiveLoop
from peerwatch.exporters.consume import ExportLoop
from peerwatch.io.deadletter import KafkaDeadLetter, produce_dead_letter
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import Settings
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.job_stage import JobReleaser
from peerwatch.streams.core.policy_stage import PolicyStage
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.handlers import (
    RECORD_ERRORS,
    JobsHandler,
    PolicyHandler,
    json_object,
    key_text,
)

T0 = 1_767_225_600_000
JOB = {"event_id": "e1", "job_id": "7", "kind": "STARTED", "ts_ms": T0, "source": "SIMULATOR",
       "state": "RUNNING", "exit_code": None, "user": "u", "partition": "gpu", "account": "a",
       "job_name": "n", "allocations": [{"node": "gpu00001", "gpu_indices": [0, 1]}],
       "start_ms": T0, "end_ms": None, "restart_count": 0}  # fmt: skip


def jobs_handler(channels: int = 1) -> tuple[JobsHandler, dict[bytes, Any], dict[bytes, Any]]:
    settings = Settings()
    meta = AllocationTable(3_600_000)
    job_table: dict[bytes, Any] = {}
    pending: dict[bytes, Any] = {}
    handler = JobsHandler(
        JobReleaser(settings.detector, meta), meta, job_table, pending,
        job_events_topic="je", step_times_topic="st", retention_ms=3_600_000,
        counters=StreamCounters(), channels=channels,
    )  # fmt: skip
    return handler, job_table, pending


@pytest.mark.parametrize(
    "value",
    [
        b"[]",  # not an object: b.get raised AttributeError, which stopped the agent
        b'"watermark"',
        b"null",
        b"[" * 100_000,  # json.loads recursed into RecursionError, which stopped the agent
        b'{"kind": "watermark", "src": 0, "closed_until_ms": 1e999}',  # int(inf): OverflowError
        b'{"kind": "watermark", "marks": [1, 2]}',
        b'{"kind": "watermark", "marks": {"x": 5000}}',
        b'{"kind": "watermark", "marks": {"0": null}}',
        b'{"kind": "watermark", "marks": {"0": 1e999}}',
        b"\xff\xfe",
        b"",
    ],
)
def test_a_hostile_window_batch_is_refused_with_a_record_error(value: bytes) -> None:
    handler, _, pending = jobs_handler()
    with pytest.raises(RECORD_ERRORS):
        handler.handle("b", 0, b"7", value)
    assert pending == {}


def test_one_heartbeat_of_several_sources_releases_their_pending_windows() -> None:
    import json

    from windowgen import window

    handler, _, pending = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    for src, node in ((0, "a"), (1, "b")):
        msg = {"kind": "windows", "src": src, "job_id": "7", "window_start_ms": 0,
               "window_end_ms": wms, "windows": [{**window("7", 0, 0), "node": node}]}  # fmt: skip
        assert handler.handle("b", 0, b"7", json.dumps(msg).encode()) == []
    assert len(pending) == 2  # both sources' batches wait for a heartbeat
    beat = json.dumps({"kind": "watermark", "marks": {"0": wms, "1": wms}}).encode()
    out = handler.handle("b", 0, b"~watermark", beat)
    assert sorted(o.topic for o in out) == ["windows", "windows"]
    assert pending == {}


def test_a_batch_of_several_sources_is_one_pending_entry_and_survives_a_restart() -> None:
    import json

    from windowgen import window

    handler, job_table, pending = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    parts = {str(src): [{**window("7", 0, 0), "node": node}] for src, node in ((0, "a"), (1, "b"))}
    msg = {"kind": "windows", "job_id": "7", "window_start_ms": 0, "window_end_ms": wms,
           "parts": parts, "closed_wall_ms": 1.0}  # fmt: skip
    assert handler.handle("b", 0, b"7", json.dumps(msg).encode()) == []
    assert len(pending) == 1  # one entry holds both sources
    # A restarted worker: the same tables, a fresh releaser; both sources' windows pending.
    again, _, _ = jobs_handler()
    again.job_table, again.pending_table = job_table, pending
    again.restore("7")
    assert sorted(again.stage3.stage.pending["7"][0]) == [("a", 0), ("b", 0)]
    beat = json.dumps({"kind": "watermark", "marks": {"0": wms, "1": wms}}).encode()
    out = again.handle("b", 0, b"~watermark", beat)
    assert sorted(o.topic for o in out) == ["windows", "windows"]
    assert pending == {}


@pytest.mark.parametrize("key", [None, b"\xff\xfe", b"\xed\xa0\x80"])
def test_a_job_event_without_a_readable_key_is_refused(key: bytes | None) -> None:
    handler, job_table, _ = jobs_handler()
    with pytest.raises(ValueError):
        handler.handle("je", 0, key, AvroCodec("JobEvent").encode(JOB))
    assert job_table == {}
    handler.handle("je", 0, b"7", AvroCodec("JobEvent").encode(JOB))  # and the next one is read
    assert job_table[b"7"]["events"][0]["job_id"] == "7"


@pytest.mark.parametrize("value", [b"[1]", b'"x"', b"{" * 50_000, b"\xc0\x80", None])
def test_a_hostile_node_finding_is_refused_with_a_record_error(value: bytes | None) -> None:
    table: dict[bytes, Any] = {}
    handler = PolicyHandler(PolicyStage(Settings().policy), table, findings_topic="nf",
                            health_topic="h", counters=StreamCounters())  # fmt: skip
    with pytest.raises(RECORD_ERRORS):
        handler.handle("nf", b"gpu00001", value)
    assert table == {}


def test_json_object_names_what_it_refuses() -> None:
    assert json_object(b'{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError, match="too deep"):
        json_object(b"[" * 100_000)
    with pytest.raises(ValueError, match="list, not an object"):
        json_object(b"[]")
    with pytest.raises(TypeError):
        key_text("text")


# -- dead letters over the producer's size limit (librdkafka's own check, no broker needed) ---
HUGE_KEY = b"k" * (1 << 20)  # over message.max.bytes (1,000,000) whatever the value


class Queued:
    """A real producer with nothing listening (records stay queued; produce() runs the
    client's own checks, size included), and what was queued through it."""

    def __init__(self) -> None:
        from confluent_kafka import Producer

        quiet = logging.getLogger("test.producer")
        quiet.propagate = False
        quiet.addHandler(logging.NullHandler())
        self._producer = Producer({"bootstrap.servers": "127.0.0.1:9", "logger": quiet})
        self.queued: list[tuple[bytes | None, bytes | None, dict[str, bytes]]] = []

    def produce(self, topic: str, value: Any = None, key: Any = None, **kw: Any) -> None:
        self._producer.produce(topic, value, key, **kw)  # raises what the client raises
        self.queued.append((key, value, dict(kw.get("headers") or [])))

    def poll(self, timeout: float = 0) -> int:
        return 0


class Msg:
    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._topic, self._key, self._value = topic, key, value

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 5

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, T0)

    def error(self) -> None:
        return None


def test_produce_dead_letter_sends_a_record_too_large_without_its_bytes() -> None:
    q = Queued()
    produce_dead_letter(q, "dead", b"v" * 999_990, b"short", [("peerwatch.reason", b"r")])
    produce_dead_letter(q, "dead", b"bad", HUGE_KEY, [("peerwatch.reason", b"r")])
    # Before, produce() raised KafkaException MSG_SIZE_TOO_LARGE out of both.
    assert sorted(q.queued, key=repr) == sorted([
        (b"short", None, {"peerwatch.reason": b"r", "peerwatch.value.size": b"999990",
                          "peerwatch.key.size": b"5"}),
        (None, None, {"peerwatch.reason": b"r", "peerwatch.value.size": b"3",
                      "peerwatch.key.size": b"1048576"}),
    ], key=repr)  # fmt: skip


def test_archiver_dead_letters_an_undecodable_record_with_a_huge_key_and_goes_on(
    tmp_path: Path,
) -> None:
    # Found by the fuzzer: the dead letter's produce() raised KafkaException out of
    # ArchiveLoop.handle, which stopped the archiver (and every restart, on the same message).
    topics = {"t.jobs": "JobEvent"}
    writer = ArchiveWriter(tmp_path, topics)
    writer.recover()
    q = Queued()
    loop = ArchiveLoop(None, writer, topics, deadletter=KafkaDeadLetter(q, "dead"))  # type: ignore[arg-type]
    loop.handle(Msg("t.jobs", HUGE_KEY, b"\x00\x01junk"))
    loop.handle(Msg("t.jobs", b"7", AvroCodec("JobEvent").encode(JOB)))
    assert (loop.stats.undecodable, loop.stats.records) == (1, 1)
    [(key, value, headers)] = q.queued
    assert key is None and value is None and headers["peerwatch.key.size"] == b"1048576"
    assert headers["peerwatch.reason"].startswith(b"undecodable")


def test_export_loop_dead_letters_a_record_near_the_size_limit() -> None:
    class Sink:
        def write(self, schema_name: str, record: Any) -> None:
            pass

        def flush(self, timeout_s: float = 10.0) -> bool:
            return True

    q = Queued()
    loop = ExportLoop(None, Sink(), deadletter=KafkaDeadLetter(q, "dead"))  # type: ignore[arg-type]
    loop.handle(Msg("t", b"k", b"\xc3\x01" + bytes(999_990)))  # undecodable, 999,992 bytes
    assert (loop.stats.undecodable, loop.stats.deadlettered) == (1, 1)
    [(key, value, headers)] = q.queued
    assert (key, value, headers["peerwatch.value.size"]) == (b"k", None, b"999992")


def test_drain_controller_dead_letter_with_a_huge_key_is_sent_without_it() -> None:
    from peerwatch.exporters.drain.controller import AuditPublisher, Topics

    q = Queued()
    AuditPublisher(q, Topics("r", "e", "a", "dead"), 1.0).dead_letter(
        Msg("r", HUGE_KEY, b"junk"), "undecodable"
    )  # raised KafkaException MSG_SIZE_TOO_LARGE out of DrainController.handle
    [(key, value, headers)] = q.queued
    assert (key, value, headers["peerwatch.error"], headers["peerwatch.offset"]) == (
        None,
        None,
        b"undecodable",
        b"5",
    )


def test_hot_stage_dead_letter_with_a_huge_key_is_sent_without_it() -> None:
    from peerwatch.streams.live.delivery import OutputDelivery

    counters = StreamCounters()
    q = Queued()
    hot = OutputDelivery("dead", counters, q)
    hot.dead(Msg("s", HUGE_KEY, b"junk"), "undecodable", "bad magic")  # was logged, not sent
    [(key, value, headers)] = q.queued
    assert (key, value, headers["peerwatch.reason"]) == (None, b"", b"undecodable")
    assert headers["peerwatch.value.size"] == b"4" and counters.deadletter == 1


class RecordingTable(dict):  # type: ignore[type-arg]
    """A table that remembers every key set (each would be a changelog record)."""

    def __init__(self) -> None:
        super().__init__()
        self.sets: list[bytes] = []

    def __setitem__(self, key: bytes, value: Any) -> None:
        self.sets.append(key)
        super().__setitem__(key, value)


def test_a_batch_that_completes_its_window_is_released_without_a_pending_entry() -> None:
    import json

    from windowgen import window

    handler, _, _ = jobs_handler()
    handler.pending_table = pending = RecordingTable()
    handler.handle("je", 0, b"7", AvroCodec("JobEvent").encode(JOB))  # 2 GPUs expected
    handler.stage3.fleet().closed(0, 1 << 60)  # the fleet watch judged every window
    wms = handler.stage3.stage.settings.window_ms
    start = T0 - T0 % wms + wms
    half = {"0": [window("7", 0, start, node="gpu00001", window_end_ms=start + wms)]}
    msg = {"kind": "windows", "job_id": "7", "window_start_ms": start,
           "window_end_ms": start + wms, "parts": half}  # fmt: skip
    assert handler.handle("b", 0, b"7", json.dumps(msg).encode()) == []
    assert len(pending.sets) == 1 and len(pending) == 1  # half the job: it waits, kept
    rest = {"1": [window("7", 1, start, node="gpu00001", window_end_ms=start + wms)]}
    out = handler.handle("b", 0, b"7", json.dumps({**msg, "parts": rest}).encode())
    assert sorted(o.topic for o in out) == ["windows", "windows"]  # the window is complete
    assert len(pending.sets) == 1 and pending == {}  # the second batch was never kept
    nxt = {"0": [window("7", i, start + wms, node="gpu00001", window_end_ms=start + 2 * wms)
                 for i in (0, 1)]}  # fmt: skip
    msg2 = {**msg, "window_start_ms": start + wms, "window_end_ms": start + 2 * wms, "parts": nxt}
    out = handler.handle("b", 0, b"7", json.dumps(msg2).encode())
    assert sorted(o.topic for o in out) == ["windows", "windows"]
    assert len(pending.sets) == 1 and pending == {}  # complete at once: nothing kept


def two_source_batches(wms: int) -> tuple[bytes, bytes, bytes]:
    """Job 7's batches of window 0 from sources 0 and 1, and the heartbeat that releases both."""
    import json

    from windowgen import window

    msgs = [json.dumps({"kind": "windows", "src": src, "job_id": "7", "window_start_ms": 0,
                        "window_end_ms": wms, "windows": [{**window("7", 0, 0), "node": node}]}
                       ).encode() for src, node in ((0, "a"), (1, "b"))]  # fmt: skip
    beat = json.dumps({"kind": "watermark", "marks": {"0": wms, "1": wms}}).encode()
    return msgs[0], msgs[1], beat


def test_a_batch_released_within_the_hold_time_never_reaches_the_pending_table() -> None:
    """Given its offset, a waiting batch stays in memory, its offset the channel's commit
    floor (a crash re-reads it), until the heartbeat that releases it; the pending changelog
    never sees it. Before, every waiting batch was written to the changelog and deleted at its
    release (about 1 µs per GPU sample of the worker's CPU)."""
    handler, _, _ = jobs_handler()
    handler.pending_table = pending = RecordingTable()
    handler.hold_s = 5.0
    first, second, beat = two_source_batches(handler.stage3.stage.settings.window_ms)
    assert handler.handle("b", 0, b"7", first, offset=40) == []
    assert handler.handle("b", 0, b"7", second, offset=41) == []
    assert handler.commit_floor(0) == 40 and handler.commit_floor(1) is None
    out = handler.handle("b", 0, b"~watermark", beat)
    assert sorted(o.topic for o in out) == ["windows", "windows"]
    assert handler.commit_floor(0) is None  # released: its offset may be committed
    assert pending.sets == [] and handler.held == {}


def test_a_batch_held_past_the_hold_time_is_written_at_its_channels_next_heartbeat() -> None:
    """A batch still waiting ``hold_s`` after it came is written to the pending table at the
    next heartbeat of its channel, and only then does its offset stop holding the commits back
    (so it is in the table or read again after a crash, never lost); a restarted worker
    releases it from the table."""
    import json

    handler, job_table, _ = jobs_handler()
    handler.pending_table = pending = RecordingTable()
    now = [100.0]
    handler.monotonic_s, handler.hold_s = (lambda: now[0]), 5.0
    wms = handler.stage3.stage.settings.window_ms
    first, _, beat = two_source_batches(wms)
    assert handler.handle("b", 0, b"7", first, offset=7) == []
    only_0 = json.dumps({"kind": "watermark", "marks": {"0": wms, "1": 0}}).encode()
    now[0] += 4.9
    assert handler.handle("b", 0, b"~watermark", only_0) == []
    assert handler.commit_floor(0) == 7 and pending.sets == []  # not yet: still in memory
    now[0] += 0.2
    assert handler.handle("b", 0, b"~watermark", only_0) == []
    assert handler.commit_floor(0) is None and list(pending) == [b"7|0|0"]
    again, _, _ = jobs_handler()  # a restarted worker: the same tables
    again.job_table, again.pending_table = job_table, pending
    out = again.handle("b", 0, b"~watermark", beat)
    assert [o.topic for o in out] == ["windows"] and pending == {}


def test_a_held_batch_sent_again_keeps_the_lower_offset_and_a_rebalance_drops_it() -> None:
    """A batch sent again (a restarted hot stage) replaces the one held, as it replaced the
    table entry, but the floor stays at the older message (committing past it is never needed).
    A rebalance forgets held batches: their offsets were never committed, so whoever gets the
    partition reads them again."""
    handler, _, _ = jobs_handler()
    handler.hold_s = 5.0
    first, _, _ = two_source_batches(handler.stage3.stage.settings.window_ms)
    handler.handle("b", 0, b"7", first, offset=3)
    handler.handle("b", 0, b"7", first, offset=9)
    assert handler.commit_floor(0) == 3 and len(handler.held) == 1
    handler.forget()
    assert handler.commit_floor(0) is None and handler.held == {}


def test_a_job_handed_back_after_a_rebalance_is_read_from_the_tables_not_from_memory() -> None:
    """Workers w1 and w2 share the changelog tables. The job's partition goes w1 -> w2 -> w1;
    w2 kept a batch pending in the table. w1, told of the revocation, restores the job from the
    tables: the window is released whole. Its memory from before held no such batch (the
    scaling chaos test lost those windows)."""
    import json

    from windowgen import window

    w1, job_table, pending = jobs_handler()
    wms = w1.stage3.stage.settings.window_ms

    def batch(src: int, node: str, start: int) -> bytes:
        return json.dumps({"kind": "windows", "src": src, "job_id": "7", "window_start_ms": start,
                           "window_end_ms": start + wms,
                           "windows": [{**window("7", 0, start), "node": node}]}).encode()  # fmt: skip

    def beat(until: int) -> bytes:
        return json.dumps({"kind": "watermark", "marks": {"0": until, "1": until}}).encode()

    w1.handle("b", 0, b"7", batch(0, "a", 0))
    w1.handle("b", 0, b"7", batch(1, "b", 0))
    assert len(w1.handle("b", 0, b"~watermark", beat(wms))) == 2
    w1.forget()  # the rebalance: every partition revoked; w2 gets the job's
    w2, _, _ = jobs_handler()
    w2.job_table, w2.pending_table = job_table, pending
    assert w2.handle("b", 0, b"7", batch(0, "a", wms)) == []
    assert len(pending) == 1
    w2.forget()  # the next rebalance: back to w1
    w1.handle("b", 0, b"7", batch(1, "b", wms))
    out = w1.handle("b", 0, b"~watermark", beat(2 * wms))
    got = sorted(json.loads(o.value)["node"] if isinstance(o.value, bytes) and o.value[:1] == b"{"
                 else AvroCodec("GpuWindow").decode(o.value)["node"] for o in out)  # fmt: skip
    assert got == ["a", "b"]
    assert pending == {}


def test_a_node_handed_back_after_a_rebalance_has_its_policy_state_from_the_table() -> None:
    """The node's partition goes w1 -> w2 -> w1; w2 saw the node drained. w1, told of the
    revocation, reads the node's state from the table again: the node's return to service is
    seen (its memory from before said in service all along)."""
    table: dict[bytes, Any] = {}

    def worker() -> PolicyHandler:
        return PolicyHandler(PolicyStage(Settings().policy), table, findings_topic="nf",
                             health_topic="h", counters=StreamCounters())  # fmt: skip

    def event(ts_ms: int, state: str, flags: list[str]) -> bytes:
        return AvroCodec("NodeStateEvent").encode(
            {"event_id": f"e-{ts_ms}", "node": "gpu00001", "ts_ms": ts_ms, "state": state,
             "flags": flags, "reason": None, "reason_user": None, "reason_set_ms": None,
             "partitions": ["gpu"], "source": "WATCHER"})  # fmt: skip

    w1, w2 = worker(), worker()
    w1.handle("ns", b"gpu00001", event(T0, "IDLE", []))
    assert not w1.policy.state.nodes["gpu00001"].out_of_service
    w1.forget()
    w2.handle("ns", b"gpu00001", event(T0 + 1000, "IDLE", ["DRAIN"]))
    assert table[b"gpu00001"]["out_of_service"]
    w2.forget()
    w1.handle("ns", b"gpu00001", event(T0 + 2000, "IDLE", []))
    assert w1.policy.state.nodes["gpu00001"].resumed_ms == T0 + 2000
    assert table[b"gpu00001"]["resumed_ms"] == T0 + 2000


def test_json_table_reads_a_damaged_entry_as_absent_counts_and_drops_it() -> None:
    from peerwatch.streams.live.json_table import JsonTable, counting

    counters = StreamCounters()
    raw: dict[bytes, Any] = {}
    table = JsonTable(raw, counting(counters, "jobs"))
    table[b"7"] = {"events": [], "released_ms": 5}
    assert raw[b"7"] == b'{"events":[],"released_ms":5}'  # bytes to faust
    assert table.get(b"7") == {"events": [], "released_ms": 5}
    raw[b"8"], raw[b"9"], raw[b"10"] = b"\xff\xfe{", b"[1, 2]", b'{"a": 1'
    assert [table.get(k) for k in (b"8", b"9", b"10", b"11")] == [None] * 4
    assert counters.state_damaged == 3
    assert sorted(raw) == [b"7"] and len(table) == 1 and list(table) == [b"7"]


@pytest.mark.parametrize(
    "saved",
    [{"events": 5}, {"events": [1]}, {"detector": "x"}, {"detector": {"means": 3}},
     {"released_ms": "later"}],
)  # fmt: skip
def test_a_damaged_saved_job_state_is_dropped_and_the_job_goes_on(saved: dict[str, Any]) -> None:
    import json

    from windowgen import window

    handler, job_table, _ = jobs_handler()
    job_table[b"7"] = saved
    wms = handler.stage3.stage.settings.window_ms
    msg = {"kind": "windows", "src": 0, "job_id": "7", "window_start_ms": 0,
           "window_end_ms": wms, "windows": [{**window("7", 0, 0), "node": "a"}]}  # fmt: skip
    assert handler.handle("b", 0, b"7", json.dumps(msg).encode()) == []
    assert handler.counters.state_damaged == 1 and b"7" not in job_table
    out = handler.handle("b", 0, b"~watermark", json.dumps({"kind": "watermark",
                                                            "marks": {"0": wms}}).encode())  # fmt: skip
    assert [o.topic for o in out] == ["windows"]


@pytest.mark.parametrize(
    "saved", [{"node": "gpu00001", "episodes": [1]}, {"episodes": {}}, {"node": "n", "emitted": 3}]
)
def test_a_damaged_saved_node_state_is_dropped_and_the_node_goes_on(saved: dict[str, Any]) -> None:
    table: dict[bytes, Any] = {b"gpu00001": saved}
    handler = PolicyHandler(PolicyStage(Settings().policy), table, findings_topic="nf",
                            health_topic="h", counters=StreamCounters())  # fmt: skip
    event = {"event_id": "e-1", "node": "gpu00001", "ts_ms": T0, "state": "IDLE",
             "flags": ["DRAIN"], "reason": None, "reason_user": None, "reason_set_ms": None,
             "partitions": ["gpu"], "source": "WATCHER"}  # fmt: skip
    assert handler.handle("ns", b"gpu00001", AvroCodec("NodeStateEvent").encode(event)) == []
    assert handler.counters.state_damaged == 1
    assert table[b"gpu00001"]["out_of_service"]  # a fresh state, saved


def test_a_damaged_pending_key_is_dropped_and_every_heartbeat_still_walks_the_table() -> None:
    import json

    from windowgen import window

    handler, _, pending = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    msg = {"kind": "windows", "src": 0, "job_id": "7", "window_start_ms": 0,
           "window_end_ms": wms, "windows": [{**window("7", 0, 0), "node": "a"}]}  # fmt: skip
    pending[b"7|0|0"] = b"0\n" + json.dumps(msg).encode()  # left by a worker before a restart
    pending[b"junk"], pending[b"\xff|1|2"], pending[b"7|x|0"] = b"0\n{}", b"0\n{}", b"0\n{}"
    beat = json.dumps({"kind": "watermark", "marks": {"0": wms}}).encode()
    out = handler.handle("b", 0, b"~watermark", beat)  # walks the table: restores job 7
    assert handler.counters.pending_damaged == 3
    assert [o.topic for o in out] == ["windows"] and pending == {}  # and releases its window


def test_the_fleet_is_judged_once_and_its_verdict_releases_the_other_channels() -> None:
    """Every source sends its census of a window start to the judging channel (0) only; its
    watch judges once, publishes the one FLEET_WIDE finding and sends its verdict (how far it
    judged, the ratios of a shift) to every other channel; a window there waits for it and is
    released with the ratio (DETECTION.md 12). A census on another channel (an older hot
    stage sent one to each) is not judged there."""
    import json

    from windowgen import window

    from peerwatch.streams.core.fleet import FleetVerdicts, SourceCensus

    handler, job_table, _ = jobs_handler(channels=3)
    handler.stage3.fleet_sources = 2
    wms = handler.stage3.settings.window_ms
    clean = SourceCensus(40, 0, 0, (1.0,) * 40).to_json()
    capped = SourceCensus(40, 40, 0, (0.9,) * 40).to_json()
    published: list[Any] = []
    for k, part in enumerate([clean, capped]):
        for src in (0, 1):
            census = {"kind": "census", "src": src, "start": k * wms, "end": (k + 1) * wms,
                      "census": {"gpu": part}}  # fmt: skip
            assert handler.handle("b", 0, b"~census", json.dumps(census).encode()) == []
            assert handler.handle("b", 2, b"~census", json.dumps(census).encode()) == []
        for src in (0, 1):
            mark = {"kind": "watermark", "marks": {str(src): (k + 1) * wms}}
            published += handler.handle("b", 0, b"~watermark", json.dumps(mark).encode())
    assert handler.stage3.fleet().judged_until_ms == 2 * wms
    findings = [o for o in published if o.topic == "stragglers"]
    (out,) = findings
    finding = AvroCodec("StragglerFinding").decode(out.value)
    assert (out.key, finding["status"]) == (b"fleet", "FLEET_WIDE")
    assert finding["windows_considered"] == 80  # both sources' GPUs, in one finding
    verdicts = [o for o in published if o.topic == "batches"]
    assert [o.partition for o in verdicts] == [1, 2, 1, 2]  # one per judged start and channel
    assert verdicts[-1].value == {"kind": "fleet", "until": 2 * wms,
                                  "shifted": {str(wms): {"gpu": 0.9}}}  # fmt: skip
    assert handler.stage3.decisions(2).judged_until_ms is None  # the censuses there: ignored
    # a small job on channel 2 at the capped start waits for the verdict, then gets the ratio
    msg = {"kind": "windows", "job_id": "9", "window_start_ms": wms, "window_end_ms": 2 * wms,
           "parts": {"0": [window("9", 0, wms, node="gpu00001", window_end_ms=2 * wms,
                                  partition="gpu")]}}  # fmt: skip
    assert handler.handle("b", 2, b"9", json.dumps(msg).encode()) == []
    mark = {"kind": "watermark", "marks": {"0": 1 << 40, "1": 1 << 40}}
    assert handler.handle("b", 2, b"~watermark", json.dumps(mark).encode()) == []
    out = handler.handle("b", 2, b"~fleet", json.dumps(verdicts[-1].value).encode())
    (scored,) = [o for o in out if o.topic == "windows"]
    assert AvroCodec("GpuWindow").decode(scored.value)["fleet_clk_ratio"] == 0.9
    assert isinstance(handler.stage3.decisions(2), FleetVerdicts)
    assert json.loads(json.dumps(job_table[b"~fleet|2"]))["until"] == 2 * wms  # kept


def test_a_channels_fleet_verdicts_survive_a_rebalance_in_the_job_table() -> None:
    """After a rebalance (forget) a channel that does not judge gets its verdicts back from the
    job table: a window of a judged start is released at once, with its ratio; damaged
    verdicts are dropped and counted (the channel waits for the next verdict)."""
    import json

    from windowgen import window

    handler, job_table, _ = jobs_handler(channels=2)
    wms = handler.stage3.settings.window_ms
    verdict = {"kind": "fleet", "until": 2 * wms, "shifted": {str(wms): {"gpu": 0.8}}}
    assert handler.handle("b", 1, b"~fleet", json.dumps(verdict).encode()) == []
    handler.forget()
    msg = {"kind": "windows", "job_id": "9", "window_start_ms": wms, "window_end_ms": 2 * wms,
           "parts": {"0": [window("9", 0, wms, node="gpu00001", window_end_ms=2 * wms,
                                  partition="gpu")]}}  # fmt: skip
    handler.handle("b", 1, b"9", json.dumps(msg).encode())
    mark = {"kind": "watermark", "marks": {"0": 1 << 40}}
    out = handler.handle("b", 1, b"~watermark", json.dumps(mark).encode())
    (scored,) = [o for o in out if o.topic == "windows"]
    assert AvroCodec("GpuWindow").decode(scored.value)["fleet_clk_ratio"] == 0.8
    job_table[b"~fleet|1"] = {"until": "damaged", "shifted": {}}
    handler.forget()
    assert handler.fleet(1).judged_until_ms is None
    assert handler.counters.state_damaged == 1 and b"~fleet|1" not in job_table


@pytest.mark.parametrize(
    "verdict",
    [{"until": "x", "shifted": {}}, {"until": 1}, {"until": 1, "shifted": {"a": {}}},
     {"until": 1, "shifted": {"5": {"gpu": "slow"}}}, {"until": 1, "shifted": [1]},
     {"until": 1, "shifted": {"5": {"gpu": float("nan")}}},
     {"until": 1, "shifted": {"5": {"gpu": -0.5}}}, {"until": 1, "shifted": {"5": {"gpu": 1e9}}}],
)  # fmt: skip
def test_a_broken_fleet_verdict_is_refused_as_a_record_error(verdict: dict[str, Any]) -> None:
    import json

    from peerwatch.streams.live.handlers import RECORD_ERRORS

    handler, _, _ = jobs_handler(channels=2)
    with pytest.raises(RECORD_ERRORS):
        handler.handle("b", 1, b"~fleet", json.dumps({"kind": "fleet", **verdict}).encode())
    assert handler.stage3.decisions(1).judged_until_ms is None  # nothing kept of it
    with pytest.raises(RECORD_ERRORS):  # a verdict on the judging channel itself
        handler.handle("b", 0, b"~fleet", json.dumps({"kind": "fleet", "until": 5000,
                                                       "shifted": {}}).encode())  # fmt: skip


def test_the_fleet_watch_memory_survives_a_rebalance_in_the_job_table() -> None:
    """After a rebalance (forget) a channel's fleet watch comes back from the job table: a
    power cap that goes on is the same episode, not a second FLEET_WIDE finding."""
    import json

    from peerwatch.streams.core.fleet import SourceCensus

    handler, _, _ = jobs_handler()
    capped = SourceCensus(40, 40, 0, (0.9,) * 40).to_json()

    def window(k: int) -> list[Any]:
        census = {"kind": "census", "src": 0, "start": k * 5000, "end": (k + 1) * 5000,
                  "census": {"gpu": capped}}  # fmt: skip
        handler.handle("b", 0, b"~census", json.dumps(census).encode())
        mark = {"kind": "watermark", "marks": {"0": (k + 1) * 5000}}
        return handler.handle("b", 0, b"~watermark", json.dumps(mark).encode())

    assert [o.key for o in window(0)] == [b"fleet"]
    handler.forget()
    assert handler.stage3.fleets == {}
    assert window(1) == []  # the open episode was remembered
    handler.job_table[b"~fleet|0"] = {"partitions": "damaged"}
    handler.forget()
    assert window(2) != []  # a damaged memory is dropped and counted: the watch starts over
    assert handler.counters.state_damaged == 1


@pytest.mark.parametrize(
    "census", [[1, 2], {"gpu": [1, 2]}, {"gpu": [1, 1, 0, "%%"]}, {"gpu": None}, "x"]
)
def test_a_broken_census_is_refused_as_a_record_error(census: Any) -> None:
    import json

    from peerwatch.streams.live.handlers import RECORD_ERRORS

    handler, _, _ = jobs_handler()
    msg = {"kind": "census", "src": 0, "start": 0, "end": 5000, "census": census}
    with pytest.raises(RECORD_ERRORS):
        handler.handle("b", 0, b"~census", json.dumps(msg).encode())
    assert not handler.stage3.fleet().waiting


def test_a_census_not_judged_yet_holds_the_commit_floor_and_is_read_again_after_a_rebalance() -> (
    None
):
    """The fleet watch keeps only what it judged in the job table, so a census it holds
    waiting (another source has not closed that window start yet) must be read again after a
    rebalance: its offset holds the judging channel's commit floor until the start is judged.
    Before, the offset was committed past it and the next owner judged that start on 40 of the
    80 capped GPUs, where replay, and the same worker without the rebalance, saw 80."""
    import json

    from peerwatch.streams.core.fleet import SourceCensus

    capped = SourceCensus(40, 40, 0, (0.9,) * 40).to_json()

    def census(src: int) -> bytes:
        return json.dumps({"kind": "census", "src": src, "start": 0, "end": 5000,
                           "census": {"gpu": capped}}).encode()  # fmt: skip

    def marks(*srcs: int) -> bytes:
        return json.dumps({"kind": "watermark", "marks": {str(s): 5000 for s in srcs}}).encode()

    handler, _, _ = jobs_handler()
    handler.stage3.fleet_sources = 2
    handler.handle("b", 0, b"~census", census(0), offset=7)
    handler.handle("b", 0, b"~watermark", marks(0), offset=8)
    assert handler.commit_floor(0) == 7  # not judged: source 1 has not closed the start
    handler.forget()  # a rebalance: nothing past offset 7 was committed, so it comes again
    assert handler.commit_floor(0) is None
    handler.handle("b", 0, b"~census", census(0), offset=7)
    handler.handle("b", 0, b"~watermark", marks(0), offset=8)
    handler.handle("b", 0, b"~census", census(1), offset=9)
    out = handler.handle("b", 0, b"~watermark", marks(0, 1), offset=10)
    (finding,) = [AvroCodec("StragglerFinding").decode(o.value) for o in out
                  if o.topic == "stragglers"]  # fmt: skip
    assert (finding["status"], finding["windows_considered"]) == ("FLEET_WIDE", 80)
    assert handler.commit_floor(0) is None  # judged: the floor lifts
    # what the next owner decided when the census was committed past and not read again
    lost, _, _ = jobs_handler()
    lost.stage3.fleet_sources = 2
    lost.handle("b", 0, b"~census", census(0), offset=7)
    lost.forget()
    lost.handle("b", 0, b"~census", census(1), offset=9)
    out = lost.handle("b", 0, b"~watermark", marks(0, 1), offset=10)
    assert [AvroCodec("StragglerFinding").decode(o.value)["windows_considered"] for o in out
            if o.topic == "stragglers"] == [40]  # fmt: skip
