"""schemas/records.py (TypedDicts generated from the .avsc files): up to date, and the records
the project's own code builds have exactly the keys and value types those TypedDicts declare."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from closedgen import closed_windows
from fakes import FakeClock, FakeGpu, FakeNvml

from peerwatch.exporters.drain.audit import action_record, resume_record
from peerwatch.exporters.drain.decide import Decision, Outcome, Refusal
from peerwatch.producers.health.run import HealthDeps, HealthSettings, run_health
from peerwatch.producers.nic.ports import discover_ports
from peerwatch.producers.nic.sampler import NicSampler
from peerwatch.producers.nic.sysfs import Reader, SysfsTree
from peerwatch.producers.sim import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas import records, registry, typegen
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import Settings
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, WINDOW, run_records
from peerwatch.streams.live.window_batches import WindowBatchCodec, job_parts


def test_records_module_matches_the_schemas() -> None:
    assert typegen.shipped() == typegen.generate(), (
        f"schemas/records.py is stale; regenerate it: {typegen.COMMAND}"
    )
    assert typegen.main(["--check"]) == 0


def test_every_schema_has_its_typed_dict() -> None:
    for name in registry.SCHEMA_NAMES:
        assert typing.is_typeddict(getattr(records, name))


def test_generator_mapping() -> None:
    schema = {
        "type": "record",
        "name": "io.x.Outer",
        "doc": "Outer doc.",
        "fields": [
            {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "maybe", "type": ["null", "double"], "doc": "A field doc."},
            {"name": "tags", "type": {"type": "map", "values": "string"}},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
            {"name": "kinds", "type": {"type": "array", "items": "Kind"}},
            {
                "name": "inner",
                "type": ["null", {"type": "record", "name": "Inner", "fields": [
                    {"name": "flag", "type": "boolean"}, {"name": "raw", "type": "bytes"},
                ]}],
            },
        ],
    }  # fmt: skip
    gen = typegen._Gen()
    assert gen.type_of(schema) == "Outer"
    text = "\n\n".join(gen.blocks)
    assert 'Kind = Literal["A", "B"]' in text
    assert "class Inner(TypedDict):\n    flag: bool\n\n    raw: bytes" in text
    assert '"""Outer doc."""' in text
    assert "    ts_ms: int\n" in text
    assert "    #: A field doc.\n    maybe: float | None\n" in text
    assert "    tags: dict[str, str]\n" in text
    assert "    kinds: list[Kind]\n" in text
    assert "    inner: Inner | None" in text
    assert text.index("class Inner") < text.index("class Outer")


def test_two_types_of_one_name_are_refused() -> None:
    gen = typegen._Gen()
    gen.type_of({"type": "enum", "name": "E", "symbols": ["A"]})
    gen.type_of({"type": "enum", "name": "E", "symbols": ["A"], "doc": "same shape"})
    with pytest.raises(ValueError, match="'E'"):
        gen.type_of({"type": "enum", "name": "E", "symbols": ["B"]})


# -- records built by the project's own code --------------------------------------------------


def _mismatches(value: Any, hint: Any, where: str) -> Iterator[str]:
    """Where ``value`` departs from the type ``hint`` (TypedDict keys exactly, recursively)."""
    origin = typing.get_origin(hint)
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            yield f"{where}: {type(value).__name__}, not a {hint.__name__} dict"
            return
        hints = typing.get_type_hints(hint)
        if set(value) != set(hints):
            extra, missing = sorted(set(value) - set(hints)), sorted(set(hints) - set(value))
            yield f"{where}: {hint.__name__} keys differ: extra {extra}, missing {missing}"
        for key in set(value) & set(hints):
            yield from _mismatches(value[key], hints[key], f"{where}.{key}")
    elif origin in (typing.Union, types.UnionType):
        if not any(not list(_mismatches(value, arg, where)) for arg in typing.get_args(hint)):
            yield f"{where}: {value!r} is not {hint}"
    elif origin is typing.Literal:
        if value not in typing.get_args(hint):
            yield f"{where}: {value!r} is not one of {typing.get_args(hint)}"
    elif origin is list:
        if not isinstance(value, list):
            yield f"{where}: {type(value).__name__}, not a list"
            return
        (item,) = typing.get_args(hint)
        for i, v in enumerate(value):
            yield from _mismatches(v, item, f"{where}[{i}]")
    elif origin is dict:
        if not isinstance(value, dict):
            yield f"{where}: {type(value).__name__}, not a dict"
            return
        _, item = typing.get_args(hint)
        for k, v in value.items():
            yield from _mismatches(v, item, f"{where}[{k!r}]")
    elif hint is type(None):
        if value is not None:
            yield f"{where}: {value!r} is not None"
    else:
        # bool is an int to Python, never to Avro; an int is fine where a float is declared.
        allowed = (int, float) if hint is float else (hint,)
        if not isinstance(value, allowed) or (isinstance(value, bool) and hint is not bool):
            yield f"{where}: {value!r} is not {hint.__name__}"


#: A job of 32 GPUs on four nodes: one slow GPU (findings, a DRAIN), an XID 79 (HARD_ERROR).
SCENARIO: dict[str, Any] = {
    "fleet": {"nodes": 4, "gpus_per_node": 8, "interval_s": 10, "duration_s": 900, "seed": 3,
              "step_times": True},
    "jobs": [{"job_id": "a", "gpus": 32, "first_node": 0, "warmup_s": 0}],
    "faults": [
        {"name": "sm_clock_drop", "node": 0, "gpu_index": 1, "start_s": 60, "params": {"pct": 10}},
        {"name": "xid", "node": 2, "gpu_index": 0, "start_s": 300, "params": {"xid": 79}},
    ],
}  # fmt: skip
STREAM_RECORD = {
    "samples": "NodeGpuSample",
    "job-events": "JobEvent",
    "node-events": "NodeStateEvent",
    "step-times": "StepTime",
}
OUTPUT_RECORD = {
    WINDOW: "GpuWindow",
    FINDING: "StragglerFinding",
    RECOMMENDATION: "DrainRecommendation",
}


def _health_result() -> dict[str, Any]:
    deps = HealthDeps(
        nvml=FakeNvml([FakeGpu.h100(0), FakeGpu.h100(1)]),
        which=lambda _: None,
        clock=FakeClock(1_700_000_000_000, step_ms=25),
        new_id=lambda: "run-1",
    )
    settings = HealthSettings(expected_gpus=2, ib_sysfs_root=Path("/nonexistent"))
    result, _ = run_health("PROLOG", node="gpu-a01", settings=settings, job_id="42", deps=deps)
    return result


def _nic_sample() -> dict[str, Any]:
    reader = Reader(SysfsTree(Path(__file__).parents[1] / "data" / "sysfs" / "hgx"))
    ports = discover_ports(reader, {0: "00000000:04:00.0"})
    sampler = NicSampler(reader, ports, node="gpu-a01", interval_ms=1000,
                         clock=FakeClock(1_700_000_000_000), agent_run_id="run-1")  # fmt: skip
    return sampler.sample(0)


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    """name -> records of that type built by the simulator, the pipeline, the health run and
    the drain controller's audit trail."""
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in registry.SCHEMA_NAMES}
    inputs = [rec for tick in Fleet(parse_scenario(SCENARIO)).ticks() for rec in tick]
    for rec in inputs:
        out[STREAM_RECORD[rec.stream]].append(rec.value)
    for o in run_records(((r.stream, r.key, r.value) for r in inputs), Settings()):
        if o.kind in OUTPUT_RECORD:
            out[OUTPUT_RECORD[o.kind]].append(o.value)
    out["HealthCheckResult"].append(_health_result())
    out["NodeNicSample"].append(_nic_sample())
    closed = next(c for c in closed_windows() if c.xids)
    job_id, part = next(iter(job_parts(closed).items()))
    batch = WindowBatchCodec().encode_batch(job_id, closed.start_ms, closed.end_ms, {0: part}, 1.5)
    out["WindowBatch"].append(AvroCodec("WindowBatch").decode(batch))
    decision = Decision(Outcome.REFUSED, "gpu-a01", 1, False, "x", "rec-1", Refusal.BREAKER_OPEN)
    out["DrainAction"] += [action_record(decision), resume_record("gpu-a01", 2, "operator")]
    return out


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_built_records_have_exactly_the_typed_dict_keys(
    built: dict[str, list[dict[str, Any]]], name: str
) -> None:
    got = built[name]
    assert got, f"no {name} built"
    problems = [
        p for i, r in enumerate(got) for p in _mismatches(r, getattr(records, name), f"{name}[{i}]")
    ]
    assert problems[:10] == []


def test_scenario_builds_every_finding_and_recommendation_kind(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    statuses = {f["status"] for f in built["StragglerFinding"]}
    assert {"SUSPECT", "CONFIRMED", "HARD_ERROR"} <= statuses
    assert {r["action"] for r in built["DrainRecommendation"]} == {"ALERT", "DRAIN"}


def test_every_drain_outcome_has_its_schema_decision() -> None:
    # audit._DECISION narrows Outcome to the schema's enum without a cast: an Outcome added
    # without its entry would raise KeyError when its action is built.
    from peerwatch.exporters.drain import audit

    assert {o: str(o) for o in Outcome} == audit._DECISION
    assert set(audit._DECISION.values()) <= set(typing.get_args(records.DrainDecision))
