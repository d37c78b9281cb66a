"""Scenario files: the shipped examples parse, JSON and TOML agree, bad input names the field."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest

from peerwatch.errors import ConfigError
from peerwatch.producers.sim.scenario import (
    CONFOUNDER_KINDS,
    FAULT_KINDS,
    default_scenario,
    load_scenario,
    parse_scenario,
    with_fleet,
)

SCENARIOS = pathlib.Path(__file__).parents[2] / "producers" / "sim" / "scenarios"

BASE: dict[str, Any] = {
    "fleet": {"nodes": 4, "gpus_per_node": 8, "duration_s": 300, "seed": 1},
    "jobs": [{"job_id": "1", "gpus": 16, "first_node": 0}],
    "faults": [
        {"name": "sm_clock_drop", "node": "gpu00000", "gpu_index": 1, "start_s": 10,
         "end_s": 100, "params": {"pct": 8}},
        {"name": "thermal_throttle", "node": 1, "gpu_index": 2, "start_s": 10},
        {"name": "xid", "node": "gpu00001", "gpu_index": 3, "start_s": 20, "params": {"xid": 79}},
    ],
    "confounders": [
        {"name": "clock_skew", "node": "gpu00002", "start_s": 0, "params": {"offset_ms": 1500}},
    ],
}  # fmt: skip


def test_shipped_examples_parse() -> None:
    files = sorted(SCENARIOS.glob("*.json")) + sorted(SCENARIOS.glob("*.toml"))
    assert len(files) >= 3
    for path in files:
        sc = load_scenario(path)
        assert sc.fleet.nodes >= 1
    demo = load_scenario(SCENARIOS / "demo.json")
    assert (demo.fleet.nodes, demo.fleet.gpus_per_node) == (64, 8)
    assert [f.name for f in demo.faults] == ["sm_clock_drop", "thermal_throttle", "xid",
                                             "nic_port_down"]  # fmt: skip
    # The network fault: a port of an allocated node (job 1002) down past NCCL's ~7 s timeout.
    assert demo.fleet.nics_per_node == 8 and demo.faults[3].params == {"port": 3}
    assert demo.faults[3].node in demo.jobs[1].nodes
    assert demo.faults[0].node == 5 and demo.faults[0].params == {"pct": 8}
    assert demo.jobs[0].nodes == tuple(range(32))


def test_examples_cover_every_kind() -> None:
    names = set()
    for path in SCENARIOS.iterdir():
        sc = load_scenario(path)
        names |= {i.name for i in sc.injections}
    assert names == FAULT_KINDS | CONFOUNDER_KINDS


def test_toml_and_json_give_the_same_scenario(tmp_path: pathlib.Path) -> None:
    toml = """
[fleet]
nodes = 4
gpus_per_node = 8
duration_s = 300
seed = 1

[[jobs]]
job_id = "1"
gpus = 16
first_node = 0

[[faults]]
name = "sm_clock_drop"
node = "gpu00000"
gpu_index = 1
start_s = 10
end_s = 100
params = { pct = 8 }

[[faults]]
name = "thermal_throttle"
node = 1
gpu_index = 2
start_s = 10

[[faults]]
name = "xid"
node = "gpu00001"
gpu_index = 3
start_s = 20
params = { xid = 79 }

[[confounders]]
name = "clock_skew"
node = "gpu00002"
start_s = 0
params = { offset_ms = 1500 }
"""
    (tmp_path / "s.toml").write_text(toml)
    (tmp_path / "s.json").write_text(json.dumps(BASE))
    assert load_scenario(tmp_path / "s.toml") == load_scenario(tmp_path / "s.json")


def test_defaults_and_node_names() -> None:
    sc = parse_scenario({"fleet": {"nodes": 3, "node_name_pattern": "node-{:03d}"}})
    assert sc.fleet.gpu_model == "H100" and sc.fleet.interval_ms == 1000
    assert [sc.fleet.node_name(i) for i in range(3)] == ["node-000", "node-001", "node-002"]
    assert sc.jobs == () and sc.injections == ()


def _mutate(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    target: Any = doc
    keys = path.replace("[", ".").replace("]", "").split(".")
    for k in keys[:-1]:
        target = target[int(k)] if k.isdigit() else target[k]
    last = keys[-1]
    if value is _DELETE:
        del target[last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return doc


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("faults[2].start_s", -5, "faults[2].start_s"),
        ("faults[2].start_s", "soon", "faults[2].start_s"),
        ("faults[2].start_s", _DELETE, "faults[2].start_s"),
        ("faults[0].end_s", 5, "faults[0].end_s"),
        ("faults[0].name", "cosmic_ray", "faults[0].name"),
        ("faults[0].node", "gpu09999", "faults[0].node"),
        ("faults[0].node", 4, "faults[0].node"),
        ("faults[0].gpu_index", 8, "faults[0].gpu_index"),
        ("faults[0].gpu_index", _DELETE, "faults[0].gpu_index"),
        ("faults[0].params", {"pct": 150}, "faults[0].params.pct"),
        ("faults[2].params", {"xid": "bad"}, "faults[2].params.xid"),
        ("faults[1].colour", "red", "faults[1].colour"),
        ("confounders[0].params", {"offset_ms": 60_000}, "confounders[0].params.offset_ms"),
        ("confounders[0].name", "thermal_throttle", "confounders[0].name"),
        ("confounders[0].node", _DELETE, "confounders[0].node"),
        ("fleet.nodes", 0, "fleet.nodes"),
        ("fleet.nodes", 2.5, "fleet.nodes"),
        ("fleet.gpu_model", "A100", "fleet.gpu_model"),
        ("fleet.interval_s", 0, "fleet.interval_s"),
        ("fleet.nodez", 3, "fleet.nodez"),
        ("fleet.node_name_pattern", "gpu", "fleet.node_name_pattern"),
        ("fleet.step_times", "yes", "fleet.step_times"),
        ("jobs[0].gpus", 0, "jobs[0].gpus"),
        ("jobs[0].gpus", 1000, "jobs[0].gpus"),
        ("jobs[0].first_node", 3, "jobs[0].first_node"),
        ("jobs[0].nodes", ["gpu00000"], "jobs[0].nodes"),
        ("jobs[0].job_id", _DELETE, "jobs[0].job_id"),
        ("faults", {"name": "xid"}, "faults"),
        ("extra", 1, "extra"),
    ],
)
def test_bad_scenario_names_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_scenario(_mutate(path, value))
    assert info.value.field == field
    assert field in str(info.value)


def test_duplicate_job_id_and_bad_workload() -> None:
    doc = copy.deepcopy(BASE)
    doc["jobs"].append({"job_id": "1", "gpus": 8})
    with pytest.raises(ConfigError, match=r"jobs\[1\]\.job_id"):
        parse_scenario(doc)
    with pytest.raises(ConfigError, match=r"workload\.size_weights"):
        parse_scenario({"workload": {"sizes": [1, 8], "size_weights": [1]}})
    with pytest.raises(ConfigError, match=r"workload\.duration_s"):
        parse_scenario({"workload": {"duration_s": [100, 10]}})


def test_unreadable_files_raise_config_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "bad.toml").write_text("fleet = [")
    for name in ("bad.json", "bad.toml", "missing.json"):
        with pytest.raises(ConfigError) as info:
            load_scenario(tmp_path / name)
        assert info.value.field == "scenario"


def test_default_scenario_and_overrides() -> None:
    sc = default_scenario(nodes=16, duration_s=120, seed=9)
    assert sc.fleet.nodes == 16 and sc.fleet.seed == 9 and sc.workload.initial_fill > 0
    changed = with_fleet(sc, seed=10, interval_s=2.0)
    assert changed.fleet.seed == 10 and changed.fleet.interval_ms == 2000
    assert changed.workload == sc.workload
    with pytest.raises(ConfigError, match=r"fleet\.nodes"):
        with_fleet(sc, nodes=0)
    pinned = parse_scenario(BASE)
    with pytest.raises(ConfigError, match=r"fleet\.nodes"):
        with_fleet(pinned, nodes=1)  # the faults name nodes that would no longer exist
