"""Stage 2's per-reading loops, compiled by numba: one pass over a batch each.

:class:`~peerwatch.streams.core.windows.WindowAggregator` lays a batch out in numpy (which GPU,
job, window and slot each reading goes to); two loops do its per-reading work: a GPU's counter
deltas against its memory (:func:`counter_deltas`, arrival order over the whole batch) and the
sums, counts, maxima and minima of one window's slots (:func:`accumulate`).
:class:`~peerwatch.streams.core.hard_watch.HardWatch` compares each reading with its GPU's
memory for the hard rules on arrival (:func:`hard_rules`). They are written once, in Python
(there is no other copy of them); numba compiles them (``cache=True``: once per machine, kept
beside this file or under ``NUMBA_CACHE_DIR``). ``NUMBA_DISABLE_JIT=1`` runs the same source as
plain Python; ``tests/unit/test_loops.py`` compares the compiled functions with that source, and
``make fuzz`` runs the input fuzzer with ``NUMBA_BOUNDSCHECK=1`` (every index checked).

The public functions are the entry points: they check that every index a loop will use (GPU
rows, slots, reading numbers: all made by the aggregator or the hard watch, never read from a
record) lies inside its array, since the compiled loops do not, and pass the arrays as the one
type the loops are compiled for. A record's values are only read and compared. Float sums are
taken one reading at a time in arrival order (no ``fastmath``: LLVM may not reorder them), so a
window's sums do not depend on how its readings were batched.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from peerwatch.streams.core.hard_rules import HARD_RULES, NVLINK_FIELDS

#: Clocks-event reasons that count as throttling: HW slowdown, SW thermal, HW thermal, brake.
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
#: SW power cap, kept apart from throttling.
POWER_CAP_BIT = 0x4
#: The throttling reasons a named cause needs apart: SW/HW thermal, and the HW power brake.
THERMAL_BITS = 0x20 | 0x40
POWER_BRAKE_BIT = 0x80
#: A gap between two samples counts at most this long in throttle-time denominators (~99 days).
MAX_GAP_MS = 1 << 33
#: Sample times and counter values must lie in [0, this).
VALUE_LIMIT = 1 << 53

THROTTLE_FIELDS = ("throttle_hw_slowdown_ns", "throttle_sw_thermal_ns", "throttle_hw_thermal_ns",
                   "throttle_hw_power_brake_ns")  # fmt: skip
THERMAL_FIELDS = ("throttle_sw_thermal_ns", "throttle_hw_thermal_ns")
#: The counter columns, in the order :func:`counter_deltas` takes them.
COUNTER_FIELDS = ("energy_mj", "throttle_sw_power_cap_ns", "ecc_volatile_uncorrected",
                  "pcie_replay_count", *THROTTLE_FIELDS, *NVLINK_FIELDS)  # fmt: skip

#: The counters a GPU's memory holds (columns of ``mem_x``/``mem_ok`` in :func:`counter_deltas`),
#: and which of them are throttle times (a share of the time between samples).
MEMORY = ("energy", "thr", "cap", "ecc", "nvl", "pcie", "thm", "brk")
_TIMED = (False, True, True, False, False, False, True, True)
#: Which of them a reading without a value leaves in the memory, so the next delta spans the gap:
#: energy, which an agent may read less often than each sample (``agent.energy_interval_s``).
#: A missing value of the others drops the memory (no delta across it).
_SPANS_GAPS = (True, False, False, False, False, False, False, False)
#: The columns of :func:`counter_deltas`' output: per memory counter its delta (and for energy a
#: count, for a throttle time the nanoseconds it covers).
DELTAS = ("energy", "energy_n", "thr_ns", "thr_dt", "cap_ns", "cap_dt", "ecc", "nvl", "pcie",
          "thm_ns", "thm_dt", "brk_ns", "brk_dt")  # fmt: skip
_DELTA_ROW = (0, 2, 4, 6, 7, 8, 9, 11)  # the first output column of each memory counter

#: The int accumulators :func:`accumulate` fills besides :data:`DELTAS`, in its order.
COUNTS = ("n", "lost", "temp", "bits_n", "thr_bits", "cap_bits", "thm_bits", "brk_bits", "wmin",
          "wmax", "remap_p", "remap_f", "clk_n", "sm_n", "pw_n", "pr_n")  # fmt: skip
#: The float sums, in its order.
SUMS = ("clk_s", "sm_s", "pw_s", "pr_s")
(_N, _LOST, _TEMP, _BITS_N, _THR_BITS, _CAP_BITS, _THM_BITS, _BRK_BITS, _WMIN, _WMAX, _REMAP_P,
 _REMAP_F, _CLK_N, _SM_N, _PW_N, _PR_N) = range(len(COUNTS))  # fmt: skip
_CLK_S, _SM_S, _PW_S, _PR_S = range(len(SUMS))
#: The GPU-reading columns it reads (values and valid flags), in its order.
COLUMNS = ("temperature_c", "clocks_event_reasons", "pcie_link_width", "pcie_link_width_max",
           "remap_pending", "remap_failed", "sm_clock_mhz", "sm_clock_max_mhz", "sm_active_pct",
           "gpu_util_pct", "power_mw", "power_limit_mw")  # fmt: skip


def _counter_deltas(gid: Any, t: Any, lost: Any, rows: Any, counters: Any, counters_ok: Any,
                   mem_ts: Any, mem_x: Any, mem_ok: Any, out: Any) -> int:  # fmt: skip
    """Counter deltas of readings ``i`` (arrival order; row ``rows[i]`` of the GPU table) of
    GPUs ``gid[i]`` at times ``t[i]``. ``counters``/``counters_ok``: the columns of
    :data:`COUNTER_FIELDS` and their valid flags (tuples, that order); a value outside
    ``[0, VALUE_LIMIT)`` is counted (the return value) and taken as missing. The columns add up
    to the counters of :data:`MEMORY`. A reading that moves its GPU's clock on (later than the
    GPU's memory ``mem_ts[g]``) is compared with the memory (``mem_x[g, k]``,
    ``mem_ok[g, k]``) and becomes it; a LOST reading, or one no later than the memory, neither.
    A reading without a counter of :data:`_SPANS_GAPS` (energy) keeps that counter's memory: the
    next delta spans the gap.
    Writes ``out[i, d]`` (:data:`DELTAS`; zero-filled by the caller): a counter that went down
    was reset and counts from zero; a throttle time is at most the time since the memory
    (``MAX_GAP_MS`` at most)."""
    (energy_v, cap_v, ecc_v, pcie_v, slow_v, swth_v, hwth_v, brake_v, nvl1_v, nvl2_v,
     nvl3_v) = counters  # fmt: skip
    (energy_ok, cap_ok, ecc_ok, pcie_ok, slow_ok, swth_ok, hwth_ok, brake_ok, nvl1_ok, nvl2_ok,
     nvl3_ok) = counters_ok  # fmt: skip
    bad = 0
    x = np.zeros(len(MEMORY), np.int64)
    ok = np.zeros(len(MEMORY), np.bool_)
    for i in range(len(gid)):
        r = rows[i]
        e, e_ok, b0 = _read(energy_v[r], energy_ok[r])
        c, c_ok, b1 = _read(cap_v[r], cap_ok[r])
        u, u_ok, b2 = _read(ecc_v[r], ecc_ok[r])
        p, p_ok, b3 = _read(pcie_v[r], pcie_ok[r])
        sl, sl_ok, b4 = _read(slow_v[r], slow_ok[r])
        sw, sw_ok, b5 = _read(swth_v[r], swth_ok[r])
        hw, hw_ok, b6 = _read(hwth_v[r], hwth_ok[r])
        br, br_ok, b7 = _read(brake_v[r], brake_ok[r])
        n1, n1_ok, b8 = _read(nvl1_v[r], nvl1_ok[r])
        n2, n2_ok, b9 = _read(nvl2_v[r], nvl2_ok[r])
        n3, n3_ok, b10 = _read(nvl3_v[r], nvl3_ok[r])
        bad += b0 + b1 + b2 + b3 + b4 + b5 + b6 + b7 + b8 + b9 + b10
        if lost[i]:
            continue
        g = gid[i]
        now = t[i]
        before = mem_ts[g]
        if now <= before:
            continue
        # MEMORY: energy, thr (all four throttle reasons), cap, ecc, nvl, pcie, thm, brk
        x[0], ok[0] = e, e_ok
        x[1], ok[1] = sl + sw + hw + br, sl_ok or sw_ok or hw_ok or br_ok
        x[2], ok[2] = c, c_ok
        x[3], ok[3] = u, u_ok
        x[4], ok[4] = n1 + n2 + n3, n1_ok or n2_ok or n3_ok
        x[5], ok[5] = p, p_ok
        x[6], ok[6] = sw + hw, sw_ok or hw_ok
        x[7], ok[7] = br, br_ok
        if before >= 0:
            dt_ns = min(now - before, MAX_GAP_MS) * 1_000_000
            for k in range(len(MEMORY)):
                if not (ok[k] and mem_ok[g, k]):
                    continue
                new = x[k]
                old = mem_x[g, k]
                d = _DELTA_ROW[k]
                if _TIMED[k]:
                    out[i, d] = min(max(new - old, 0), dt_ns)
                    out[i, d + 1] = dt_ns
                else:
                    out[i, d] = new - old if new >= old else new
                    if k == 0:
                        out[i, d + 1] = 1
        mem_ts[g] = now
        for k in range(len(MEMORY)):
            if _SPANS_GAPS[k] and not ok[k]:
                continue
            mem_x[g, k] = x[k]
            mem_ok[g, k] = ok[k]
    return bad


def _read(value: Any, ok: Any) -> tuple[Any, Any, int]:
    """A counter value: (value, True, 0) when read and in range, (0, False, 1) when read and out
    of range (counted as bad), (0, False, 0) when not read."""
    if not ok:
        return 0, False, 0
    if 0 <= value < VALUE_LIMIT:
        return value, True, 0
    return 0, False, 1


def _accumulate(sel: Any, slot: Any, rows: Any, lost: Any, values: Any, valid: Any, sm_active: Any,
               sm_active_ok: Any, deltas: Any, ints: Any, sums: Any) -> None:  # fmt: skip
    """Add readings ``sel[j]`` (numbers in the batch's kept readings; row ``rows[sel[j]]`` of
    the GPU table) to slots ``slot[j]`` of one window, in arrival order. ``values``/``valid``:
    the int columns of :data:`COLUMNS` but ``sm_active_pct`` (tuples, same order, that one
    left out), which comes as ``sm_active``/``sm_active_ok``; ``deltas``: the output of
    :func:`counter_deltas`; ``ints[s]``: a slot's int accumulators (:data:`COUNTS`, then
    :data:`DELTAS`), ``sums[s]``: its float sums (:data:`SUMS`). A LOST reading counts as a
    reading and sets ``lost``; nothing else of it is read."""
    (temp_v, bits_v, w_v, wmax_v, rp_v, rf_v, clk_v, mx_v, util_v, pw_v, lim_v) = values
    (temp_ok, bits_ok, w_ok, wmax_ok, rp_ok, rf_ok, clk_ok, mx_ok, util_ok, pw_ok, lim_ok) = valid
    first_delta = len(COUNTS)
    for j in range(len(sel)):
        i = sel[j]
        a = ints[slot[j]]
        f = sums[slot[j]]
        a[_N] += 1
        if lost[i]:
            a[_LOST] = 1
            continue
        r = rows[i]
        if temp_ok[r]:
            a[_TEMP] = max(a[_TEMP], temp_v[r])
        if bits_ok[r]:
            b = bits_v[r]
            a[_BITS_N] += 1
            if b & THROTTLE_BITS:
                a[_THR_BITS] += 1
            if b & POWER_CAP_BIT:
                a[_CAP_BITS] += 1
            if b & THERMAL_BITS:
                a[_THM_BITS] += 1
            if b & POWER_BRAKE_BIT:
                a[_BRK_BITS] += 1
        if w_ok[r]:
            a[_WMIN] = min(a[_WMIN], w_v[r])
        if wmax_ok[r]:
            a[_WMAX] = max(a[_WMAX], wmax_v[r])
        if rp_ok[r] and rp_v[r] != 0:
            a[_REMAP_P] = 1
        if rf_ok[r] and rf_v[r] != 0:
            a[_REMAP_F] = 1
        if clk_ok[r] and mx_ok[r] and mx_v[r] != 0:
            f[_CLK_S] += clk_v[r] / mx_v[r]
            a[_CLK_N] += 1
        if sm_active_ok[r]:
            f[_SM_S] += sm_active[r]
            a[_SM_N] += 1
        elif util_ok[r]:
            f[_SM_S] += np.float64(util_v[r])
            a[_SM_N] += 1
        if pw_ok[r]:
            f[_PW_S] += np.float64(pw_v[r])
            a[_PW_N] += 1
            if lim_ok[r] and lim_v[r] != 0:
                f[_PR_S] += pw_v[r] / lim_v[r]
                a[_PR_N] += 1
        for d in range(len(DELTAS)):
            a[first_delta + d] += deltas[i, d]


#: The arrival loop's view of :data:`~peerwatch.streams.core.hard_rules.HARD_RULES` (rule ``j``
#: fires bit ``1 << j``): the bit of the LOST condition, and of every condition that fires when it
#: turns on (the ``rise`` rules fire when their counter rises).
LOST_BIT = sum(1 << j for j, rule in enumerate(HARD_RULES) if rule.kind == "lost")
LEVEL_BITS = sum(1 << j for j, rule in enumerate(HARD_RULES) if rule.kind != "rise")
_RISE = tuple(j for j, rule in enumerate(HARD_RULES) if rule.kind == "rise")
_BELOW = tuple(j for j, rule in enumerate(HARD_RULES) if rule.kind == "below")
#: What each column of :data:`HARD_COLUMNS` is to its rule: a level flag, a counter (summed per
#: rule), or a ``below`` rule's value or maximum.
_LEVEL_COL, _COUNTER_COL, _VALUE_COL, _MAX_COL = range(4)
_HARD_PLAN = (
    [(c, _LEVEL_COL, j, 0) for j, r in enumerate(HARD_RULES) if r.kind == "level"
     for c in r.reading_columns]
    + [(c, _COUNTER_COL, j, _RISE.index(j)) for j in _RISE for c in HARD_RULES[j].reading_columns]
    + [(c, kind, j, _BELOW.index(j)) for j in _BELOW
       for c, kind in zip(HARD_RULES[j].reading_columns, (_VALUE_COL, _MAX_COL), strict=True)]
)  # fmt: skip
#: The GPU-reading columns :func:`hard_rules` reads, in its order.
HARD_COLUMNS = tuple(c for c, _, _, _ in _HARD_PLAN)
#: Per column: its role, its rule's number, its slot among the rules of its kind.
_COL_KIND, _COL_RULE, _COL_SLOT = (
    np.array([p[k] for p in _HARD_PLAN], np.int64) for k in (1, 2, 3)
)
#: The rule of each counter slot (the ``rise`` rules' memory columns) and of each ``below`` slot.
_RISE_RULE = np.array(_RISE, np.int64)
_BELOW_RULE = np.array(_BELOW, np.int64)
for _plan in (_COL_KIND, _COL_RULE, _COL_SLOT, _RISE_RULE, _BELOW_RULE):
    _plan.flags.writeable = False
#: The per-GPU memory :func:`hard_rules` keeps: the last reading's time and condition flags, and
#: per ``rise`` rule its counter and whether it was read (wide: one column per rule).
HARD_MEMORY = ("ts", "flags", "cnt", "cnt_ok")
N_RISE = len(_RISE)


def _hard_rules(gid: Any, t: Any, rows: Any, lost: Any, values: Any, valid: Any, col_kind: Any,
               col_rule: Any, col_slot: Any, rise_rule: Any, below_rule: Any, lost_bit: Any,
               level_bits: Any, mem_ts: Any, mem_flags: Any, mem_cnt: Any, mem_cnt_ok: Any,
               bits: Any) -> int:  # fmt: skip
    """The hard rules of readings ``i`` (arrival order; row ``rows[i]`` of the GPU table,
    ``lost[i]`` whether the GPU is LOST) of GPUs ``gid[i]`` at times ``t[i]``: writes
    ``bits[i]`` (zero-filled by the caller) and moves each GPU's memory on. ``values``/
    ``valid``: the columns of :data:`HARD_COLUMNS` (tuples, that order), each read as its
    ``col_kind`` says for rule ``col_rule`` (slot ``col_slot`` among its kind's rules: counters
    ``rise_rule``, pairs ``below_rule``); a counter or ``below`` value outside
    ``[0, VALUE_LIMIT)`` is counted (the return value) and taken as missing.

    A reading no later than its GPU's memory ``mem_ts[g]`` fires nothing and changes nothing.
    Otherwise a condition of ``level_bits`` fires when it is set and was not in the memory's
    flags (a GPU never seen has none): a level column non-zero, a ``below`` value under its
    maximum, ``lost_bit`` for a LOST reading, which has no values: it keeps the memory's other
    conditions and counters. A ``rise`` rule fires when the sum of its counters rises over the
    memory's (a counter that went down was reset: it fires when the new value is above zero)."""
    bad = 0
    n_rise = len(rise_rule)
    n_below = len(below_rule)
    cnt = np.zeros(n_rise, np.int64)
    cnt_ok = np.zeros(n_rise, np.bool_)
    low = np.zeros(n_below, np.int64)
    high = np.zeros(n_below, np.int64)
    low_ok = np.zeros(n_below, np.bool_)
    high_ok = np.zeros(n_below, np.bool_)
    for i in range(len(gid)):
        r = rows[i]
        cnt[:] = 0
        cnt_ok[:] = False
        for c in range(len(col_kind)):
            kind = col_kind[c]
            if kind == _LEVEL_COL:
                continue
            v, ok, b = _read(values[c][r], valid[c][r])
            bad += b
            k = col_slot[c]
            if kind == _COUNTER_COL:
                cnt[k] += v
                cnt_ok[k] = cnt_ok[k] or ok
            elif kind == _VALUE_COL:
                low[k], low_ok[k] = v, ok
            else:
                high[k], high_ok[k] = v, ok
        g = gid[i]
        now = t[i]
        if now <= mem_ts[g]:
            continue
        before = mem_flags[g]
        if lost[i]:
            flags = lost_bit | (before & ~lost_bit)
        else:
            flags = 0
            for c in range(len(col_kind)):
                if col_kind[c] == _LEVEL_COL and valid[c][r] and values[c][r] != 0:
                    flags |= 1 << col_rule[c]
            for k in range(n_below):
                if low_ok[k] and high_ok[k] and low[k] < high[k]:
                    flags |= 1 << below_rule[k]
        fired = flags & ~before & level_bits
        if not lost[i]:
            for k in range(n_rise):
                if cnt_ok[k] and mem_cnt_ok[g, k] != 0 and _rises(cnt[k], mem_cnt[g, k]):
                    fired |= 1 << rise_rule[k]
                mem_cnt[g, k], mem_cnt_ok[g, k] = cnt[k], cnt_ok[k]
        mem_flags[g] = flags
        mem_ts[g] = now
        bits[i] = fired
    return bad


def _rises(new: Any, old: Any) -> Any:
    """A counter rose (after a reset, to above zero)."""
    return (new - old if new >= old else new) > 0


# -- the entry points: arguments checked and made the one type the loops are compiled for -------


def counter_deltas(gid: np.ndarray, t: np.ndarray, lost: np.ndarray, rows: np.ndarray,
                   counters: Sequence[np.ndarray], counters_ok: Sequence[np.ndarray],
                   mem_ts: np.ndarray, mem_x: np.ndarray, mem_ok: np.ndarray) -> tuple[np.ndarray, int]:  # fmt: skip
    """:func:`_counter_deltas` over readings ``gid``/``t``/``lost``/``rows``; returns the deltas
    (one row per reading, :data:`DELTAS`) and how many counter values were out of range."""
    m = len(gid)
    n_gpus = len(mem_ts)
    _inside(gid, n_gpus, "gid")
    _inside(rows, _rows_of(counters, counters_ok), "rows")
    if mem_x.shape != (n_gpus, len(MEMORY)) or mem_ok.shape != mem_x.shape:
        raise ValueError("counter memory of the wrong shape")
    out = np.zeros((m, len(DELTAS)), np.int64)
    bad = _kernel("_counter_deltas")(_ints(gid, m), _ints(t, m), _flags(lost, m), _ints(rows, m),
                          _columns(counters, COUNTER_FIELDS), _valids(counters_ok, COUNTER_FIELDS),
                          mem_ts, mem_x, mem_ok, out)  # fmt: skip
    return out, int(bad)


def accumulate(sel: np.ndarray, slot: np.ndarray, rows: np.ndarray, lost: np.ndarray,
               values: Sequence[np.ndarray], valid: Sequence[np.ndarray], sm_active: np.ndarray,
               sm_active_ok: np.ndarray, deltas: np.ndarray, ints: np.ndarray,
               sums: np.ndarray) -> None:  # fmt: skip
    """:func:`_accumulate`: readings ``sel`` (numbers into ``rows``/``lost``/``deltas``) into
    slots ``slot`` of one window's ``ints``/``sums``."""
    k = len(sel)
    _inside(sel, len(rows), "sel")
    _inside(slot, len(ints), "slot")
    _inside(rows, min(_rows_of(values, valid), len(sm_active), len(sm_active_ok)), "rows")
    if len(lost) != len(rows) or deltas.shape != (len(rows), len(DELTAS)):
        raise ValueError("per-reading arrays of different lengths")
    if ints.shape[1:] != (len(COUNTS) + len(DELTAS),) or sums.shape != (len(ints), len(SUMS)):
        raise ValueError("accumulators of the wrong shape")
    _kernel("_accumulate")(_ints(sel, k), _ints(slot, k), _ints(rows, len(rows)), _flags(lost, len(lost)),
                _columns(values, _INT_COLUMNS), _valids(valid, _INT_COLUMNS),
                _input(sm_active, np.float64), _flags(sm_active_ok, len(sm_active)),
                _input(deltas, np.int64), ints, sums)  # fmt: skip


def hard_rules(gid: np.ndarray, t: np.ndarray, rows: np.ndarray, lost: np.ndarray,
               values: Sequence[np.ndarray], valid: Sequence[np.ndarray],
               memory: Sequence[np.ndarray]) -> tuple[np.ndarray, int]:  # fmt: skip
    """:func:`_hard_rules`; ``memory``: the per-GPU arrays of :data:`HARD_MEMORY` (int64; ``cnt``
    and ``cnt_ok`` with :data:`N_RISE` columns). Returns the rule bits of each reading and how
    many counter values were out of range."""
    m = len(gid)
    mem_ts, flags, cnt, cnt_ok = memory
    n_gpus = len(mem_ts)
    if any(len(a) != n_gpus or a.dtype != np.int64 for a in memory) or any(
        a.shape != (n_gpus, N_RISE) for a in (cnt, cnt_ok)
    ):
        raise ValueError("hard-rule memory of the wrong shape")
    _inside(gid, n_gpus, "gid")
    _inside(rows, _rows_of(values, valid), "rows")
    bits = np.zeros(m, np.int64)
    bad = _kernel("_hard_rules")(_ints(gid, m), _ints(t, m), _ints(rows, m), _flags(lost, m),
                      _columns(values, HARD_COLUMNS), _valids(valid, HARD_COLUMNS), _COL_KIND,
                      _COL_RULE, _COL_SLOT, _RISE_RULE, _BELOW_RULE, LOST_BIT, LEVEL_BITS,
                      mem_ts, flags, cnt, cnt_ok, bits)  # fmt: skip
    return bits, int(bad)


_INT_COLUMNS = tuple(c for c in COLUMNS if c != "sm_active_pct")


def _inside(index: np.ndarray, n: int, what: str) -> None:
    """Every index in ``[0, n)``: the loops do not check (a bug upstream must not write
    outside an array)."""
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= n):
        raise ValueError(f"{what} outside [0, {n})")


def _rows_of(values: Sequence[np.ndarray], valid: Sequence[np.ndarray]) -> int:
    return min(len(a) for a in (*values, *valid))


def _ints(a: np.ndarray, n: int) -> np.ndarray:
    return _input(a, np.int64, n)


def _flags(a: np.ndarray, n: int) -> np.ndarray:
    return _input(a, np.bool_, n)


def _columns(values: Sequence[np.ndarray], names: Sequence[str]) -> tuple[np.ndarray, ...]:
    if len(values) != len(names):
        raise ValueError(f"{len(names)} columns expected")
    return tuple(_input(v, np.int64) for v in values)


def _valids(valid: Sequence[np.ndarray], names: Sequence[str]) -> tuple[np.ndarray, ...]:
    if len(valid) != len(names):
        raise ValueError(f"{len(names)} valid flags expected")
    return tuple(_input(v, np.bool_) for v in valid)


def _input(a: np.ndarray, dtype: Any, n: int | None = None) -> np.ndarray:
    """What a loop only reads: contiguous, of ``dtype``, and read-only (a view when it is
    not), so that every caller's arrays are of the one type the loop was compiled for (numba
    compiles a read-only array apart)."""
    out = np.ascontiguousarray(a, dtype)
    if n is not None and len(out) != n:
        raise ValueError("per-reading arrays of different lengths")
    if out.flags.writeable:
        out = out.view()
        out.flags.writeable = False
    return out


#: The compiled loops, by the name of their Python function (made by :func:`_compile`).
_KERNELS: dict[str, Any] = {}
_COMPILING = threading.Lock()
_warm = False


def _kernel(name: str) -> Any:
    kernel = _KERNELS.get(name)
    if kernel is None:
        _compile()
        kernel = _KERNELS[name]
    return kernel


def _compile() -> None:
    """Compile the loops (or load them from numba's cache). numba is imported here, not with
    this module: a process that never aggregates (stage 3's, the CLI's) does not load it
    (about 64 MiB and 0.3 s; the compiled loops another 50 MiB)."""
    with _COMPILING:
        if _KERNELS:
            return
        from numba import njit

        here = globals()
        for helper in ("_read", "_rises"):  # called from the loops: compiled into them
            if not hasattr(here[helper], "py_func"):
                here[helper] = njit(inline="always")(here[helper])
        for name in ("_counter_deltas", "_accumulate", "_hard_rules"):
            _KERNELS[name] = njit(cache=True, nogil=True)(here[name])


def warm() -> None:
    """Compile the loops (or load them from numba's cache) now, once per process, so that the
    first batch does not wait for it (seconds without a cache, about 0.2 s with one)."""
    global _warm
    if _warm:
        return
    one = np.zeros(1, np.int64)
    ints = [one] * len(_INT_COLUMNS)
    ok = [np.ones(1, np.bool_)] * len(_INT_COLUMNS)
    lost = np.zeros(1, np.bool_)
    deltas, _ = counter_deltas(one, one, lost, one, [one] * len(COUNTER_FIELDS),
                               [ok[0]] * len(COUNTER_FIELDS), np.full(1, -1, np.int64),
                               np.zeros((1, len(MEMORY)), np.int64),
                               np.zeros((1, len(MEMORY)), np.bool_))  # fmt: skip
    accumulate(one, one, one, lost, ints, ok, np.zeros(1), ok[0], deltas,
               np.zeros((1, len(COUNTS) + len(DELTAS)), np.int64), np.zeros((1, len(SUMS))))  # fmt: skip
    hard_rules(one, one, one, lost, [one] * len(HARD_COLUMNS), [ok[0]] * len(HARD_COLUMNS),
               [np.full(1, -1, np.int64), np.zeros(1, np.int64),
                np.zeros((1, N_RISE), np.int64), np.zeros((1, N_RISE), np.int64)])  # fmt: skip
    _warm = True
