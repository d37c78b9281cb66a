"""model.field_rows: the fields of many records at once, the same values whether every record
holds every field (read in C) or one lacks one (read with .get)."""

from __future__ import annotations

from peerwatch.streams.core.model import field_rows


def test_rows_of_several_fields_and_values_of_one() -> None:
    records = [{"a": 1, "b": "x", "c": None}, {"a": 2, "b": "y", "c": 3.5}]
    assert field_rows(records, "a", "c") == [(1, None), (2, 3.5)]
    assert field_rows(records, "b") == ["x", "y"]


def test_a_record_lacking_a_field_reads_none_for_it() -> None:
    records = [{"a": 1, "b": 2}, {"a": 3}, {}]
    assert field_rows(records, "a", "b") == [(1, 2), (3, None), (None, None)]
    assert field_rows(records, "b") == [2, None, None]


def test_no_records() -> None:
    assert field_rows([], "a", "b") == []
    assert field_rows([], "a") == []
