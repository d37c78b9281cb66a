"""The replay pipeline cut in two (stage 2 | stages 3 and 4) gives what the one-process pipeline
gives, output for output, when its messages go through pickle as they do between processes."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from test_windows_native import SCENARIOS, encode_index, fleet_records, mangle, ordered, python_run

from peerwatch.streams.core.pipeline import Output, PipelineSettings
from peerwatch.streams.offline import windows_native
from peerwatch.streams.offline.pipeline_split import BackPipeline, FrontPipeline
from peerwatch.streams.offline.windows_native import SampleRun, sort_index

pytestmark = pytest.mark.skipif(not windows_native.available(), reason="C module not built")


def split_run(records: list[Any], settings: PipelineSettings) -> tuple[list[Output], Any]:
    node_ids: dict[str, int] = {}
    index = encode_index([v for s, _, v in records if s == "samples"], node_ids)
    sort_index(index, node_ids)
    back = BackPipeline(settings)
    outs: list[Output] = []
    kinds: list[str] = []

    def send(message: Any) -> None:
        kinds.append(message[0])
        outs.extend(back.handle(pickle.loads(pickle.dumps(message))))

    front = FrontPipeline(settings, node_ids, send)
    pos = 0
    for stream, key, value in records:
        if stream == "samples":
            assert front.feed_samples(SampleRun(index, pos, pos + 1)) == []
            pos += 1
        else:
            assert front.feed(stream, key, value) == []
    assert front.finish() == []
    assert kinds[-1] == "finish" and "drain" in kinds
    return outs, back.counters()


@pytest.mark.parametrize(("seed", "faults"), SCENARIOS)
def test_split_equals_one_process(seed: int, faults: list[Any]) -> None:
    from peerwatch.streams.offline.replay import live_equivalent_settings

    records = ordered(fleet_records(seed, faults))
    settings = live_equivalent_settings()
    got, got_counters = split_run(records, settings)
    want, want_counters = python_run(records, settings)
    assert got == want
    assert got_counters == want_counters
    assert any(o.kind == "finding" for o in want) or not faults


def test_split_equals_one_process_on_mangled_input_with_step_times() -> None:
    from peerwatch.streams.offline.replay import live_equivalent_settings

    records = mangle(fleet_records(12, SCENARIOS[1][1]), 12)
    steps = []
    for stream, _, value in records:
        if stream == "samples" and value["node"] == "gpu00000" and value["ts_ms"] % 5000 == 0:
            for g in value["gpus"][:4]:
                steps.append(("step-times", "7", {
                    "job_id": "7", "node": value["node"], "gpu_index": g["index"],
                    "ts_ms": value["ts_ms"], "step": 1, "step_duration_ms": 100.0 + g["index"],
                }))  # fmt: skip
    records = ordered(records + steps)
    settings = live_equivalent_settings()
    got, got_counters = split_run(records, settings)
    want, want_counters = python_run(records, settings)
    assert want_counters["step_times"] == len(steps) > 0
    assert any(o.kind == "window" and o.value["step_ms"] is not None for o in want)
    assert got == want
    assert got_counters == want_counters


def test_back_refuses_samples_and_unknown_messages() -> None:
    back = BackPipeline(PipelineSettings())
    with pytest.raises(ValueError, match="unknown message"):
        back.handle(("nonsense",))
    with pytest.raises(TypeError):
        back.aggregator.add_batch([])
