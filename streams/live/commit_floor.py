"""A floor under faust's offset commits: no offset of a partition is committed past the lowest
offset a stage still holds in memory only (stage 3's waiting window batches, see
:class:`~peerwatch.streams.live.handlers.JobsHandler`), so a crash or a rebalance reads those
messages again instead of losing them.

faust acknowledges each event once the agent has taken the next one, and commits every
``broker_commit_interval`` the highest offset up to which all were acknowledged. Its manual
acks (``stream.noack()``) cannot hold a commit back: its ``Consumer._new_offset`` commits the
first run of acknowledged offsets even when an unacknowledged one lies before it (it checks the
gap against the committed offset with ``> 1``, and not at all before the first commit), so a
message left unacknowledged was skipped (seen in tests/integration/test_chaos.py, windows held
in memory at a SIGKILL, all lost). The floor wraps ``_new_offset`` instead: while a partition
has a floor, the commit goes no further than it, and faust's list of acknowledged offsets is
left as it is, so the commit catches up at once when the floor lifts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: topic, partition -> the lowest offset not to commit past (None: no floor).
Floor = Callable[[str, int], int | None]


def hold_commits(consumer: Any, floor: Floor) -> None:
    """Make ``consumer`` (a faust Consumer) commit no offset past ``floor(topic, partition)``.
    Raises TypeError when this faust has no ``_new_offset`` to wrap (a faust upgrade changed
    how it commits: held batches would not be safe)."""
    inner = getattr(consumer, "_new_offset", None)
    committed = getattr(consumer, "_committed_offset", None)
    if inner is None or committed is None:
        raise TypeError(f"{type(consumer).__name__} has no _new_offset to put a floor under")

    def new_offset(tp: Any) -> int | None:
        low = floor(tp.topic, tp.partition)
        if low is None:
            return inner(tp)  # type: ignore[no-any-return]
        before = consumer._committed_offset[tp]
        # Up to the floor, not past what was committed; the acked offsets stay listed.
        return low if before is None or low > before else None

    consumer._new_offset = new_offset
