"""The simulated fleet: a pure, deterministic generator of NodeGpuSample, JobEvent, NodeStateEvent
and StepTime records for a scenario, plus the ground-truth labels of what was injected.

    scenario = load_scenario("producers/sim/scenarios/demo.json")
    fleet = Fleet(scenario)
    for records in fleet.ticks():          # one list per tick, in event-time order
        for stream, key, value in records: # stream: samples | job-events | node-events | step-times
            ...
    labels = fleet.labels()                # one JSON-ready dict per fault and confounder

Nothing here does I/O except :func:`load_scenario` reading the scenario file.
"""

from __future__ import annotations

from peerwatch.producers.sim.fleet import STREAMS, Fleet, SimRecord
from peerwatch.producers.sim.labels import build_labels
from peerwatch.producers.sim.scenario import (
    CONFOUNDER_KINDS,
    FAULT_KINDS,
    FleetSpec,
    Injection,
    JobSpec,
    Scenario,
    WorkloadSpec,
    default_scenario,
    load_scenario,
    parse_scenario,
)

__all__ = [
    "CONFOUNDER_KINDS",
    "FAULT_KINDS",
    "STREAMS",
    "Fleet",
    "FleetSpec",
    "Injection",
    "JobSpec",
    "Scenario",
    "SimRecord",
    "WorkloadSpec",
    "build_labels",
    "default_scenario",
    "load_scenario",
    "parse_scenario",
]
