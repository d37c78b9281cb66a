"""Records as columns (peerwatch.schemas.columns): specs from schemas, tables from dicts."""

from __future__ import annotations

import numpy as np
import pytest

from peerwatch.schemas.columns import FLOAT, INT, STR, table_spec, tables_from_records
from peerwatch.schemas.compiled import Unsupported

SCHEMA = {
    "type": "record",
    "name": "R",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "n", "type": ["null", "long"]},
        {"name": "skipped", "type": "string"},
        {"name": "items", "type": {"type": "array", "items": {
            "type": "record", "name": "I", "fields": [
                {"name": "state", "type": {"type": "enum", "name": "S", "symbols": ["A", "B"]}},
                {"name": "x", "type": ["null", "double"]},
                {"name": "ok", "type": "boolean"},
            ]}}},
    ],
}  # fmt: skip


def test_a_spec_names_kinds_nullability_and_enum_symbols() -> None:
    spec = table_spec(SCHEMA, {"name": True, "n": True, "items": {"state": True, "x": True,
                                                                   "ok": True, "missing": True}})  # fmt: skip
    assert [(c.name, c.kind, c.nullable) for c in spec.columns] == [
        ("name", STR, False), ("n", INT, True)]  # fmt: skip
    ((name, child),) = spec.children
    assert name == "items" and child.path == "items."
    assert [(c.name, c.kind, c.symbols) for c in child.columns] == [
        ("state", INT, ("A", "B")), ("x", FLOAT, None), ("ok", INT, None)]  # fmt: skip


def test_a_field_of_another_shape_is_unsupported() -> None:
    with pytest.raises(Unsupported):
        table_spec(SCHEMA, {"name": {"x": True}})


def test_tables_from_records_flatten_nested_items_with_parents() -> None:
    spec = table_spec(SCHEMA, {"name": True, "n": True, "items": {"state": True, "x": True,
                                                                   "ok": True}})  # fmt: skip
    strings: dict[str, int] = {"b": 0}
    records = [
        {"name": "a", "n": None, "items": [{"state": "B", "x": 1.5, "ok": True}]},
        {"name": "b", "n": 7, "items": []},
        {"name": "a", "n": 8, "items": [{"state": "A", "x": None, "ok": False},
                                        {"state": "B", "x": -2.0, "ok": True}]},
    ]  # fmt: skip
    t = tables_from_records(spec, records, strings)
    top, items = t[""], t["items."]
    assert top.n == 3 and items.n == 3
    assert top.values["name"].tolist() == [1, 0, 1] and strings == {"b": 0, "a": 1}
    assert top.values["n"].tolist() == [0, 7, 8] and top.valid["n"].tolist() == [False, True, True]
    assert items.parent is not None and items.parent.tolist() == [0, 2, 2]
    assert items.values["state"].tolist() == [1, 0, 1]
    assert items.values["ok"].tolist() == [1, 0, 1]
    assert items.values["x"].dtype == np.float64
    assert items.valid["x"].tolist() == [True, False, True]


def test_a_null_where_none_is_allowed_is_refused() -> None:
    spec = table_spec(SCHEMA, {"name": True})
    with pytest.raises(ValueError, match="name"):
        tables_from_records(spec, [{"name": None}], {})
