"""Live = replay for fleet context (issue 37 items 2 and 3; DETECTION.md item 12).

A 32-node fleet (12 samples partitions; three of them hold no node) with a cooling event and then a fleet-wide power cap,
a small job (4 GPUs: no peers, judged against its own past and the fleet's clock ratio), a
node whose agent stops for 90 s and an XID 79 (a hard fault), published fast through the real
broker to one real worker (``peerwatch stream``) while the archiver (``peerwatch archive``)
keeps the topics; then ``peerwatch replay --archive`` replays the archive. The worker's findings
and recommendations must be byte for byte (the Avro bytes of each record, sorted):

- the offline pipeline's on the same records as the worker reads them, all of them;
- the archive replay's, on every window the worker closed (replay closes the last open
  windows at the end of its range, the worker waits for later samples: outputs of windows
  ending after the last sample time - lateness are left out, as in test_replay). In particular the cooling
event and the power cap are ONE ``FLEET_WIDE`` finding each (before, the worker published one per
samples partition that held busy GPUs, each counting only its own GPUs), and the silent node's
SILENT and CLEARED carry the same times (before, the worker checked on its own clock). Findings
have no wall-clock field (``detected_ms`` is event time), so nothing is masked.

The replay's JSON lines are encoded again with the same Avro schemas (JSON keeps a double
exactly). As in test_stream_app, the offline pipeline is fed without ``finish()``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from peerwatch.settings import KafkaSettings
from peerwatch.streams.live.hot_spec import samples_partition
from peerwatch.topics import NODE_PARTITIONS

from .live_replay import (
    FINDINGS,
    assert_live_is,
    live_and_replay,
    offline_bytes,
)
from .test_stream_app import INTERVAL_S, recent_scenario

pytestmark = pytest.mark.timeout(900)
DURATION_S = 300
#: A node of job 3001 whose agent stops for 90 s (a SILENT finding, then its CLEARED).
SILENT_NODE = "gpu00005"


def scenario_doc(start_ms: int) -> dict[str, Any]:
    return {
        "fleet": {"nodes": 32, "gpus_per_node": 8, "interval_s": INTERVAL_S,
                  "duration_s": DURATION_S, "seed": 11, "start_ms": start_ms},
        "jobs": [
            {"job_id": "3001", "gpus": 128, "first_node": 0, "warmup_s": 0, "duration_s": 7200},
            {"job_id": "3002", "gpus": 112, "first_node": 16, "warmup_s": 0, "duration_s": 7200},
            {"job_id": "3003", "gpus": 4, "first_node": 30, "warmup_s": 0, "duration_s": 7200},
        ],
        "faults": [
            {"name": "xid", "node": "gpu00020", "gpu_index": 3, "start_s": 250,
             "params": {"xid": 79}},
            {"name": "agent_silent", "node": SILENT_NODE, "start_s": 100, "end_s": 190},
        ],
        "confounders": [
            {"name": "cluster_cooling", "start_s": 60, "end_s": 120,
             "params": {"clock_drop_pct": 6}},
            {"name": "cluster_power_cap", "start_s": 170, "end_s": 240,
             "params": {"limit_w": 450}},
        ],
    }  # fmt: skip


def test_live_fleet_findings_are_the_replays_byte_for_byte(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    sc = recent_scenario(scenario_doc, DURATION_S)
    want_findings, want_recs = offline_bytes(sc)
    codec = FINDINGS
    fleet_wide = [codec.decode(b) for b in want_findings]
    fleet_wide = [f for f in fleet_wide if f["status"] == "FLEET_WIDE"]
    assert sorted(f["cause"] for f in fleet_wide) == ["POWER", "THERMAL"]  # the scenario works
    assert all(f["windows_considered"] > 200 for f in fleet_wide)  # the whole fleet's GPUs
    silent = [(f["status"], f["node"]) for f in (codec.decode(b) for b in want_findings)
              if f["cause"] == "NO_SAMPLES"]  # fmt: skip
    assert silent == [("SILENT", SILENT_NODE), ("CLEARED", SILENT_NODE)] or sorted(silent) == [
        ("CLEARED", SILENT_NODE), ("SILENT", SILENT_NODE)]  # fmt: skip

    # some samples partitions hold no node: neither fleet nor silence may wait for them
    held = {samples_partition(f"gpu{i:05d}", NODE_PARTITIONS) for i in range(32)}
    assert len(held) < NODE_PARTITIONS
    got = live_and_replay(kafka_settings, tmp_path, sc, DURATION_S)
    live = [codec.decode(b) for b in got.live_findings]
    assert [f["cause"] for f in live if f["status"] == "FLEET_WIDE"].count("POWER") == 1, live
    assert_live_is(want_findings, want_recs, got)
