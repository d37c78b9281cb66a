"""The hard rules are declared once (``hard_rules.HARD_RULES``); every evaluator reads that table.

For each rule (and a hard XID) the same readings go through the three evaluators: on arrival
(``HardWatch``, the compiled loop), on the closed window (``hard_rules``) and the window
prefilter (``WindowColumns.fires``, both makers: the aggregator's arrays and ``of_windows`` over
the dicts). They must agree: each fires the rule where the others do, and none fires on the
clean readings.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from peerwatch.schemas.columns import tables_from_records
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.hard_rules import (
    HARD_RULES,
    MAY_FIRE_BELOW,
    MAY_FIRE_FIELDS,
    RULE_BY_NAME,
    hard_cause,
    hard_rules,
)
from peerwatch.streams.core.hard_watch import RULES, HardWatch
from peerwatch.streams.core.loops import HARD_COLUMNS
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.core.window_columns import of_windows
from peerwatch.streams.core.windows import SAMPLE_SPEC, WindowAggregator

SETTINGS = DetectorSettings()
WINDOW_MS = SETTINGS.window_ms
T0 = 1_767_225_600_000 // WINDOW_MS * WINDOW_MS


def clean(index: int) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "state": "OK", "ecc_volatile_uncorrected": 3,
            "nvlink_replay_errors": 1, "nvlink_recovery_errors": 0, "nvlink_crc_errors": 2,
            "pcie_link_width": 16, "pcie_link_width_max": 16, "remap_pending": False,
            "remap_failed": False, "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980}  # fmt: skip


#: How each rule's fault shows in a reading (the reading after a clean one).
FAULTS: dict[str, dict[str, Any]] = {
    "gpu_lost": {"state": "LOST"},
    "remap_pending": {"remap_pending": True},
    "remap_failed": {"remap_failed": True},
    "pcie_width_degraded": {"pcie_link_width": 8},
    "ecc_uncorrected": {"ecc_volatile_uncorrected": 4},
    "nvlink_errors": {"nvlink_crc_errors": 3},
}


def faulty(index: int, rule: str) -> dict[str, Any]:
    reading = clean(index)
    if rule == "gpu_lost":  # a LOST reading carries no values
        return {"index": index, "uuid": f"GPU-{index}", "state": "LOST"}
    reading.update(FAULTS[rule])
    return reading


def samples(rule: str | None) -> list[dict[str, Any]]:
    """GPU 0 and 1 of node n1, clean in window 0; in window 1 GPU 1 shows ``rule`` (a hard XID
    79 when ``rule`` is ``"xid_79"``) and GPU 0 stays clean."""
    out = [{"node": "n1", "ts_ms": T0 + s * 1000, "gpus": [clean(0), clean(1)], "xids": []}
           for s in range(2)]  # fmt: skip
    for s in range(2):
        ts = T0 + WINDOW_MS + s * 1000
        second = clean(1) if rule in (None, "xid_79") else faulty(1, rule)
        xids = [{"gpu_index": 1, "xid": 79, "ts_ms": ts}] if rule == "xid_79" and s == 0 else []
        out.append({"node": "n1", "ts_ms": ts, "gpus": [clean(0), second], "xids": xids})
    return out


def allocations() -> AllocationTable:
    table = AllocationTable()
    table.apply_event({"job_id": "J", "kind": "STARTED", "ts_ms": T0 - 600_000,
                       "start_ms": T0 - 600_000, "user": "u", "partition": "p", "account": "a",
                       "allocations": [{"node": "n1", "gpu_indices": [0, 1]}]})  # fmt: skip
    return table


def on_arrival(rule: str | None) -> list[tuple[int, list[str], str]]:
    strings: dict[str, int] = {}
    names: list[str] = []

    def name(code: int) -> str:
        names.extend(list(strings)[len(names) :])
        return names[code]

    watch = HardWatch(allocations(), name, SETTINGS)
    found = watch.add_columns(tables_from_records(SAMPLE_SPEC, samples(rule), strings))
    return [(int(f["gpu_index"] or 0), list(f["hard_rules"]), str(f["cause"])) for f in found]


def on_windows(rule: str | None) -> list[tuple[int, int, list[str], bool, bool]]:
    """Per closed window (start, GPU): the rules that fire, and the prefilter of both makers."""
    agg = WindowAggregator(allocations(), WINDOW_MS / 1000, 0)
    agg.add_batch(samples(rule))
    out = []
    for closed in agg.pop_all():
        for _job, windows, columns in closed.by_job():
            dicts = list(windows)
            again = of_windows(dicts, columns.keys, [w["lost"] for w in dicts],
                               [w["samples"] for w in dicts])  # fmt: skip
            for k, w in enumerate(dicts):
                out.append((int(w["window_start_ms"]) - T0, int(w["gpu_index"]),
                            hard_rules(w, SETTINGS), bool(columns.fires[k]),
                            bool(again.fires[k])))  # fmt: skip
    return sorted(out)


def test_the_catalogue_is_the_one_list_of_rules_every_evaluator_names() -> None:
    assert RULES == tuple(r.name for r in HARD_RULES) == tuple(RULE_BY_NAME)
    assert set(FAULTS) == set(RULES)  # this test covers every rule
    assert set(HARD_COLUMNS) == {c for r in HARD_RULES for c in r.reading_columns}
    assert set(MAY_FIRE_FIELDS) | {f for pair in MAY_FIRE_BELOW for f in pair} == {
        "xids",
        *(f for r in HARD_RULES for f in r.window_fields),
    }


def test_clean_readings_fire_nothing_anywhere() -> None:
    assert on_arrival(None) == []
    assert on_windows(None) == [(0, 0, [], False, False), (0, 1, [], False, False),
                                (WINDOW_MS, 0, [], False, False),
                                (WINDOW_MS, 1, [], False, False)]  # fmt: skip


@pytest.mark.parametrize("rule", [*RULES, "xid_79"])
def test_each_rule_fires_in_every_evaluator_on_the_same_readings(rule: str) -> None:
    arrival = on_arrival(rule)
    assert [(gpu, rules) for gpu, rules, _ in arrival] == [(1, [rule])]
    assert arrival[0][2] == hard_cause([rule])
    windows = on_windows(rule)
    fired = [(start, gpu) for start, gpu, rules, _, _ in windows if rule in rules]
    assert fired == [(WINDOW_MS, 1)]
    for start, gpu, rules, fires, fires_from_dicts in windows:
        # the prefilter never hides a window a rule fires on; both makers agree
        assert fires == fires_from_dicts
        assert fires or not rules
        if (start, gpu) != (WINDOW_MS, 1):
            assert rules == [] and not fires


def test_the_cause_of_a_rule_is_declared_with_it() -> None:
    assert hard_cause(["nvlink_errors", "pcie_width_degraded"]) == "LINK"
    assert hard_cause(["nvlink_errors", "xid_79"]) == "HARDWARE"
    assert {r.name for r in HARD_RULES if r.cause == "LINK"} == {
        "nvlink_errors",
        "pcie_width_degraded",
    }
    assert np.all([r.kind in ("level", "lost", "rise", "below") for r in HARD_RULES])
