"""The mutation fuzzer of archive files, spool segments, Slurm JSON and Kafka messages
(scripts/fuzz_inputs.py) in the unit tier: a bounded number of seeded inputs per target hold, and the checks catch a reader
that loses records, invents them or gives up on a whole document. CI runs the same loop for a
minute (make fuzz)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "fuzz_inputs.py"


@pytest.fixture(scope="module")
def fz() -> Iterator[Any]:
    spec = importlib.util.spec_from_file_location("fuzz_inputs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_inputs"] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("fuzz_inputs", None)


def test_every_target_holds_on_seeded_inputs(fz: Any) -> None:
    result = fz.run(None, seed=12, targets=sorted(set(fz.TARGETS) - fz.NETWORK_TARGETS), inputs=60)
    assert result.failures == []
    assert result.inputs == {"archive": 60, "config": 60, "display": 60, "kafka": 60, "slurm": 60,
                             "spool": 60, "spool-segments": 60, "step-times": 60, "sysfs": 60,
                             "topic-folders": 60}  # fmt: skip


def test_a_reader_that_drops_the_rest_of_a_file_is_caught(
    fz: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = fz.read_file

    def first_block_only(path: Any, schema: Any, stats: Any = None) -> Any:
        it = real(path, schema, stats=stats)
        yield next(it)  # as if the first fault, wherever it is, ended the file uncounted

    monkeypatch.setattr(fz, "read_file", first_block_only)
    result = fz.run(None, seed=3, targets=["archive"], inputs=20)
    assert any("lost records of undamaged blocks" in f for f in result.failures)


def test_a_spool_that_loses_a_record_is_caught(fz: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    class Lossy(fz.Spool):  # type: ignore[name-defined,misc]
        def peek(self, limit: int) -> list[Any]:
            return list(super().peek(limit))[1:]

    monkeypatch.setattr(fz, "Spool", Lossy)
    result = fz.run(None, seed=3, targets=["spool"], inputs=10)
    assert result.failures and all("spool" in f for f in result.failures)


def test_a_slurm_reader_that_gives_up_on_the_document_is_caught(
    fz: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    strict = {name: (f, s, lambda doc, s=s: (s(doc), []), k)
              for name, (f, s, _, k) in fz.SLURM_DOCS.items()}  # fmt: skip
    monkeypatch.setattr(fz, "SLURM_DOCS", strict)
    result = fz.run(None, seed=3, targets=["slurm"], inputs=30)
    assert any("whole document unreadable" in f for f in result.failures)


def test_paths_walk_a_value_nested_far_past_the_recursion_limit(fz: Any) -> None:
    # A mutation may nest a value ~900 deep and a later one walk the document again: the
    # harness's own walk must not recurse (it did, and CI's fuzz step failed on it).
    deep: Any = 1
    for _ in range(5000):
        deep = {"a": [deep]}
    paths = list(fz._paths({"jobs": [deep], "meta": 1}))
    assert paths[:3] == [(), ("jobs",), ("jobs", 0)]
    assert max(len(p) for p in paths) == 2 + 2 * 5000
    assert paths[-1] == ("meta",)


def test_a_stream_agent_that_lets_a_hostile_message_escape_is_caught(
    fz: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As before the fuzzer: json.loads as it is (a list has no .get; deep nesting recurses).
    import json

    from peerwatch.streams.live import handlers

    monkeypatch.setattr(handlers, "json_object", json.loads)
    monkeypatch.setattr(fz, "KAFKA_CONSUMERS", {"jobs": fz.KAFKA_CONSUMERS["jobs"]})
    result = fz.run(None, seed=3, targets=["kafka"], inputs=40)
    assert any("AttributeError" in f or "RecursionError" in f for f in result.failures)


def test_a_dead_letter_that_drops_the_original_key_is_caught(
    fz: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peerwatch.io import deadletter

    real = deadletter.produce_dead_letter
    monkeypatch.setattr(deadletter, "produce_dead_letter",
                        lambda p, t, v, k, h: real(p, t, v, None, h))  # fmt: skip
    monkeypatch.setattr(fz, "KAFKA_CONSUMERS", {"export": fz.KAFKA_CONSUMERS["export"]})
    result = fz.run(None, seed=3, targets=["kafka"], inputs=20)
    assert any("lost the original key" in f for f in result.failures)


def test_a_replay_that_takes_a_nan_step_time_is_caught(
    fz: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peerwatch.streams.core import job_stage

    monkeypatch.setattr(job_stage, "step_duration_ms", lambda r: float(r["step_duration_ms"]))
    result = fz.run(None, seed=3, targets=["step-times"], inputs=10)
    assert result.failures and all("step-times" in f for f in result.failures)


def test_a_reader_that_takes_an_impossible_hour_is_caught(
    fz: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from peerwatch.io.archive import layout

    monkeypatch.setattr(layout, "hour_start_ms", lambda hour: 0)  # any hour: 1970
    result = fz.run(None, seed=3, targets=["topic-folders"], inputs=10)
    assert any("counted" in f for f in result.failures)


def test_a_sysfs_reader_that_trusts_the_file_is_caught(
    fz: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Naive(fz.NicReader):  # type: ignore[name-defined,misc]
        def counter(self, path: str) -> int | None:
            data = self.raw(path)
            return None if data is None else int(data.strip())  # as if sysfs were well-formed

    monkeypatch.setattr(fz, "NicReader", Naive)
    result = fz.run(None, seed=3, targets=["sysfs"], inputs=20)
    assert any("ValueError" in f for f in result.failures)


def test_an_unescaped_view_is_caught(fz: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import peerwatch.console

    monkeypatch.setattr(peerwatch.console, "display_text", lambda value, max_chars=80: str(value))
    result = fz.run(None, seed=12, targets=["display"], inputs=5)
    assert len(result.failures) == 5 and "reached the terminal" in result.failures[0]
