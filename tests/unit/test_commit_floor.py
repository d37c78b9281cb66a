"""The floor under faust's offset commits (streams/live/commit_floor.py): the wrapped
``_new_offset`` of a stand-in with faust's committed-offset bookkeeping. The real consumer is
exercised by tests/integration/test_chaos.py (window batches held in memory at a SIGKILL)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, NamedTuple

import pytest

from peerwatch.streams.live.commit_floor import hold_commits


class TP(NamedTuple):
    topic: str
    partition: int


class Consumer:
    """faust's ``_new_offset`` contract: the offset to commit for a partition, or None."""

    def __init__(self) -> None:
        self._committed_offset: dict[Any, int | None] = defaultdict(lambda: None)
        self.acked_up_to: dict[Any, int] = {}

    def _new_offset(self, tp: Any) -> int | None:
        return self.acked_up_to.get(tp)


def test_no_commit_goes_past_the_floor_and_it_catches_up_when_the_floor_lifts() -> None:
    consumer, floors = Consumer(), {("b", 0): 12}
    hold_commits(consumer, lambda topic, partition: floors.get((topic, partition)))
    held, free = TP("b", 0), TP("b", 1)
    consumer.acked_up_to = {held: 30, free: 30}
    assert consumer._new_offset(held) == 12  # up to the held message, which is read again
    assert consumer._new_offset(free) == 30  # other partitions as faust has them
    consumer._committed_offset[held] = 12
    assert consumer._new_offset(held) is None  # committed already: nothing new to commit
    del floors[("b", 0)]
    assert consumer._new_offset(held) == 30


def test_a_consumer_without_new_offset_is_refused() -> None:
    with pytest.raises(TypeError, match="_new_offset"):
        hold_commits(object(), lambda topic, partition: None)
