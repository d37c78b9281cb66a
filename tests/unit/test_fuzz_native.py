"""The differential fuzzer of the C decoder (scripts/fuzz_native.py) in the unit tier: its
mutation and compare loop on the normal (unsanitized) build, and proof that the comparison
catches a wrong decoder. CI runs the same loop for minutes under ASan/UBSan (make fuzz)."""

from __future__ import annotations

import functools
import importlib.util
import math
import os
import pathlib
import sys
from random import Random
from typing import Any

import pytest

from peerwatch.schemas import native, registry
from peerwatch.schemas.compiled import compile_decoder, compile_encoder

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "fuzz_native.py"

if os.environ.get("PEERWATCH_REQUIRE_NATIVE") == "1":
    assert native.available(), "the C decoder was not built (pip install -e . needs gcc)"
pytestmark = pytest.mark.skipif(
    not native.available(),
    reason="the C decoder is not built here (no C compiler or Python headers when peerwatch was "
    "installed) or PEERWATCH_NATIVE=0 turns it off: there is nothing to compare",
)


@pytest.fixture(scope="module")
def fz() -> Any:
    spec = importlib.util.spec_from_file_location("fuzz_native", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_native"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("fuzz_native", None)


def test_mutation_loop_agrees_on_every_schema(fz: Any) -> None:
    stats = fz.run(seconds=None, seed=7, max_inputs=1200, exhaustive_records=0)
    assert stats.plan_problems == []
    assert stats.mismatches == [], "\n".join(m.report() for m in stats.mismatches[:3])
    assert set(stats.inputs) == set(fz.schemas_under_test())
    assert "synthetic.Synthetic" in stats.inputs
    for mutation in ("valid-gen", "valid-sim", "valid-negative-blocks", "valid-split-blocks",
                     "utf8-insert", "len-inflate", "branch", "enum-range", "bitflip", "trailing"):  # fmt: skip
        assert stats.mutations[mutation] > 0, mutation
    for target in ("decode", "skip"):
        ok = sum(n for (_, t, kind), n in stats.outcomes.items() if t == target and kind == "ok")
        refused = sum(
            n for (_, t, kind), n in stats.outcomes.items() if t == target and kind == "refused"
        )
        assert ok > 50 and refused > 300, (target, ok, refused)


def test_every_length_of_a_record_is_compared(fz: Any) -> None:
    stats = fz.run(seconds=None, seed=3, max_inputs=400, exhaustive_records=1, sim=False)
    assert stats.mismatches == []
    assert stats.mutations["truncate-every"] > 100


def _wrap(change: Any) -> Any:
    """A decode target whose C side is the real decode passed through ``change``."""

    def make(mod: Any, wire: Any) -> Any:
        real = functools.partial(mod.decode, native.plan_of(wire))
        return lambda buf, offset: change(real, buf, offset)

    return make


def _accept_all(real: Any, buf: Any, offset: int) -> Any:
    try:
        return real(buf, offset)
    except ValueError:
        return None, offset


def _type_error(real: Any, buf: Any, offset: int) -> Any:
    raise TypeError("not a documented refusal")


def _refuse_all(real: Any, buf: Any, offset: int) -> Any:
    raise ValueError("refused")


def _end_plus_one(real: Any, buf: Any, offset: int) -> Any:
    value, end = real(buf, offset)
    return value, end + 1


def _int_for_float(real: Any, buf: Any, offset: int) -> Any:
    value, end = real(buf, offset)

    def walk(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value), end


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_accept_all, "one refused, the other did not"),
        (_type_error, "an undocumented exception"),
        (_refuse_all, "one refused, the other did not"),
        (_end_plus_one, "different results"),
        (_int_for_float, "different results"),
    ],
)
def test_the_comparison_catches_a_wrong_decoder(fz: Any, change: Any, reason: str) -> None:
    real = fz.TARGETS[0]
    broken = fz.Target(
        "broken", real.module, _wrap(change), real.fallback, real.compare, real.expect
    )
    stats = fz.run(
        seconds=None, seed=5, max_inputs=800, targets=[broken], exhaustive_records=0, sim=False
    )
    assert stats.mismatches, change.__name__
    assert reason in {m.reason for m in stats.mismatches}
    report = stats.mismatches[0].report()
    assert "--replay" in report and stats.mismatches[0].data.hex() in report


def test_same_value_is_strict(fz: Any) -> None:
    same = fz.same_value
    assert same({"a": [1.5, None, "x"]}, {"a": [1.5, None, "x"]})
    assert same(math.nan, math.nan)
    assert not same(0.0, -0.0)
    assert not same(1, 1.0)
    assert not same(True, 1)
    assert not same(b"x", "x")
    assert not same({"a": 1, "b": 2}, {"b": 2, "a": 1})  # fields in schema order
    assert not same([1], [1, 2])


def test_encoder_sites_point_at_their_varints(fz: Any) -> None:
    rng = Random(1)
    wire = registry.strip_logical_types(registry.raw_schema("DrainRecommendation"))
    node = fz.to_node(wire)
    for _ in range(20):
        record = fz.generate(node, rng)
        data, sites = fz.encode(node, record, rng)
        assert data == compile_encoder(wire)(record)
        assert fz.same_value(compile_decoder(wire)(data, 0), (record, len(data)))
        for s in sites:
            assert fz.encode_long(s.value) == data[s.start : s.end]
            if s.kind == "len" and s.is_str:
                data[s.end : s.end + s.value].decode()
        for blocks in ("split", "negative"):
            other, _ = fz.encode(node, record, rng, blocks)
            assert fz.same_value(compile_decoder(wire)(other, 0), (record, len(other)))


def test_the_recursion_guard_and_bad_plans(fz: Any) -> None:
    assert fz.max_depth() == 64
    assert fz.check_plans(native.native) == []


def test_the_last_input_survives_for_a_crash_report(fz: Any, tmp_path: pathlib.Path) -> None:
    last = fz.LastInput(str(tmp_path / "last"))
    last.write({"schema": "JobEvent", "offset": 1}, b"\x00\xff" * 3)
    last.write({"schema": "StepTime", "offset": 0}, b"\x01\x02")
    shown = fz.LastInput.show(str(tmp_path / "last"))
    assert '"schema": "StepTime"' in shown and "hex: 0102" in shown
