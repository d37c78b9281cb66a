"""GpuWindow messages made from the aggregator's columns (no dict) are the codec's bytes for the
same windows' dicts, field for field; a value the schema cannot hold falls back to the dicts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from closedgen import closed_windows

from peerwatch.schemas import column_encoder as ce
from peerwatch.schemas.codec import MAGIC, AvroCodec
from peerwatch.streams.core.window_dicts import LazyWindows, WindowDicts
from peerwatch.streams.core.windows import ClosedWindows
from peerwatch.streams.live.window_batches import WindowBatchCodec

GPU_WINDOW = AvroCodec("GpuWindow")
HEADER = MAGIC + GPU_WINDOW.fingerprint


def whole(part: ClosedWindows) -> list[bytes]:
    """The codec's messages of the part's dicts, in slot order."""
    return [GPU_WINDOW.encode(w) for w in WindowDicts(part).every()]


def test_every_simulated_window_is_the_codecs_bytes() -> None:
    parts = closed_windows()
    assert len(parts) > 20 and any(p.xids for p in parts)  # the XID is in one
    for part in parts:
        assert WindowDicts(part).encoded(HEADER) == whole(part)


def odd(part: ClosedWindows) -> ClosedWindows:
    """``part`` with values at the edges of their types: a NaN and an infinite clock sum, a
    long counter delta past 32 bits, a negative one, a window without readings, a lost GPU, a
    GPU without a UUID, several XIDs (repeated, unsorted) and a non-ASCII node name."""
    a = {k: v.copy() for k, v in part.accs.items()}
    a["clk_s"][0], a["clk_s"][1] = math.nan, math.inf
    a["ecc"][0], a["nvl"][1], a["pcie"][2] = 1 << 40, -5, (1 << 62) + 3
    a["n"][3], a["lost"][1] = 0, 1
    a["uuid"][2] = -1
    names = [*part.names, "nœud-ü"]
    node = part.node.copy()
    node[1] = len(names) - 1
    return part._replace(accs=a, names=names, node=node, xids={0: [79, 13, 79, 48], 2: [31]},
                         key_cache=None)  # fmt: skip


def test_values_at_the_edges_of_their_types_are_the_codecs_bytes() -> None:
    part = odd(next(p for p in closed_windows() if len(p.node) >= 4))
    assert WindowDicts(part).encoded(HEADER) == whole(part)


def test_a_column_of_another_type_falls_back_to_the_dicts() -> None:
    part = odd(next(p for p in closed_windows() if len(p.node) >= 4))
    part = part._replace(gpu_index=part.gpu_index.astype(np.float64))  # not an int column
    with pytest.raises(ce.Unfit):
        WindowDicts(part).encoded(HEADER)
    n = len(part.node)
    lazy = LazyWindows(WindowDicts(part), list(range(n)))
    assert lazy.scored_messages(HEADER, [None] * n, [None] * n) is None


def test_scored_messages_are_the_codecs_bytes_of_the_scored_dicts() -> None:
    """Stage 3 encodes each released window from the columns with its score and gate: the
    bytes the codec writes for the dict so scored, in the windows' order, no dict made."""
    part = odd(next(p for p in closed_windows() if len(p.node) >= 4))
    dicts = WindowDicts(part)
    slots = list(range(len(part.node)))[::-1]  # any order of slots
    lazy = LazyWindows(dicts, slots)
    scores = [1.5, None, -0.0, math.inf, *[0.25] * (len(slots) - 4)]
    gates = [None, "warmup", "jöb_wïde", None, *["no_data"] * (len(slots) - 4)]
    got = lazy.scored_messages(HEADER, scores, gates)
    assert dicts._every is None and lazy.untouched
    every = WindowDicts(part).every()
    assert got == [GPU_WINDOW.encode({**every[s], "score": sc, "gated": g})
                   for s, sc, g in zip(slots, scores, gates, strict=True)]  # fmt: skip
    list(lazy)  # iterated: a caller may have changed a dict
    assert lazy.scored_messages(HEADER, scores, gates) is None


@pytest.mark.parametrize(
    ("values", "avro_type"),
    [(np.array([0, 1, -1, 63, -64, 64, 8191, -(1 << 63), (1 << 63) - 1]), "long"),
     (np.array([0, (1 << 31) - 1, -(1 << 31)]), "int"), (np.array([True, False]), "long"),
     (np.array([], np.int64), "long")],
)  # fmt: skip
def test_varints_are_avros(values: np.ndarray, avro_type: str) -> None:
    from peerwatch.schemas.compiled import encode_long

    piece = ce.varints(values, avro_type)
    got = ce.assemble([piece], len(values))
    assert got == [encode_long(int(v)) for v in values.tolist()]


@pytest.mark.parametrize("values", [np.array([1.5]), np.array(["x"])])
def test_an_int_column_refuses_another_dtype(values: Any) -> None:
    with pytest.raises(ce.Unfit):
        ce.varints(values, "int")


def test_a_value_a_field_encoder_refuses_falls_back_to_the_dicts_which_name_it() -> None:
    """A job id that is no string (it cannot come from the allocation table; a guard): the
    columns give up, and the record path raises EncodeError naming it."""
    from peerwatch.errors import CodecError
    from peerwatch.streams.core.detector import ScoredValues

    part = next(p for p in closed_windows() if len(p.node) >= 4)
    code = next(iter(part.jobs))
    part = part._replace(jobs={**part.jobs, code: (12, *part.jobs[code][1:])})
    n = len(part.node)
    lazy = LazyWindows(WindowDicts(part), list(range(n)))
    assert lazy.scored_messages(HEADER, [None] * n, [None] * n) is None
    with pytest.raises(CodecError, match="job_id"):
        WindowBatchCodec().scored(ScoredValues(lazy, [None] * n, [None] * n))


@pytest.mark.parametrize(
    "table", [[b"a", b"", b"\x00\x01\x02", b"xyz" * 30], [b""], [bytes(range(256)), b"\x02"]]
)
def test_a_column_by_code_holds_each_rows_table_entry(table: list[bytes]) -> None:
    codes = np.array([len(table) - 1, 0, *range(len(table)), 0], np.int64)
    got = ce.assemble([ce.by_code(table, codes)], len(codes))
    assert got == [table[c] for c in codes.tolist()]
