"""Avro object container files per topic and hour: the archive layout shared by
``peerwatch simulate --archive``, ``peerwatch archive`` and ``peerwatch replay``.

Layout: ``<root>/<topic>/<YYYY-MM-DD>T<HH>.avro``, the record's event hour in UTC. Each file embeds
its writer schema (with its logical types) and is deflate-compressed. The sync marker is derived
from the topic and hour, so the same records always give byte-identical files.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import fastavro
from fastavro.write import Writer

from peerwatch.schemas.registry import current_schema, raw_schema, strip_logical_types

HOUR_MS = 3_600_000


def hour_of(ts_ms: int) -> str:
    """``YYYY-MM-DDTHH`` of an event time (UTC)."""
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H")


def file_for(root: Path, topic: str, ts_ms: int) -> Path:
    return root / topic / f"{hour_of(ts_ms)}.avro"


class AvroFileSink:
    """Appends records to the file of their topic and hour; keeps each open file's writer."""

    def __init__(
        self, root: Path, topic_schemas: Mapping[str, str], codec: str = "deflate"
    ) -> None:
        self.root = Path(root)
        self._schemas = dict(topic_schemas)
        self._codec = codec
        self._open: dict[tuple[str, str], tuple[IO[bytes], Writer]] = {}
        self.records = 0

    def write(self, topic: str, record: Mapping[str, Any], ts_ms: int) -> None:
        hour = hour_of(ts_ms)
        key = (topic, hour)
        entry = self._open.get(key)
        if entry is None:
            path = self.root / topic / f"{hour}.avro"
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = path.open("wb")
            # Times are written as plain long ms (logical types stripped) so that every reader
            # gets the same ints the codec gives; the field docs say the unit.
            schema = strip_logical_types(raw_schema(self._schemas[topic]))
            marker = hashlib.sha256(f"{topic}|{hour}".encode()).digest()[:16]
            writer = Writer(fh, schema, codec=self._codec, sync_marker=marker)
            entry = self._open[key] = (fh, writer)
        entry[1].write(dict(record))
        self.records += 1

    def close(self) -> None:
        for fh, writer in self._open.values():
            writer.flush()
            fh.close()
        self._open.clear()


def read_archive(root: Path, topic: str, schema_name: str) -> Iterator[dict[str, Any]]:
    """Every record of ``topic`` under ``root``, in file (hour) order; times as int ms."""
    reader_schema = current_schema(schema_name)
    for path in sorted((Path(root) / topic).glob("*.avro")):
        with path.open("rb") as fh:
            yield from fastavro.reader(fh, reader_schema=reader_schema)  # type: ignore[misc]
