"""Stage 2's compiled loops (``streams/core/loops.py``) behave as their Python source, and their
entry points refuse indices that would reach outside an array.

The loops are one implementation: numba compiles the Python functions. These tests run both
(the compiled function and the Python function it was compiled from) over the same hostile batches (duplicate GPUs, times
out of order and repeated, counters out of range or reset, LOST readings, missing values) and
compare every output and the memory they leave, to the last bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from peerwatch.streams.core import loops

SEEDS = range(12)


def ro(a: np.ndarray) -> np.ndarray:
    """Read-only, as the entry points pass what a loop only reads (the type it is compiled
    for)."""
    v = a.view()
    v.flags.writeable = False
    return v


def ros(arrays: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    return tuple(ro(a) for a in arrays)


def _counter_batch(rng: np.random.Generator, m: int, n_gpus: int) -> dict[str, Any]:
    def column() -> np.ndarray:
        x = rng.integers(0, 1 << 20, m)
        odd = rng.random(m)
        x[odd < 0.05] = -rng.integers(1, 1 << 40, int((odd < 0.05).sum()))  # negative
        x[odd > 0.95] = (1 << 53) + rng.integers(0, 9, int((odd > 0.95).sum()))  # too large
        return x.astype(np.int64)

    n = len(loops.COUNTER_FIELDS)
    return {
        "gid": rng.integers(0, n_gpus, m).astype(np.int64),
        "t": rng.integers(0, 40, m).astype(np.int64) * 250,  # repeats and out of order
        "lost": rng.random(m) < 0.1,
        "rows": np.sort(rng.choice(m + 5, m, replace=False)).astype(np.int64),
        "counters": [np.r_[column(), column()[:5]] for _ in range(n)],
        "counters_ok": [rng.random(m + 5) < 0.9 for _ in range(n)],
    }


def _memory(rng: np.random.Generator, n_gpus: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mem_ts = np.where(rng.random(n_gpus) < 0.3, -1, rng.integers(0, 5000, n_gpus)).astype(np.int64)
    mem_x = rng.integers(0, 1 << 20, (n_gpus, len(loops.MEMORY))).astype(np.int64)
    mem_ok = rng.random((n_gpus, len(loops.MEMORY))) < 0.8
    return mem_ts, mem_x, mem_ok


@pytest.mark.parametrize("seed", SEEDS)
def test_counter_deltas_compiled_equal_their_python_source(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m, n_gpus = 300, 17
    b = _counter_batch(rng, m, n_gpus)
    memories = [_memory(np.random.default_rng(seed + 1000), n_gpus) for _ in range(2)]
    outs = []
    runs = (loops._kernel("_counter_deltas"), loops._counter_deltas)
    for run, mem in zip(runs, memories, strict=True):
        out = np.zeros((m, len(loops.DELTAS)), np.int64)
        bad = run(ro(b["gid"]), ro(b["t"]), ro(b["lost"]), ro(b["rows"]), ros(b["counters"]),
                  ros(b["counters_ok"]), *mem, out)  # fmt: skip
        outs.append((out, int(bad)))
    assert outs[0][1] == outs[1][1] > 0  # some values were out of range, counted alike
    assert np.array_equal(outs[0][0], outs[1][0]) and outs[0][0].any()
    for a, b_ in zip(*memories, strict=True):
        assert np.array_equal(a, b_)


@pytest.mark.parametrize("seed", SEEDS)
def test_accumulate_compiled_equals_its_python_source(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m, n_rows, n_slots = 300, 320, 23
    names = [c for c in loops.COLUMNS if c != "sm_active_pct"]
    values = [rng.integers(-3, 200, n_rows).astype(np.int64) for _ in names]
    valid = [rng.random(n_rows) < 0.85 for _ in names]
    sm_active = rng.random(n_rows) * 100
    sm_ok = rng.random(n_rows) < 0.5
    rows = np.sort(rng.choice(n_rows, m, replace=False)).astype(np.int64)
    lost = rng.random(m) < 0.1
    deltas = rng.integers(0, 1 << 30, (m, len(loops.DELTAS))).astype(np.int64)
    sel = np.flatnonzero(rng.random(m) < 0.8).astype(np.int64)
    slot = rng.integers(0, n_slots, len(sel)).astype(np.int64)
    width = len(loops.COUNTS) + len(loops.DELTAS)
    start = rng.integers(-5, 5, (n_slots, width)).astype(np.int64)
    results = []
    for run in (loops._kernel("_accumulate"), loops._accumulate):
        ints, sums = start.copy(), np.full((n_slots, len(loops.SUMS)), 0.1)
        run(ro(sel), ro(slot), ro(rows), ro(lost), ros(values), ros(valid), ro(sm_active),
            ro(sm_ok), ro(deltas), ints, sums)  # fmt: skip
        results.append((ints, sums))
    assert np.array_equal(results[0][0], results[1][0])
    assert results[0][1].tobytes() == results[1][1].tobytes()  # float sums to the last bit
    assert not np.array_equal(results[0][0], start)


@pytest.mark.parametrize("seed", SEEDS)
def test_hard_rules_compiled_equal_their_python_source(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m, n_rows, n_gpus = 300, 310, 13
    values = [rng.integers(-2, 6, n_rows).astype(np.int64) for _ in loops.HARD_COLUMNS]
    values[0][rng.random(n_rows) < 0.05] = 1 << 53
    valid = [rng.random(n_rows) < 0.9 for _ in loops.HARD_COLUMNS]
    gid = rng.integers(0, n_gpus, m).astype(np.int64)
    t = rng.integers(0, 50, m).astype(np.int64)
    rows = np.sort(rng.choice(n_rows, m, replace=False)).astype(np.int64)
    lost = rng.random(m) < 0.15
    start = [
        np.full(n_gpus, -1, np.int64),
        rng.integers(0, 3, n_gpus).astype(np.int64),
        rng.integers(0, 3, (n_gpus, loops.N_RISE)).astype(np.int64),
        rng.integers(0, 2, (n_gpus, loops.N_RISE)).astype(np.int64),
    ]
    plan = (loops._COL_KIND, loops._COL_RULE, loops._COL_SLOT, loops._RISE_RULE, loops._BELOW_RULE,
            loops.LOST_BIT, loops.LEVEL_BITS)  # fmt: skip
    results = []
    for run in (loops._kernel("_hard_rules"), loops._hard_rules):
        memory = [a.copy() for a in start]
        bits = np.zeros(m, np.int64)
        bad = run(ro(gid), ro(t), ro(rows), ro(lost), ros(values), ros(valid), *plan, *memory, bits)
        results.append((bits, int(bad), memory))
    assert np.array_equal(results[0][0], results[1][0]) and results[0][0].any()
    assert results[0][1] == results[1][1]
    for a, b in zip(results[0][2], results[1][2], strict=True):
        assert np.array_equal(a, b)


def test_entry_points_refuse_indices_outside_their_arrays() -> None:
    one = np.zeros(1, np.int64)
    ok = np.ones(1, np.bool_)
    lost = np.zeros(1, np.bool_)
    n = len(loops.COUNTER_FIELDS)
    mem_ts = np.full(2, -1, np.int64)
    mem_x = np.zeros((2, len(loops.MEMORY)), np.int64)
    mem_ok = np.zeros((2, len(loops.MEMORY)), np.bool_)
    with pytest.raises(ValueError, match="gid"):
        loops.counter_deltas(np.array([2]), one, lost, one, [one] * n, [ok] * n, mem_ts, mem_x,
                             mem_ok)  # fmt: skip
    with pytest.raises(ValueError, match="rows"):
        loops.counter_deltas(one, one, lost, np.array([1]), [one] * n, [ok] * n, mem_ts, mem_x,
                             mem_ok)  # fmt: skip
    assert (mem_ts == -1).all()  # nothing written
    k = len(loops.COLUMNS) - 1
    ints = np.zeros((3, len(loops.COUNTS) + len(loops.DELTAS)), np.int64)
    sums = np.zeros((3, len(loops.SUMS)))
    deltas = np.zeros((1, len(loops.DELTAS)), np.int64)
    with pytest.raises(ValueError, match="slot"):
        loops.accumulate(one, np.array([3]), one, lost, [one] * k, [ok] * k, np.zeros(1), ok,
                         deltas, ints, sums)  # fmt: skip
    with pytest.raises(ValueError, match="slot"):
        loops.accumulate(one, np.array([-1]), one, lost, [one] * k, [ok] * k, np.zeros(1), ok,
                         deltas, ints, sums)  # fmt: skip
    with pytest.raises(ValueError, match="sel"):
        loops.accumulate(np.array([1]), one, one, lost, [one] * k, [ok] * k, np.zeros(1), ok,
                         deltas, ints, sums)  # fmt: skip
    h = len(loops.HARD_COLUMNS)
    memory = [np.full(2, -1, np.int64), np.zeros(2, np.int64)] + [
        np.zeros((2, loops.N_RISE), np.int64) for _ in range(2)
    ]
    with pytest.raises(ValueError, match="gid"):
        loops.hard_rules(np.array([5]), one, one, lost, [one] * h, [ok] * h, memory)
    assert not ints.any() and (memory[0] == -1).all()


def test_a_reading_after_a_reset_counts_from_zero_and_throttle_time_is_capped() -> None:
    n = len(loops.COUNTER_FIELDS)
    energy, ecc = (
        loops.COUNTER_FIELDS.index("energy_mj"),
        loops.COUNTER_FIELDS.index("ecc_volatile_uncorrected"),
    )
    slow = loops.COUNTER_FIELDS.index("throttle_hw_slowdown_ns")
    counters = [np.zeros(3, np.int64) for _ in range(n)]
    counters[energy][:] = [1000, 1500, 200]  # a reset before the third
    counters[ecc][:] = [0, 0, 4]
    counters[slow][:] = [0, 5 * 10**9, 5 * 10**9]  # 5 s of throttling in a 1 s gap: capped
    gid = np.zeros(3, np.int64)
    t = np.array([1000, 2000, 3000], np.int64)
    ok = [np.ones(3, np.bool_)] * n
    mem = (np.full(1, -1, np.int64), np.zeros((1, len(loops.MEMORY)), np.int64),
           np.zeros((1, len(loops.MEMORY)), np.bool_))  # fmt: skip
    out, bad = loops.counter_deltas(gid, t, np.zeros(3, np.bool_), np.arange(3), counters, ok, *mem)
    col = {name: out[:, i].tolist() for i, name in enumerate(loops.DELTAS)}
    assert bad == 0
    assert col["energy"] == [0, 500, 200] and col["energy_n"] == [0, 1, 1]
    assert col["ecc"] == [0, 0, 4]
    assert col["thr_ns"] == [0, 10**9, 0] and col["thr_dt"] == [0, 10**9, 10**9]
    assert mem[0].tolist() == [3000]


def test_importing_the_core_does_not_load_numba() -> None:
    """Processes that never aggregate (stage 3's, the CLI's) import the core without numba:
    no module of streams/core imports it at module level (loops.py does when it compiles)."""
    import ast
    from pathlib import Path

    core = Path(loops.__file__).parent
    for path in sorted(core.glob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "numba" for n in names), path.name
