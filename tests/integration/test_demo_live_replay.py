"""Live = replay for the demo (issue 37 item 3): ``producers/sim/scenarios/demo.json``, its
faults brought forward into the first 8 minutes, through the real broker to one real worker
and the archiver, then the archive replayed (:mod:`tests.integration.live_replay`). The
worker's findings and recommendations must be the in-process runner's on the same records, and
the replay's the worker's, byte for byte.

With the demo's NIC samples (twice the records, published as fast as the broker takes them,
so the worker starts behind) this found the hot stage stepping a whole backlog batch at once:
the first windows it closed were summarised after stage 2 had dropped their NIC readings, and
the job comparison missed the port-down (tests/unit/test_hot_stage_nic_join.py holds it
without a broker)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from peerwatch.settings import KafkaSettings

from .live_replay import (
    FINDINGS,
    assert_live_is,
    live_and_replay,
    offline_bytes,
)
from .test_stream_app import recent_scenario

pytestmark = pytest.mark.timeout(900)
DEMO = Path(__file__).parents[2] / "producers" / "sim" / "scenarios" / "demo.json"
#: The demo's 30 minutes, shortened: every fault and job start scaled by this much.
DURATION_S, SCALE = 480, 0.25


def demo_doc(start_ms: int, nics: bool = True) -> dict[str, Any]:
    """The demo scenario over :data:`DURATION_S`, its fault times scaled by :data:`SCALE`
    (``nics`` False: without its NICs and their fault)."""
    doc: dict[str, Any] = json.loads(DEMO.read_text())
    doc["fleet"].update(duration_s=DURATION_S, start_ms=start_ms)
    if not nics:
        doc["fleet"].pop("nics_per_node", None)
        doc["faults"] = [f for f in doc["faults"] if not f["name"].startswith("nic_")]
    for fault in doc["faults"]:
        for name in ("start_s", "end_s"):
            if name in fault:
                fault[name] = int(fault[name] * SCALE)
    for job in doc["jobs"]:
        if "start_s" in job:
            job["start_s"] = int(job["start_s"] * SCALE)
    return doc


@pytest.mark.parametrize("nics", [False, True], ids=["gpus", "gpus-and-nics"])
def test_demo_live_findings_are_the_replays_byte_for_byte(
    kafka_settings: KafkaSettings, tmp_path: Path, nics: bool
) -> None:
    sc = recent_scenario(functools.partial(demo_doc, nics=nics), DURATION_S)
    want_findings, want_recs = offline_bytes(sc)
    found = [FINDINGS.decode(b) for b in want_findings]
    # the scenario works: its XID and its clock-drop straggler are found, and recommended
    assert any(f["node"] == "gpu00050" and f["gpu_index"] == 1 for f in found), found
    assert any(f["node"] == "gpu00005" and f["gpu_index"] == 3 for f in found), found
    assert want_recs
    got = live_and_replay(kafka_settings, tmp_path, sc, DURATION_S)
    assert_live_is(want_findings, want_recs, got)
