"""The live worker's pending-table entries: the batch message kept as it came (no second
encoding of every window) after its channel, read back as the message with its channel; entries
of older versions (JSON: the message's text under ``raw``, or its fields) still read; a damaged
one is refused, not half-read."""

from __future__ import annotations

import json

import pytest

from peerwatch.streams.core.job_stage import batch_of_message
from peerwatch.streams.live.handlers import pending_entry
from peerwatch.streams.live.handlers import pending_message as _pending_message

MESSAGE = {
    "kind": "windows", "src": 3, "job_id": "77", "window_start_ms": 5_000,
    "window_end_ms": 10_000, "windows": [{"job_id": "77", "node": "n1", "gpu_index": 0}],
    "closed_wall_ms": 1.5,
}  # fmt: skip


def test_an_entry_holding_the_message_bytes_reads_back_as_the_message() -> None:
    entry = pending_entry(4, json.dumps(MESSAGE).encode())
    assert entry.startswith(b"4\n")
    message = _pending_message(entry)
    assert message == {**MESSAGE, "channel": 4}
    batch, src = batch_of_message(message)
    assert (batch.job_id, batch.window_start_ms, src) == ("77", 5_000, 3)


def test_an_older_entry_read_back_as_raw_bytes_still_reads() -> None:
    older = json.dumps({"raw": json.dumps(MESSAGE), "channel": 4}).encode()
    assert _pending_message(older) == {**MESSAGE, "channel": 4}


@pytest.mark.parametrize(
    "entry", [b"", b"4", b"x\n{}", b"4\n[1]", b"4\n{cut", b"-1\n{}", b"1234567890\n{}",
              b"4\n" + b"[" * 100_000, b"4\n\xff\xfe"],
)  # fmt: skip
def test_a_damaged_bytes_entry_is_refused_with_a_value_error(entry: bytes) -> None:
    with pytest.raises(ValueError):
        _pending_message(entry)


def test_an_entry_holding_the_message_text_reads_back_as_the_message() -> None:
    entry = {"raw": json.dumps(MESSAGE), "channel": 4}
    message = _pending_message(entry)
    assert message == {**MESSAGE, "channel": 4}
    batch, src = batch_of_message(message)
    assert (batch.job_id, batch.window_start_ms, src, batch.windows) == (
        "77", 5_000, 3, MESSAGE["windows"],
    )  # fmt: skip


def test_an_entry_of_the_older_form_still_reads() -> None:
    assert _pending_message({**MESSAGE, "channel": 2}) == {**MESSAGE, "channel": 2}


@pytest.mark.parametrize("raw", ["[1, 2]", "{not json", '"text"', "[" * 100_000])
def test_a_damaged_entry_is_refused_with_a_value_error(raw: str) -> None:
    with pytest.raises(ValueError):
        _pending_message({"raw": raw, "channel": 0})


@pytest.mark.parametrize("entry", [None, [1], {"raw": b"{}"}, {"raw": 5}])
def test_an_entry_of_the_wrong_type_is_refused_with_a_type_error(entry: object) -> None:
    with pytest.raises(TypeError):
        _pending_message(entry)


def test_a_restore_drops_and_counts_a_damaged_entry_and_keeps_the_rest() -> None:
    from peerwatch.streams.core.job_stage import PendingEntry
    from tests.unit.test_stream_handlers import jobs_handler

    handler, _, pending = jobs_handler()
    good = {**MESSAGE, "window_start_ms": 5_000}
    pending[PendingEntry("77", 5_000, 3).key.encode()] = {"raw": json.dumps(good), "channel": 1}
    bad_key = PendingEntry("77", 10_000, 3).key.encode()
    pending[bad_key] = {"raw": "{cut", "channel": 1}
    handler.restore("77")
    assert handler.counters.pending_damaged == 1
    assert bad_key not in pending
    assert 5_000 in handler.stage3.stage.pending["77"]  # the good window is pending again
