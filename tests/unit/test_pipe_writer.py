"""The split replay's sender thread (streams/offline/split.PipeWriter) over a frame channel
inside this process: order kept, bounded, a closed far end reported to the sender, stop without
a reader."""

from __future__ import annotations

import threading

import pytest
from channel_reader import EofReader

from peerwatch.streams.offline.frames import channel_pair
from peerwatch.streams.offline.split import PipeClosed, PipeWriter


def test_every_message_arrives_in_order_while_the_bound_holds_the_sender_back() -> None:
    here, there = channel_pair()
    writer = PipeWriter(here, limit_bytes=1)  # one message waits at a time
    got: list[object] = []

    def read() -> None:
        while len(got) < 200:
            batch = there.recv()
            assert len(batch) == 1  # no flush kinds: each message is written as it comes
            got.extend(batch)

    reader = threading.Thread(target=read)
    reader.start()
    sent = [("drain", i, list(range(i % 17)), {"k": str(i)}) for i in range(200)]
    for message in sent:
        writer.send(message)
    writer.close()
    reader.join(timeout=30)
    assert got == sent
    assert writer.join(timeout_s=0)
    here.close()
    there.close()


def test_a_closed_far_end_is_raised_to_the_sender() -> None:
    here, there = channel_pair()
    there.close()
    writer = PipeWriter(here)
    writer.send(("feed", "job-events", "", {"x": 1}))
    with pytest.raises(PipeClosed):
        writer.close()
    with pytest.raises(PipeClosed):
        writer.send(("feed", "job-events", "", {"x": 2}))
    here.close()


def test_stop_ends_the_thread_with_messages_unwritten() -> None:
    here, there = channel_pair()
    writer = PipeWriter(here, limit_bytes=1 << 30)
    writer.send(("hot", ["x" * 1000]))  # may be written (the pipe holds it) or still queued
    writer.stop()
    assert writer.join(timeout_s=30)
    here.close()
    there.close()


def test_messages_are_gathered_until_a_flush_kind_or_the_close() -> None:
    here, there = channel_pair()
    writer = PipeWriter(here, flush_kinds=frozenset({"drain"}))
    reader = EofReader(there)
    sent = [("saw", 1), ("feed", 2), ("drain", 3), ("hot", 4), ("drain", 5), ("saw", 6)]
    for message in sent:
        writer.send(message)
    writer.close()
    here.close()
    assert reader.result() == [list(sent[:3]), list(sent[3:5]), [sent[5]]]
    there.close()


def test_at_most_flush_every_messages_wait() -> None:
    from peerwatch.streams.offline.split import FLUSH_EVERY

    here, there = channel_pair()
    writer = PipeWriter(here, flush_kinds=frozenset({"drain"}))
    for i in range(FLUSH_EVERY):
        writer.send(("saw", i))
    assert there.recv() == [("saw", i) for i in range(FLUSH_EVERY)]  # written before a drain
    writer.stop()
    assert writer.join(timeout_s=30)
    here.close()
    there.close()
