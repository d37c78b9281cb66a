"""Stage 3's and 4's state tables (job and node states) as JSON objects over raw bytes.

faust would decode a JSON table's changelog itself while recovering it, and an entry that does
not decode stops the recovery for good (it never completes, the worker never resumes; seen with
the pending table's entries). The tables are therefore raw bytes to faust, and decoded here,
where a damaged entry is counted, logged, deleted and read as absent: the worker goes on with
that one job or node starting afresh, every other state kept.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from peerwatch.streams.live.handlers import json_object

log = logging.getLogger(__name__)


class JsonTable(MutableMapping[bytes, dict[str, Any]]):
    """``raw`` (a faust table of bytes) read and written as JSON objects. ``on_damaged`` is
    called with the key of an entry that is not a JSON object, which is then deleted and reads
    as absent (KeyError, so ``get`` gives its default)."""

    def __init__(
        self, raw: MutableMapping[bytes, Any], on_damaged: Callable[[bytes, Exception], None]
    ) -> None:
        self.raw = raw
        self.on_damaged = on_damaged

    def __getitem__(self, key: bytes) -> dict[str, Any]:
        value = self.raw[key]
        try:
            return json_object(value)
        except (ValueError, TypeError) as exc:
            self.on_damaged(key, exc)
            self.raw.pop(key, None)
            raise KeyError(key) from None

    def __setitem__(self, key: bytes, value: dict[str, Any]) -> None:
        self.raw[key] = json.dumps(value, separators=(",", ":")).encode()

    def __delitem__(self, key: bytes) -> None:
        del self.raw[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


def counting(counters: Any, table: str) -> Callable[[bytes, Exception], None]:
    """An ``on_damaged`` that counts the entry in ``counters.state_damaged`` and logs it."""

    def damaged(key: bytes, exc: Exception) -> None:
        counters.state_damaged += 1
        log.warning("%s table: entry %r damaged, dropped: %s", table, key[:80], exc)

    return damaged
