"""Hard rules on arrival: a HARD_ERROR finding from the sample that shows the fault.

The window-based hard rules (:mod:`~peerwatch.streams.core.hard_rules`) wait for a window to
close (30 s and the lateness). :class:`HardWatch` looks at every GPU reading as its batch comes
in, with the same columns the :class:`~peerwatch.streams.core.windows.WindowAggregator` gets
(:data:`~peerwatch.streams.core.windows.SAMPLE_SPEC`), and keeps per GPU the last counters and
condition flags. A finding leaves at the sample that shows a *new* condition:

- a hard XID (``detector.hard_xids``) carried by the sample;
- a rise of the uncorrectable volatile ECC counter or of the NVLink error counters (replay +
  recovery + CRC) over the GPU's previous reading (a counter rise needs that baseline; a
  counter that went down was reset, and the new value is the rise, as in the windows);
- remap pending, remap failed, PCIe link width below its maximum, GPU LOST: the condition set
  where the previous reading had it unset, or already set at the GPU's first reading (a fault
  present when the agent starts fires too).

Idle GPUs (no owner) are watched the same way; their findings carry the node's pseudo job
``idle:<node>``. A rule that fired on a GPU does not fire again on it within
``clear_after_windows`` windows (as the window rules), so a storm is one finding.

Readings whose time does not move their GPU's clock forward (a late or repeated sample) never
change the memory and fire no counter or condition rule; an XID they carry still fires. Sample
times outside ``[0, 2**53)`` are skipped and counted, counter values outside that range are
missing (counted in ``bad_values``). State is one row per GPU seen; :meth:`HardWatch.prune`
forgets GPUs silent for longer than a horizon.

The finding: ``window_start_ms`` is the start of the window holding the sample (so the policy's
drain episode and id are those of the window rule that fires later on the same fault),
``window_end_ms`` that window's end, ``detected_ms`` the sample's own time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from peerwatch.schemas.columns import Table
from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.gpu_rows import GpuKeys, GrowingRows
from peerwatch.streams.core.hard_rules import HARD_RULES, hard_cause
from peerwatch.streams.core.loops import HARD_COLUMNS, HARD_MEMORY, N_RISE, hard_rules, warm
from peerwatch.streams.core.model import HARD_ERROR, IDLE_JOB_PREFIX, stable_id
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.core.windows import SAMPLE_SPEC, VALUE_LIMIT

#: The rules with per-GPU memory, in bit order (XIDs are kept apart, by code).
RULES = tuple(rule.name for rule in HARD_RULES)
_LOST = SAMPLE_SPEC.children[0][1].columns[2].symbols.index("LOST")  # type: ignore[union-attr]
_FAR_PAST = -(1 << 62)


class HardWatch:
    """Hard rules on arrival for the nodes of one samples partition (offline: all nodes).

    ``name_of`` turns the string codes of the columns (node names, UUIDs) into strings: the
    aggregator's :meth:`~peerwatch.streams.core.windows.WindowAggregator.name` for tables it
    decoded. ``allocations`` is read only (the owner of the GPU at the sample's time).
    """

    def __init__(
        self,
        allocations: AllocationTable,
        name_of: Callable[[int], str],
        settings: DetectorSettings | None = None,
    ) -> None:
        warm()
        self.allocations = allocations
        self.name_of = name_of
        self.settings = settings = settings or DetectorSettings()
        self.window_ms = settings.window_ms
        self.memory_ms = settings.clear_after_windows * settings.window_ms
        self._row_of = GpuKeys()
        fill = {"key": 0, "ts": -1, "flags": 0}
        fill.update({f"fired_{r}": _FAR_PAST for r in RULES})
        counters = np.zeros(N_RISE, np.int64)  # cnt, cnt_ok: per rise rule
        self._gpu = GrowingRows(fill, wide={"cnt": counters, "cnt_ok": counters})
        self._xid_fired: dict[tuple[int, int], int] = {}  # (row, xid) -> ms it last fired
        self.readings = 0
        self.invalid_samples = 0
        self.bad_values = 0
        self.findings = 0

    # -- per-GPU rows ---------------------------------------------------------------------------
    def _rows(self, node: np.ndarray, index: np.ndarray) -> np.ndarray:
        return self._row_of.lookup(node, index, self._new_rows)

    def _new_rows(self, new_keys: np.ndarray) -> np.ndarray:
        first = self._gpu.add(len(new_keys))
        rows = np.arange(first, first + len(new_keys))
        self._gpu.arrays["key"][rows] = new_keys
        return rows

    def prune(self, before_ms: int) -> int:
        """Forget GPUs whose last reading is older than ``before_ms``; returns how many."""
        g = self._gpu.arrays
        live = np.flatnonzero(g["ts"][: self._gpu.size] >= before_ms)
        dropped = self._gpu.size - len(live)
        if not dropped:
            return 0
        remap = np.full(self._gpu.size, -1, np.int64)
        remap[live] = np.arange(len(live))
        self._gpu.keep(live)
        self._row_of.reset(self._gpu.arrays["key"][: len(live)])
        self._xid_fired = {
            (int(remap[r]), x): ms for (r, x), ms in self._xid_fired.items() if remap[r] >= 0
        }
        return dropped

    def __len__(self) -> int:
        return self._gpu.size

    # -- input ----------------------------------------------------------------------------------
    def add_columns(self, tables: Mapping[str, Table]) -> list[StragglerFinding]:
        """One batch of NodeGpuSample columns (in arrival order); returns the HARD_ERROR
        findings it shows, in sample order."""
        top, gpus, xids = tables[""], tables["gpus."], tables["xids."]
        node, ts = top.values["node"], top.values["ts_ms"]
        ok_sample = (ts >= 0) & (ts < VALUE_LIMIT)
        self.invalid_samples += int(top.n - ok_sample.sum())
        # (sample row, gpu index) -> rule bits and hard XIDs, for the findings
        hits: dict[tuple[int, int], list[Any]] = {}
        if gpus.n:
            assert gpus.parent is not None
            self._readings(gpus, node, ts, ok_sample, hits)
        if xids.n:
            self._xids(xids, gpus, ok_sample, hits)
        out = [self._finding(s, idx, hit, node, ts, gpus) for (s, idx), hit in sorted(hits.items())]
        found = [f for f in out if f is not None]
        self.findings += len(found)
        return found

    def _readings(self, gpus: Table, node: np.ndarray, ts: np.ndarray, ok_sample: np.ndarray,
                  hits: dict[tuple[int, int], list[Any]]) -> None:  # fmt: skip
        assert gpus.parent is not None
        ok = ok_sample[gpus.parent]
        # every reading valid (the usual batch): the columns themselves, not copies of them
        whole = bool(ok.all())
        rows = np.arange(gpus.n) if whole else np.flatnonzero(ok)
        m = len(rows)
        if not m:
            return
        self.readings += m
        parent = gpus.parent if whole else gpus.parent[rows]
        index = (gpus.values["index"] if whole else gpus.values["index"][rows]).astype(
            np.int64, copy=False
        )
        state = gpus.values["state"] if whole else gpus.values["state"][rows]
        gid = self._rows(node[parent], index)
        g = self._gpu.arrays
        bits, bad = hard_rules(
            gid, ts[parent], rows, state == _LOST,
            [gpus.values[c] for c in HARD_COLUMNS], [_valid(gpus, c) for c in HARD_COLUMNS],
            [g[k] for k in HARD_MEMORY])  # fmt: skip
        self.bad_values += bad
        for r in np.flatnonzero(bits).tolist():  # arrival order
            s, idx = int(parent[r]), int(index[r])
            hit = hits.setdefault((s, idx), [0, [], int(gid[r]), int(rows[r])])
            hit[0] |= int(bits[r])

    def _xids(self, xids: Table, gpus: Table, ok_sample: np.ndarray,
              hits: dict[tuple[int, int], list[Any]]) -> None:  # fmt: skip
        assert xids.parent is not None
        hard = self.settings.hard_xids
        codes = xids.values["xid"]
        reading: dict[tuple[int, int], int] = {}  # (sample, GPU index) -> its reading (UUID)
        if gpus.n:
            assert gpus.parent is not None
            carriers = np.flatnonzero(np.isin(gpus.parent, xids.parent))
            for r, s, i in zip(carriers.tolist(), gpus.parent[carriers].tolist(),
                               gpus.values["index"][carriers].tolist(), strict=True):  # fmt: skip
                reading.setdefault((int(s), int(i)), r)
        for i in np.flatnonzero(ok_sample[xids.parent]).tolist():
            code = int(codes[i])
            if code not in hard:
                continue
            s, idx = int(xids.parent[i]), int(xids.values["gpu_index"][i])
            hit = hits.setdefault((s, idx), [0, [], -1, reading.get((s, idx), -1)])
            if code not in hit[1]:
                hit[1].append(code)

    # -- output ---------------------------------------------------------------------------------
    def _finding(self, s: int, idx: int, hit: list[Any], node: np.ndarray, ts: np.ndarray,
                 gpus: Table) -> StragglerFinding | None:  # fmt: skip
        bits, codes, row, reading = hit
        t = int(ts[s])
        name = self.name_of(int(node[s]))
        if row < 0:  # an XID for a GPU without a reading in its sample
            row = int(self._rows(np.asarray([int(node[s])]), np.asarray([idx]))[0])
        g = self._gpu.arrays
        rules: list[str] = []
        for i, rule in enumerate(RULES):
            if bits & (1 << i):
                last = int(g[f"fired_{rule}"][row])
                g[f"fired_{rule}"][row] = t
                if t - last > self.memory_ms:
                    rules.append(rule)
        for code in sorted(codes):
            last = self._xid_fired.get((row, code), _FAR_PAST)
            self._xid_fired[(row, code)] = t
            if t - last > self.memory_ms:
                rules.append(f"xid_{code}")
        if not rules:
            return None
        rules.sort()
        job = self.allocations.owner(name, idx, t) or IDLE_JOB_PREFIX + name
        start = t - t % self.window_ms
        return {
            "finding_id": stable_id(
                job, name, idx, HARD_ERROR, "arrival", t, hex_chars=self.settings.id_hex_chars
            ),
            "job_id": job,
            "node": name,
            "gpu_index": idx,
            "gpu_uuid": self._uuid(gpus, reading),
            "status": HARD_ERROR,
            "window_start_ms": start,
            "window_end_ms": start + self.window_ms,
            "features": [],
            "hard_rules": rules,
            "windows_flagged": 1,
            "windows_considered": 1,
            "first_flagged_ms": start,
            "peer_group_size": 1,
            "reason": f"hard on arrival: {', '.join(rules)}",
            "cause": hard_cause(rules),
            "detected_ms": t,
            "port": None,
            "switch": None,
        }

    def _uuid(self, table: Table, reading: int) -> str | None:
        if reading < 0:
            return None
        valid = table.valid.get("uuid")
        if valid is not None and not valid[reading]:
            return None
        code = int(table.values["uuid"][reading])
        return self.name_of(code) if code >= 0 else None

    def counters(self) -> dict[str, int]:
        """Readings looked at, invalid samples and bad counter values skipped, findings."""
        return {
            "hard_readings": self.readings,
            "hard_invalid_samples": self.invalid_samples,
            "hard_bad_values": self.bad_values,
            "hard_findings": self.findings,
        }


def _valid(table: Table, name: str) -> np.ndarray:
    """A column's valid flags (all valid where it has none)."""
    valid = table.valid.get(name)
    return np.ones(table.n, np.bool_) if valid is None else valid
