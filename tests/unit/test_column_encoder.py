"""GpuWindow messages made from the aggregator's columns (no dict) are the codec's bytes for the
same windows' dicts, field for field; a value the schema cannot hold falls back to the dicts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from test_window_batches import SCENARIO

from peerwatch.producers.sim import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas import column_encoder as ce
from peerwatch.schemas.codec import MAGIC, AvroCodec
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.window_dicts import LazyWindows, WindowDicts
from peerwatch.streams.core.windows import ClosedWindows, WindowAggregator
from peerwatch.streams.live.window_batches import WindowBatchCodec

GPU_WINDOW = AvroCodec("GpuWindow")
HEADER = MAGIC + GPU_WINDOW.fingerprint


def closed_windows() -> list[ClosedWindows]:
    """The simulated fleet's closed windows (a job, idle GPUs, a clock drop, an XID)."""
    table = AllocationTable()
    agg = WindowAggregator(table, 5, 1, idle_jobs=True)
    out: list[ClosedWindows] = []
    for tick in Fleet(parse_scenario(SCENARIO)).ticks():
        for r in tick:
            if r.stream == "job-events":
                table.apply_event(r.value)
            elif r.stream == "samples":
                agg.add_batch([r.value])
        if agg.watermark_ms is not None:
            out += agg.pop_ready(agg.watermark_ms)
    return out + agg.pop_all()


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
    slots = list(range(len(part.node)))
    lazy = LazyWindows(WindowDicts(part), slots)
    assert lazy.encoded(HEADER) is None
    codec = WindowBatchCodec()
    every = WindowDicts(part).every()
    assert codec.encode_batch("7", 0, 5000, {0: lazy}, None) == codec.encode_batch(
        "7", 0, 5000, {0: [every[s] for s in slots]}, None
    )


def test_a_batch_of_lazy_windows_is_the_batch_of_their_dicts() -> None:
    """The hot stage hands the aggregator's lazy windows to the batch encoder: the message is
    the one their dicts give, and no dict was made for it."""
    codec = WindowBatchCodec()
    agg_parts = closed_windows()
    part = next(p for p in agg_parts if p.xids)
    dicts = WindowDicts(part)
    slots = list(range(len(part.node)))[::-1]  # any order of slots
    lazy = LazyWindows(dicts, slots)
    got = codec.encode_batch("a", part.start_ms, part.end_ms, {3: lazy}, 1.5)
    assert dicts._every is None and not lazy._made
    every = dicts.every()
    assert got == codec.encode_batch("a", part.start_ms, part.end_ms,
                                     {3: [every[s] for s in slots]}, 1.5)  # fmt: skip


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
    columns give up, and the batch encoder's record path raises EncodeError naming it."""
    from peerwatch.errors import CodecError

    part = next(p for p in closed_windows() if len(p.node) >= 4)
    code = next(iter(part.jobs))
    part = part._replace(jobs={**part.jobs, code: (12, *part.jobs[code][1:])})
    lazy = LazyWindows(WindowDicts(part), list(range(len(part.node))))
    assert lazy.encoded(HEADER) is None
    with pytest.raises(CodecError, match="job_id"):
        WindowBatchCodec().encode_batch("7", part.start_ms, part.end_ms, {0: lazy}, None)
