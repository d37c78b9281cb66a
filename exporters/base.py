"""The narrow interfaces every exporter implements or is given.

An exporter is a :class:`Sink` of decoded peerwatch records: the Kafka consume loop
(:mod:`peerwatch.exporters.consume`) decodes each record and hands ``(schema name, record)`` to
the sink; the sink turns it into its own output (OTLP metrics and events, JSON lines, ...).
Sinks never touch Kafka, so they are tested with plain dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from peerwatch.errors import PeerwatchError


class Sink(Protocol):
    """Where decoded records go. Implementations must not raise for a record they ignore."""

    def write(self, schema_name: str, record: Mapping[str, Any]) -> None:
        """Take one decoded record of schema ``schema_name`` (times in int ms since the epoch)."""
        ...

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Push out what is buffered; True when everything was delivered within ``timeout_s``."""
        ...

    def close(self) -> None:
        """Flush what can be flushed and release resources. Idempotent."""
        ...


class ExportError(PeerwatchError):
    """A decoded record could not be exported (a field the mapping needs is missing or bad)."""
