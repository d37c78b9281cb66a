"""The export consume loop with a fake consumer: decode, hand to the sink, dead-letter bad records."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from peerwatch.exporters.base import ExportError
from peerwatch.exporters.consume import ExportLoop, deadletter_topic, export_topics
from peerwatch.schemas.codec import AvroCodec


class FakeMessage:
    def __init__(self, value: bytes | None, offset: int, err: Any = None) -> None:
        self._value, self._offset, self._err = value, offset, err

    def error(self) -> Any:
        return self._err

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return b"k"

    def topic(self) -> str | None:
        return "t.peerwatch.gpu.job-windows"

    def partition(self) -> int | None:
        return 0

    def offset(self) -> int | None:
        return self._offset


class FakeSource:
    def __init__(self, batches: list[list[FakeMessage]]) -> None:
        self.batches = batches
        self.commits: list[dict[str, Any]] = []

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[FakeMessage]:
        return self.batches.pop(0) if self.batches else []

    def commit(self, *args: Any, **kwargs: Any) -> None:
        self.commits.append(kwargs)

    def close(self) -> None:
        pass


class ListSink:
    def __init__(self) -> None:
        self.got: list[tuple[str, Mapping[str, Any]]] = []
        self.flushed = 0

    def write(self, schema_name: str, record: Mapping[str, Any]) -> None:
        if schema_name == "GpuWindow" and record["node"] == "refuse-me":
            raise ExportError("GpuWindow: cannot map")
        self.got.append((schema_name, record))

    def flush(self, timeout_s: float = 10.0) -> bool:
        self.flushed += 1
        return True

    def close(self) -> None:
        pass


class ListDeadLetter:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes | None, dict[str, bytes]]] = []

    def send(
        self, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None:
        self.sent.append((value, key, dict(headers)))


def test_records_reach_the_sink_and_bad_ones_the_dead_letter_topic(data_dir: Any) -> None:
    records = json.loads((data_dir / "records" / "realistic_records.json").read_text())
    good = AvroCodec("GpuWindow").encode(records["GpuWindow"])
    finding = AvroCodec("StragglerFinding").encode(records["StragglerFinding"])
    unmappable = AvroCodec("GpuWindow").encode({**records["GpuWindow"], "node": "refuse-me"})
    source = FakeSource([
        [FakeMessage(good, 0), FakeMessage(b"garbage", 1), FakeMessage(finding, 2)],
        [FakeMessage(None, 3, err="partition EOF"), FakeMessage(unmappable, 4)],
    ])  # fmt: skip
    sink, dlq = ListSink(), ListDeadLetter()
    loop = ExportLoop(source, sink, deadletter=dlq)
    assert loop.run_once() == 3
    assert loop.run_once() == 1
    assert [name for name, _ in sink.got] == ["GpuWindow", "StragglerFinding"]
    assert sink.got[0][1] == records["GpuWindow"]
    assert (loop.stats.records, loop.stats.undecodable, loop.stats.unmappable) == (2, 1, 1)
    assert loop.stats.deadlettered == 2 and loop.stats.consume_errors == 1
    value, key, headers = dlq.sent[0]
    assert value == b"garbage" and key == b"k"
    assert headers["peerwatch.reason"].startswith(b"undecodable: ")
    assert headers["peerwatch.offset"] == b"1" and headers["peerwatch.stage"] == b"export"
    assert dlq.sent[1][2]["peerwatch.reason"].startswith(b"unmappable: ")
    assert len(source.commits) == 2


def test_run_flushes_and_commits_when_stopped() -> None:
    source, sink = FakeSource([]), ListSink()
    stop = threading.Event()
    stop.set()
    ExportLoop(source, sink).run(stop)
    assert sink.flushed == 1 and source.commits == [{"asynchronous": False}]


def test_topic_names_follow_the_prefix() -> None:
    assert "p.peerwatch.gpu.job-windows" in export_topics("p.")
    assert "p.peerwatch.slurm.job-events" in export_topics("p.")
    assert len(export_topics()) == 6
    assert deadletter_topic("p.") == "p.peerwatch.deadletter"
