"""The drain controller's persisted state and settings: round trips, atomic writes, locking,
the breaker and idempotence surviving a restart, pruning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peerwatch.errors import ConfigError
from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.decide import ClusterView, NodeFacts, Outcome, apply_decision, decide
from peerwatch.exporters.drain.state import ControllerState, DrainedNode, StateStore
from peerwatch.settings import load_settings, with_overrides

NOW_MS = 1_795_000_000_000
HOUR_MS = 3_600_000
ENFORCE = DrainSettings(enforce=True)
VIEW = ClusterView.of([NodeFacts(f"n{i}", "IDLE", (), None, None, ("gpu",)) for i in range(100)])


def rec(rid: str, node: str = "n1", job: str = "1") -> dict[str, object]:
    return {"recommendation_id": rid, "node": node, "action": "DRAIN", "hard": False, "ts_ms": NOW_MS,
            "reason": "slow", "job_ids": [job], "expires_ms": NOW_MS + HOUR_MS}  # fmt: skip


def test_fresh_state_when_no_file(tmp_path: Path) -> None:
    state = StateStore(tmp_path / "missing" / "state.json").load()
    assert state == ControllerState()


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    state = ControllerState()
    apply_decision(state, decide(rec("a"), state, VIEW, ENFORCE, NOW_MS), ENFORCE)
    apply_decision(
        state, decide(rec("b", "n2", "2"), state, VIEW, DrainSettings(), NOW_MS), ENFORCE
    )
    state.operator_resumes["n7"] = NOW_MS - 5
    state.open_breaker("too many", NOW_MS)
    state.outbox.append({"action_id": "a:DRAINED", "node": "n1"})
    store.save(state)
    assert store.load() == state
    assert json.loads((tmp_path / "s.json").read_text())["version"] == 1


def test_idempotence_and_breaker_survive_a_restart(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    with store.transaction() as state:
        d = decide(rec("a"), state, VIEW, ENFORCE, NOW_MS)
        assert d.outcome == Outcome.DRAINED
        apply_decision(state, d, ENFORCE)
        state.open_breaker("test", NOW_MS)
    with store.transaction() as state:  # a new process reads the file again
        assert decide(rec("a"), state, VIEW, ENFORCE, NOW_MS + 1).outcome == Outcome.DUPLICATE
        assert (
            decide(rec("z", "n9", "9"), state, VIEW, ENFORCE, NOW_MS + 1).refusal == "breaker_open"
        )
        assert state.reset_breaker(NOW_MS + 2) is True
    state = store.load()
    assert not state.breaker.open and state.breaker.last_reset_ms == NOW_MS + 2
    assert state.reset_breaker(NOW_MS + 3) is False


def test_transaction_does_not_save_on_error(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    with pytest.raises(RuntimeError), store.transaction() as state:
        state.open_breaker("half-done", NOW_MS)
        raise RuntimeError("crash")
    assert not store.load().breaker.open


def test_save_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "s.json")
    for i in range(3):
        state = store.load()
        state.operator_resumes[f"n{i}"] = i + 1
        store.save(state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    assert store.load().operator_resumes == {"n0": 1, "n1": 2, "n2": 3}


@pytest.mark.parametrize("text", ["{", "[]", '{"version": 99}', '{"version": 1}'])
def test_corrupt_state_is_refused_not_reset(tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"drain\.state_file"):
        StateStore(path).load()


def test_prune_forgets_old_ids_and_drain_times_but_not_drained_nodes() -> None:
    state = ControllerState()
    apply_decision(state, decide(rec("old"), state, VIEW, ENFORCE, NOW_MS), ENFORCE)
    apply_decision(
        state, decide(rec("sh", "n3", "3"), state, VIEW, DrainSettings(), NOW_MS), ENFORCE
    )
    later = NOW_MS + 2 * HOUR_MS
    state.prune(later, retention_ms=HOUR_MS, window_ms=HOUR_MS)
    assert state.decided == {}
    assert state.enforce.job_drains == {} and state.enforce.partition_drains == {}
    assert "n1" in state.enforce.drained  # still drained in Slurm: still counts for the breaker
    assert state.shadow.drained == {}  # the would-be drain expired with its recommendation


def test_ledger_counts_within_window() -> None:
    state = ControllerState()
    state.enforce.add_drain(DrainedNode("n1", "a", "r", NOW_MS, ["gpu"]), ["7"])
    state.enforce.add_drain(DrainedNode("n2", "b", "r", NOW_MS + 10, ["gpu"]), ["7"])
    ledger = state.enforce
    assert ledger.drains_since(ledger.job_drains, "7", NOW_MS - 1) == 2
    assert ledger.drains_since(ledger.partition_drains, "gpu", NOW_MS) == 1
    assert ledger.drains_since(ledger.partition_drains, "cpu", 0) == 0


def test_settings_env_over_file_over_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "drain.toml"
    cfg.write_text("breaker_pct = 10.0\npartition_sizes = { gpu = 64 }\nenforce = true\n")
    env = {"PEERWATCH_DRAIN_BREAKER_PCT": "7.5", "PEERWATCH_DRAIN_CONFIG": str(cfg)}
    s = load_settings(env=env).drain
    assert s.breaker_pct == 7.5 and s.enforce is True and s.partition_sizes == {"gpu": 64}
    tree = load_settings(env={"PEERWATCH_DRAIN_PARTITION_SIZES": "gpu=100,cpu=20"})
    s = with_overrides(tree, {"drain.enforce": None}).drain
    assert s.partition_sizes == {"gpu": 100, "cpu": 20} and s.enforce is False
    assert load_settings(env={}).drain == DrainSettings()


@pytest.mark.parametrize(
    "env,field",
    [
        ({"PEERWATCH_DRAIN_BREAKER_PCT": "150"}, "drain.breaker_pct"),
        ({"PEERWATCH_DRAIN_ENFORCE": "maybe"}, "drain.enforce"),
        ({"PEERWATCH_DRAIN_PARTITION_SIZES": "gpu"}, "drain.partition_sizes"),
        ({"PEERWATCH_DRAIN_JOB_WINDOW_S": "-1"}, "drain.job_window_s"),
        ({"PEERWATCH_DRAIN_MAX_REASON_CHARS": "5"}, "drain.max_reason_chars"),
        ({"PEERWATCH_DRAIN_STATE_RETENTION_S": "0"}, "drain.state_retention_s"),
        ({"PEERWATCH_DRAIN_MAX_AGE_S": "7200"}, "drain.max_age_s"),  # above hard_max_age_s
        ({"PEERWATCH_DRAIN_MAX_DRAINED_PCT": "101"}, "drain.max_drained_pct"),
    ],
)
def test_bad_settings_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env=env)
    assert info.value.field == field
