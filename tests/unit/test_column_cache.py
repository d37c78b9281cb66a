"""The C column decoder's string cache (``string_cache`` in ``_avro_native.c``): codes it gives
across calls are the ones the dict gives, and a misused cache is refused or starts again."""

from __future__ import annotations

import os

import pytest

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import default_scenario
from peerwatch.schemas import native, registry
from peerwatch.schemas.codec import HEADER_LEN, AvroCodec
from peerwatch.schemas.columns import STR, ColumnDecoder, Table, tables_from_records
from peerwatch.streams.core.windows import SAMPLE_SPEC

if os.environ.get("PEERWATCH_REQUIRE_NATIVE") == "1":
    assert native.available(), "the C decoder was not built (pip install -e . needs gcc)"
pytestmark = pytest.mark.skipif(not native.available(), reason="C decoder not built")


@pytest.fixture(scope="module")
def messages() -> tuple[list[dict[str, object]], list[bytes]]:
    codec = AvroCodec("NodeGpuSample")
    fleet = Fleet(default_scenario(nodes=6, duration_s=4))
    bodies = [codec.encode(r.value) for t in fleet.ticks() for r in t if r.stream == "samples"]
    return [codec.decode(b) for b in bodies], bodies  # float fields as the wire holds them


def decoder() -> ColumnDecoder:
    wire = registry.strip_logical_types(registry.raw_schema("NodeGpuSample"))
    return ColumnDecoder(SAMPLE_SPEC, wire)


def same(a: dict[str, Table], a_strings: dict[str, int], b: dict[str, Table],
         b_strings: dict[str, int]) -> None:  # fmt: skip
    """The same tables, string columns compared as the strings their codes name (the C decoder
    codes strings record by record, the Python back end column by column)."""
    names_a, names_b = list(a_strings), list(b_strings)
    assert a.keys() == b.keys()
    for spec in SAMPLE_SPEC.tables():
        t, u = a[spec.path], b[spec.path]
        assert t.n == u.n, spec.path
        for col in spec.columns:
            x, y = t.values[col.name].tolist(), u.values[col.name].tolist()
            if col.kind == STR:
                x, y = [names_a[i] for i in x], [names_b[i] for i in y]
            assert x == y, (spec.path, col.name)
            if col.nullable:  # the C module's row-major flags, one contiguous array per column
                assert t.valid[col.name].tolist() == u.valid[col.name].tolist(), col.name


def test_codes_across_calls_are_the_dicts(messages: tuple[list, list]) -> None:
    records, bodies = messages
    c, strings = decoder(), {"some string already there": 0}
    expect: dict[str, int] = dict(strings)
    for lo in range(0, len(bodies), 5):  # many calls, one dict: the cache lives across them
        tables, bad = c.messages(bodies[lo : lo + 5], HEADER_LEN, strings)
        assert bad == []
        same(tables, strings, tables_from_records(SAMPLE_SPEC, records[lo : lo + 5], expect),
             expect)  # fmt: skip
        assert set(strings) == set(expect)
        assert sorted(strings.values()) == list(range(len(strings)))  # insertion positions
    assert len(strings) > 6 * 8  # node names and UUIDs were coded


def test_a_dict_that_shrank_empties_the_cache(messages: tuple[list, list]) -> None:
    records, bodies = messages
    c, strings = decoder(), {}
    c.messages(bodies, HEADER_LEN, strings)
    strings.clear()  # against the contract (dicts only grow): codes must still be the dict's
    strings["first"] = 0
    tables, _ = c.messages(bodies[:3], HEADER_LEN, strings)
    expect = {"first": 0}
    same(tables, strings, tables_from_records(SAMPLE_SPEC, records[:3], expect), expect)
    assert set(strings) == set(expect) and strings["first"] == 0
    assert sorted(strings.values()) == list(range(len(strings)))


def test_a_new_dict_gets_a_new_cache(messages: tuple[list, list]) -> None:
    records, bodies = messages
    c = decoder()
    for _ in range(2):
        strings: dict[str, int] = {}
        tables, _ = c.messages(bodies[:4], HEADER_LEN, strings)
        expect: dict[str, int] = {}
        same(tables, strings, tables_from_records(SAMPLE_SPEC, records[:4], expect), expect)
        assert sorted(strings.values()) == list(range(len(strings)))


def test_a_cache_of_another_dict_and_bad_arguments_are_refused(messages: tuple[list, list]) -> None:
    _, bodies = messages
    c = decoder()
    mine: dict[str, int] = {}
    other = native.native.string_cache({}, 16)
    program, ncols = c._program, c._ncols
    with pytest.raises(TypeError, match="another strings dict"):
        native.native.decode_columns(program, ncols, bodies[:1], HEADER_LEN, 0, mine, other)
    assert mine == {}
    with pytest.raises(ValueError):
        native.native.decode_columns(program, ncols, bodies[:1], HEADER_LEN, 0, mine, "x")
    for args in (({}, 3), ({}, 0), ([], 16), ({}, 1 << 30), ({},)):
        with pytest.raises(TypeError, match="string_cache"):
            native.native.string_cache(*args)
    cache = native.native.string_cache(mine, 4)
    out, bad, _ = native.native.decode_columns(
        program, ncols, bodies[:2], HEADER_LEN, 0, mine, cache
    )
    assert bad == [] and out[0][0] == 2


def _block(codec: AvroCodec, records: list[dict[str, object]]) -> bytes:
    """Records one after the other, as an archive block holds them (bodies without headers)."""
    return b"".join(codec.encode(r)[HEADER_LEN:] for r in records)


def test_guessed_codes_are_checked_whole(messages: tuple[list, list]) -> None:
    """A string column guesses its next code from the last ones (the code after, or as far
    again): right when records come as their strings were first seen, and never taken
    unchecked: records in another order, GPUs shuffled, a UUID changed in one byte (same
    length as the guess) all get the dict's codes."""
    records, _ = messages
    codec = AvroCodec("NodeGpuSample")
    first = [r for r in records if r["ts_ms"] == records[0]["ts_ms"]]
    assert len(first) == 6

    def variant(r: dict[str, object], k: int) -> dict[str, object]:
        gpus = [dict(g) for g in r["gpus"]]  # type: ignore[attr-defined]
        if k % 3 == 1:
            gpus.reverse()
        if k % 3 == 2:  # same length as the UUID the guess reads, one byte apart
            uuid = str(gpus[3]["uuid"])
            gpus[3]["uuid"] = uuid[:-1] + ("0" if uuid[-1] != "0" else "1")
        return {**r, "gpus": gpus}

    batches = [
        first,  # every string new: codes in first-seen order
        first,  # the same order: the guesses hold
        list(reversed(first)),  # nodes in another order: node guesses miss
        [variant(r, k) for k, r in enumerate(first)],
        [variant(r, k) for k, r in enumerate(reversed(first))],
        first,
    ]
    c, strings, expect = decoder(), {}, {}
    for batch in batches:
        data = _block(codec, batch)
        tables, bad, end = c.block(data, 0, len(batch), strings)
        assert bad == [] and tables[""].n == len(batch) and end == len(data)
        decoded = [codec.decode(codec.encode(r)) for r in batch]
        same(tables, strings, tables_from_records(SAMPLE_SPEC, decoded, expect), expect)
        assert set(strings) == set(expect)
        assert sorted(strings.values()) == list(range(len(strings)))
    # four changed UUIDs are new strings: of records 2 and 5, then (reversed) of records 3 and 0
    assert len(strings) == 6 + 6 * 8 + 4


@pytest.mark.parametrize("hints", [None, (1, 1, 1), (3, 20, 0), (1 << 40, 1 << 40, 1 << 40)])
def test_capacity_hints_change_no_table_and_bad_hints_are_refused(
    messages: tuple[list, list], hints: tuple[int, ...] | None
) -> None:
    """A hint only sizes the first allocation of each table (too small: the columns grow past
    it; absurd: bounded by the input's bytes): the tables are the same as without one."""
    _, bodies = messages
    c = decoder()
    program, ncols = c._program, c._ncols
    assert len(ncols) == 3  # the samples, their GPUs, their XIDs
    block = b"".join(b[HEADER_LEN:] for b in bodies[:9])
    plain: dict[str, int] = {}
    hinted: dict[str, int] = {}
    want = native.native.decode_columns(program, ncols, block, 0, 9, plain)
    got = native.native.decode_columns(program, ncols, block, 0, 9, hinted, None, hints)
    assert got == want and hinted == plain
    listed = native.native.decode_columns(program, ncols, bodies[:9], HEADER_LEN, 0, hinted,
                                          None, hints)  # fmt: skip
    assert listed[0] == want[0]


def test_bad_capacity_hints_are_refused(messages: tuple[list, list]) -> None:
    _, bodies = messages
    c = decoder()
    for hints in ((1, 2), [1, 2, 3], ("a", 1, 1)):
        with pytest.raises(TypeError):
            native.native.decode_columns(c._program, c._ncols, bodies[:1], HEADER_LEN, 0, {},
                                         None, hints)  # fmt: skip


def test_the_decoder_hints_each_call_with_the_rows_of_the_last(
    messages: tuple[list, list],
) -> None:
    _, bodies = messages
    c, strings = decoder(), {}
    assert c._hints is None
    tables, _ = c.messages(bodies[:6], HEADER_LEN, strings)
    assert c._hints == tuple(t.n + t.n // 8 + 64 for t in tables.values())
    again, _ = c.messages(bodies[:6], HEADER_LEN, strings)  # with the hints: the same tables
    same(again, strings, tables, strings)
