"""The straggler detector: one job, one window, all its GPUs compared with their peers.

A pure function of records: ``detect_job_window(job, windows, state, settings)`` takes the
job's GpuWindow dicts for one window and the job's :class:`JobDetectorState` (updated in place),
and returns the windows annotated (``score``, ``gated``) plus StragglerFinding dicts. No I/O,
no clock: time comes from ``window_start_ms``. The live stream, replay and the evaluation
harness all call this function. The algorithm is DETECTION.md's, step by step:

1. gate the window (warm-up after start/requeue, < 90% of GPUs reported, median sm < 0.2);
   hard rules fire on every window, gated or not, at any group size;
2. split the reporting GPUs into peer groups by role; n >= min_peers uses robust z per feature,
   smaller groups compare each GPU's clk with its own rolling median of recent clean windows;
3. candidate = slow-direction |z| >= z_threshold AND a material effect (own baseline: the clk
   effect alone, as there is no spread to compare with);
4. more than job_wide_frac of a group being candidates -> one JOB_WIDE finding, no GPU blamed
   (jobs of fewer than job_wide_report_min_gpus GPUs abstain without a finding);
5. persistence (k of n, or CUSUM) -> SUSPECT on the first candidate window, CONFIRMED on the
   transition (re-emitted every ``confirmed_heartbeat_windows``), CLEARED after
   ``clear_after_windows`` clean windows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, islice
from operator import eq, lt
from typing import Any, Literal, cast, overload

import numpy as np

from peerwatch.schemas.records import FindingCause, FindingStatus, GpuWindow, StragglerFinding
from peerwatch.streams.core.causes import UNKNOWN, majority_cause, straggler_cause
from peerwatch.streams.core.detector_state import GpuDetectorState, JobDetectorState
from peerwatch.streams.core.findings import job_wide_finding, make_finding, straggler_reason
from peerwatch.streams.core.hard_rules import RecordedXid, hard_rules, recorded_xids
from peerwatch.streams.core.model import (
    CLEARED,
    CONFIRMED,
    HARD_ERROR,
    SUSPECT,
    InvalidRecordError,
    JobContext,
    field_rows,
    gpu_key,
    is_idle_job,
    require,
)
from peerwatch.streams.core.peers import GpuVerdict, PeerComparison, baseline_verdict
from peerwatch.streams.core.robust import array_median, median
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.core.window_columns import FLOAT_FIELDS, WindowColumns, of_windows

DEFAULT_SETTINGS = DetectorSettings()

GATE_WARMUP = "warmup"
GATE_INCOMPLETE = "incomplete"
GATE_LOW_ACTIVITY = "low_activity"
GATE_NO_DATA = "no_data"
GATE_JOB_WIDE = "job_wide"
GATE_NO_BASELINE = "no_baseline"
GATE_IDLE = "idle"
_IDLE_RULE_PREFIXES = ("xid_", "ecc_uncorrected", "nvlink_errors")
GATE_ENDING = "ending"
GATE_PHASE_CHANGE = "phase_change"
#: History codes of a GPU's evaluated windows (GpuDetectorState.history).
_CLEAN, _CONFIRMING, _FLAGGED = 0, 1, 2

_JobWideGroup = tuple[str, Sequence[GpuWindow], list[GpuVerdict]]
#: What :func:`detect_job_window` returns as scored windows: copies of the dicts with their
#: ``score`` and ``gated``, the dicts themselves so scored, nothing, or each window's values
#: beside the untouched windows (:class:`ScoredValues`: a publisher that encodes the windows
#: from their columns never makes a dict of them).
ScoredWindows = Literal["copies", "in_place", "none", "values"]
#: The fields every GpuWindow given to the detector must hold.
_KEY_FIELDS = ("job_id", "node", "gpu_index", "window_start_ms", "window_end_ms")
#: What the detector reads of every window first: the key fields, then whether it reports
#: (a GPU not lost, with readings).
_READ = (*_KEY_FIELDS, "lost", "samples")


@dataclass
class ScoredValues:
    """The scored windows as values: ``windows`` (the detector's input, untouched, in GPU
    order) and each one's ``score`` and ``gated``, in the same order."""

    windows: Sequence[GpuWindow]
    scores: list[float | None]
    gates: list[str | None]

    def in_place(self) -> list[GpuWindow]:
        """The windows with their ``score`` and ``gated`` set in them (for a caller that owns
        the dicts and publishes them as dicts)."""
        out = list(self.windows)
        for w, score, gated in zip(out, self.scores, self.gates, strict=True):
            w["score"] = score
            w["gated"] = gated
        return out


@dataclass
class DetectionResult:
    """What one call produced.

    ``windows``: the input GpuWindow dicts (copies, unless asked otherwise) with ``score`` and
    ``gated`` set, sorted by (node, gpu_index). ``findings``: StragglerFinding dicts in a deterministic order.
    ``gated``: the job-level gate of this window or None. ``recorded_xids``: every XID seen
    (category hard/app/other), for counting. ``skipped``: set (e.g. ``"already_processed"``)
    when the window was not processed at all; then ``windows`` and ``findings`` are empty.
    """

    windows: list[GpuWindow] = field(default_factory=list)
    findings: list[StragglerFinding] = field(default_factory=list)
    gated: str | None = None
    job_wide: bool = False
    #: the job's median SM activity and step time (ms) over its reporting GPUs (None: none has
    #: it): what the network comparison's gate reads (:mod:`~peerwatch.streams.core.network_gate`)
    job_sm: float | None = None
    job_step_ms: float | None = None
    recorded_xids: list[RecordedXid] = field(default_factory=list)
    skipped: str | None = None
    #: with ``scored_windows="values"``: the windows and their scores (``windows`` stays empty)
    scored: ScoredValues | None = None


def detect_job_window(
    job: JobContext,
    windows: Sequence[GpuWindow],
    state: JobDetectorState,
    settings: DetectorSettings = DEFAULT_SETTINGS,
    scored_windows: ScoredWindows = "copies",
    columns: WindowColumns | None = None,
) -> DetectionResult:
    """Run the detector on one window of one job; ``state`` is updated in place.

    ``windows``: the job's GpuWindow dicts for one window (any order; at most one per GPU).
    ``scored_windows``: ``"copies"`` (result.windows are copies), ``"in_place"`` (the input
    dicts themselves get ``score`` and ``gated``: a caller that owns them saves a copy of each),
    ``"none"`` (``result.windows`` stays empty: nothing to publish) or ``"values"``
    (``result.scored``: the windows untouched and their values). Findings and state are
    the same either way. ``columns``: what the detector reads of every window, made by the
    window aggregator with the windows (:mod:`~peerwatch.streams.core.window_columns`); the
    caller vouches that ``windows`` are then valid (one job and start, sorted by GPU, each
    once), as the aggregator makes them. Without it, the windows are checked and read.
    Windows must arrive in increasing ``window_start_ms``; an older or repeated window is
    skipped (``result.skipped``), so redelivery after a restart emits nothing twice.
    Raises InvalidRecordError when a window lacks a key field, belongs to another job, mixes
    window starts or repeats a GPU.
    """
    if state.job_id != job.job_id:
        raise InvalidRecordError(f"state of job {state.job_id!r} given for job {job.job_id!r}")
    if not windows:
        return DetectionResult(skipped="empty")
    ordered: Sequence[GpuWindow]
    if columns is None:
        ordered, keys, rows = _validated(job, windows)
        columns = of_windows(ordered, keys, [r[5] for r in rows], [r[6] for r in rows])
    else:
        ordered, keys = windows, columns.keys
    start_ms = int(ordered[0]["window_start_ms"])
    end_ms = int(ordered[0]["window_end_ms"])
    if state.last_window_start_ms is not None and start_ms <= state.last_window_start_ms:
        return DetectionResult(skipped="already_processed")

    _follow_requeue(job, state)
    state.windows_seen += 1
    state.last_window_start_ms = start_ms
    state.max_gpus_seen = max(state.max_gpus_seen, len(ordered))

    result = DetectionResult()
    # whether each window holds readings of a GPU that is not lost
    reports: list[bool] = columns.reports.tolist()
    groups = _groups(job, keys, np.flatnonzero(columns.reports).tolist())
    group_size: dict[str, int] | None = None  # made when a hard rule may fire (rare)
    gpus = state.gpus
    states: list[GpuDetectorState] = []  # each window's GPU's, in the windows' order
    for key in keys:
        gpu_state = gpus.get(key) or state.gpu(key)
        gpu_state.last_seen_ms = start_ms
        states.append(gpu_state)
    for i in np.flatnonzero(columns.fires).tolist():  # a hard rule may fire, or an XID came
        key, window = keys[i], ordered[i]
        gpu_state = gpus[key]
        if window.get("xids"):
            result.recorded_xids.extend(recorded_xids(window, settings))
        if group_size is None:
            group_size = {keys[p]: len(g) for g in groups.values() for p in g}
        finding = _hard_finding(job, window, gpu_state, group_size.get(key, 0), settings)
        if finding is not None:
            result.findings.append(finding)

    gate = _gate(job, ordered, columns, groups, state, settings)
    result.gated = gate
    result.job_sm, result.job_step_ms = (_finite_median(columns, n) for n in ("sm_frac", "step_ms"))
    scores: dict[str, float | None] = {}
    gpu_gate: dict[str, str] = {}
    if gate is None:
        job_wide_groups = _evaluate(
            job, keys, states, ordered, columns, groups, state, settings, result, scores, gpu_gate
        )
        result.findings.extend(_job_wide(job, start_ms, end_ms, job_wide_groups, state, settings))
        result.job_wide = bool(job_wide_groups)

    if scored_windows == "none":
        return result
    score_of = [scores.get(key) if gate is None else None for key in keys]
    gate_of = [gate or gpu_gate.get(key) or (None if reporting else GATE_NO_DATA)
               for key, reporting in zip(keys, reports, strict=True)]  # fmt: skip
    if scored_windows == "values":
        result.scored = ScoredValues(ordered, score_of, gate_of)
        return result
    copies = scored_windows != "in_place"
    for window, score, gated in zip(ordered, score_of, gate_of, strict=True):
        out = window.copy() if copies else window
        out["score"] = score
        out["gated"] = gated
        result.windows.append(out)
    return result


def _evaluate(
    job: JobContext,
    keys: list[str],
    states: list[GpuDetectorState],
    ordered: Sequence[GpuWindow],
    columns: WindowColumns,
    groups: dict[str, list[int]],
    state: JobDetectorState,
    settings: DetectorSettings,
    result: DetectionResult,
    scores: dict[str, float | None],
    gpu_gate: dict[str, str],
) -> list[_JobWideGroup]:
    """Per-GPU verdicts of an ungated window, group by group; returns the job-wide groups.

    Fills ``scores`` and ``gpu_gate`` and appends straggler findings to ``result``. A peer
    group is compared at once (:class:`PeerComparison`); a GPU's whole verdict is built only
    when it is a candidate or inside an episode: for the others the persistence memory just
    moves on (:func:`_remember_each`), which is all :func:`_advance` would do with a clean
    window. ``states``: the GPU state of each of ``keys``.
    """
    job_wide_groups: list[_JobWideGroup] = []
    for role in sorted(groups):
        positions = groups[role]
        member_keys = [keys[p] for p in positions]
        group = _Take(ordered, positions)  # a window's dict is read only where needed
        cmp = None
        if len(group) >= settings.min_peers:
            rows = np.array(positions, np.int64)
            floats = {f: columns.column(f).take(rows) for f in FLOAT_FIELDS}
            cmp = PeerComparison(group, settings, floats)
        if cmp is not None:
            flagged = cmp.flagged.tolist()
            evaluated = cmp.evaluated.tolist()
            baseline: list[GpuVerdict] = []
        else:
            baseline = [
                baseline_verdict(group[i], state.gpu(k), settings)
                for i, k in enumerate(member_keys)
            ]
            flagged = [bool(v.flags) for v in baseline]
            evaluated = [v.evaluated for v in baseline]
        n_candidates = sum(flagged)
        if (
            n_candidates > settings.job_wide_frac * len(group)
            and n_candidates >= settings.job_wide_min_gpus
        ):
            whole = (
                [cmp.verdict(i, k) for i, k in enumerate(member_keys)]
                if cmp is not None
                else baseline
            )
            job_wide_groups.append((role, group, whole))
            for v in whole:
                gpu_gate[v.key] = GATE_JOB_WIDE
                scores[v.key] = v.score
            continue
        per_node = Counter(group[i]["node"] for i in compress(range(len(group)), flagged))
        node_wide = {n for n, count in per_node.items() if count >= settings.node_wide_min_gpus}
        if cmp is not None:
            scores.update(zip(member_keys, cmp.score, strict=True))
        # clean GPUs outside an episode: their memory moves on (each GPU's own state, so apart
        # from the others' verdicts, which touch only theirs)
        clean: list[GpuDetectorState] = []
        clean_z: list[float | None] = []
        for i, key in enumerate(member_keys):
            gpu_state = states[positions[i]]
            if cmp is not None:
                if not evaluated[i]:
                    gpu_gate[key] = GATE_NO_DATA
                    continue
                if not flagged[i] and gpu_state.status is None:
                    clean.append(gpu_state)
                    clean_z.append(cmp.confirm_score[i])
                    continue
                verdict = cmp.verdict(i, key)
            else:
                verdict = baseline[i]
                scores[key] = verdict.score
                _learn_baseline(gpu_state, group[i], verdict, settings)
                if not verdict.evaluated:
                    gpu_gate[key] = GATE_NO_BASELINE
                    continue
            window = group[i]
            fast = window["node"] not in node_wide
            result.findings.extend(
                _advance(job, window, verdict, gpu_state, len(group), settings, fast)
            )
        _remember_each(clean, _CLEAN, clean_z, settings)
    return job_wide_groups


class _Take(Sequence[GpuWindow]):
    """The windows at ``positions`` of ``windows``, each read when asked for (the windows of
    an aggregator's batch are made into dicts on first access)."""

    def __init__(self, windows: Sequence[GpuWindow], positions: list[int]) -> None:
        self.windows, self.positions = windows, positions

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, i: int) -> GpuWindow: ...

    @overload
    def __getitem__(self, i: slice) -> list[GpuWindow]: ...

    def __getitem__(self, i: int | slice) -> GpuWindow | list[GpuWindow]:
        if isinstance(i, slice):
            return [self.windows[p] for p in self.positions[i]]
        return self.windows[self.positions[i]]


def _validated(
    job: JobContext, windows: Sequence[GpuWindow]
) -> tuple[list[GpuWindow], list[str], list[tuple[Any, ...]]]:
    """``windows`` sorted by (node, GPU index), their GPU keys and the values of their
    :data:`_READ` fields. Raises InvalidRecordError for the first fault found (see
    :func:`detect_job_window`)."""
    job_id = job.job_id
    rows = field_rows(windows, *_READ)
    first_start = rows[0][3]
    idents: list[tuple[str, int]] = []
    for w, (wjob, node, index, start, end, _, _) in zip(windows, rows, strict=True):
        if (
            node is None
            or index is None
            or first_start is None
            or start != first_start
            or wjob != job_id
            or end is None
        ):
            _refuse(job, w, first_start)
        try:
            idents.append((node if type(node) is str else str(node),
                           index if type(index) is int else int(index)))  # fmt: skip
        except (TypeError, ValueError) as exc:
            raise InvalidRecordError(f"job {job_id!r}: bad gpu_index {index!r}") from exc
    if all(map(lt, idents, islice(idents, 1, None))):  # the usual case: in order, each once
        return list(windows), [gpu_key(r[1], r[2]) for r in rows], rows
    in_order = sorted(idents)
    if any(map(eq, in_order, islice(in_order, 1, None))):  # a GPU twice: name the first one
        seen: set[tuple[str, int]] = set()
        for ident in idents:
            if ident in seen:
                raise InvalidRecordError(f"job {job_id!r}: GPU {ident} twice in one window")
            seen.add(ident)
    order = sorted(range(len(idents)), key=idents.__getitem__)
    rows = [rows[i] for i in order]
    return [windows[i] for i in order], [gpu_key(r[1], r[2]) for r in rows], rows


def _refuse(job: JobContext, w: GpuWindow, first_start: object) -> None:
    """Raise InvalidRecordError for what is wrong with ``w``: a key field missing, another job,
    another window start (checked in that order)."""
    require(w, *_KEY_FIELDS, what="GpuWindow")
    if w["job_id"] != job.job_id:
        raise InvalidRecordError(f"GpuWindow of job {w['job_id']!r} in job {job.job_id!r}")
    if w["window_start_ms"] != first_start:
        raise InvalidRecordError(f"job {job.job_id!r}: windows of different starts mixed")
    raise AssertionError("_refuse called for a valid window")


def _follow_requeue(job: JobContext, state: JobDetectorState) -> None:
    """A newer start/requeue than the state knows: forget persistence and baselines."""
    anchor = job.anchor_ms
    if anchor is None or (state.anchor_ms is not None and anchor <= state.anchor_ms):
        return
    if state.anchor_ms is not None:
        state.windows_seen = 0
        state.job_wide_start_ms = None
        state.job_wide_clean = 0
        for gpu_state in state.gpus.values():
            gpu_state.reset_episode()
            gpu_state.baseline_clk = []
    state.anchor_ms = anchor


def _groups(job: JobContext, keys: list[str], reporting: list[int]) -> dict[str, list[int]]:
    """The positions of the reporting windows per role (peers are compared within one role)."""
    if not job.roles:
        return {"": reporting} if reporting else {}
    groups: dict[str, list[int]] = {}
    roles = job.roles
    for p in reporting:
        groups.setdefault(roles.get(keys[p], ""), []).append(p)
    return groups


def _gate(
    job: JobContext,
    ordered: Sequence[GpuWindow],
    columns: WindowColumns,
    groups: dict[str, list[int]],
    state: JobDetectorState,
    settings: DetectorSettings,
) -> str | None:
    start_ms = int(ordered[0]["window_start_ms"])
    if is_idle_job(job.job_id):
        return GATE_IDLE  # unallocated GPUs: hard rules only, never peer verdicts
    window_end_ms = int(ordered[0]["window_end_ms"])
    if job.end_ms is not None and window_end_ms > job.end_ms - settings.ending_s * 1000:
        return GATE_ENDING  # the job's last moments: teardown, not a slow GPU
    anchor = job.anchor_ms
    if state.windows_seen <= settings.warmup_windows or (
        anchor is not None and start_ms < anchor + settings.warmup_windows * settings.window_ms
    ):
        return GATE_WARMUP
    reporting = np.array([p for g in groups.values() for p in g], np.int64)
    if not len(reporting):
        return GATE_NO_DATA
    expected = job.expected_gpus or state.max_gpus_seen
    if len(reporting) < settings.min_reported_frac * expected:
        return GATE_INCOMPLETE
    job_sm = _job_median(columns.column("sm_frac").take(reporting).present())
    job_thr = _job_median(columns.column("throttle_frac").take(reporting).present())
    # A job-wide phase change (checkpoint, eval, restart; a power cap or cooling event starting
    # or ending) inside or next to this window: a node whose clock is a second or two off
    # straddles it differently from its peers.
    changed = _moved(state.last_job_sm, job_sm, settings.phase_change_sm) or _moved(
        state.last_job_thr, job_thr, settings.phase_change_thr
    )
    if job_sm is not None:
        state.last_job_sm = job_sm
    if job_thr is not None:
        state.last_job_thr = job_thr
    if job_sm is not None and job_sm < settings.min_job_sm:
        return GATE_LOW_ACTIVITY
    return GATE_PHASE_CHANGE if changed else None


def _job_median(present: list[float]) -> float | None:
    """The job's median of one window field over the reporting GPUs that have it (None: none
    has it)."""
    return median(present) if present else None


def _finite_median(columns: WindowColumns, name: str) -> float | None:
    """The median of one field over the reporting GPUs' finite values (None: none)."""
    values = columns.column(name).values[columns.reports]
    values = values[np.isfinite(values)]
    return array_median(values) if len(values) else None


def _moved(before: float | None, now: float | None, limit: float) -> bool:
    return before is not None and now is not None and abs(now - before) >= limit


def _learn_baseline(
    gpu_state: GpuDetectorState,
    window: GpuWindow,
    verdict: GpuVerdict,
    settings: DetectorSettings,
) -> None:
    """Only clean, un-capped windows outside a fleet shift teach the baseline, so a lasting
    drop stays visible."""
    if window.get("fleet_clk_ratio") is not None:
        return
    clk = window.get("clk_ratio")
    cap = window.get("power_cap_frac")
    capped = cap is not None and float(cap) >= settings.baseline_power_cap_excuse
    if clk is None or verdict.flags or capped:
        return
    gpu_state.baseline_clk.append(float(clk))
    del gpu_state.baseline_clk[: -settings.baseline_windows]


def _advance(
    job: JobContext,
    window: GpuWindow,
    verdict: GpuVerdict,
    gpu_state: GpuDetectorState,
    group_n: int,
    settings: DetectorSettings,
    fast: bool = True,
) -> list[StragglerFinding]:
    """Persistence state machine of one GPU for one evaluated window; returns findings.

    ``fast``: the short SUSPECT rule (``suspect_flagged_s`` of confirming evidence) may apply;
    False when many GPUs of the node became candidates at once (then ``suspect_sm_s``)."""
    start_ms = int(window["window_start_ms"])
    confirming = bool(verdict.flags & set(settings.confirm_features))
    code = _CONFIRMING if confirming else _FLAGGED if verdict.flags else _CLEAN
    _remember(gpu_state, code, verdict.confirm_score, settings)
    recent = gpu_state.history[-settings.suspect_n :]
    statuses: list[FindingStatus] = []
    if verdict.flags:
        gpu_state.clean_streak = 0
        if gpu_state.status is None:
            if gpu_state.episode_start_ms is None:
                gpu_state.episode_start_ms = start_ms
            confirming_n = sum(1 for c in recent if c == _CONFIRMING)
            flagged_n = sum(1 for c in recent if c)
            if (
                not fast or confirming_n < settings.suspect_k
            ) and flagged_n < settings.suspect_sm_k:
                return []  # a candidate, not yet a suspect: one short window of sm proves little
            gpu_state.status = SUSPECT
            statuses.append(SUSPECT)
        if settings.persistence_mode == "k_of_n":
            confirmed_n = sum(
                1 for c in gpu_state.history[-settings.persist_n :] if c == _CONFIRMING
            )
            persistent = confirmed_n >= settings.persist_k
        else:
            persistent = gpu_state.cusum >= settings.cusum_h
        if gpu_state.status == SUSPECT and confirming and persistent:
            gpu_state.status = CONFIRMED
            gpu_state.since_emit = 0
            statuses.append(CONFIRMED)
        elif gpu_state.status == CONFIRMED:
            gpu_state.since_emit += 1
            heartbeat = settings.confirmed_heartbeat_windows
            if heartbeat and confirming and gpu_state.since_emit >= heartbeat:
                gpu_state.since_emit = 0
                statuses.append(CONFIRMED)
    elif gpu_state.status is not None:
        gpu_state.clean_streak += 1
        gpu_state.since_emit += 1
        if gpu_state.clean_streak >= settings.clear_after_windows:
            statuses.append(CLEARED)
    if verdict.flags and statuses:
        gpu_state.cause = _cause(window, verdict, settings)
    findings = [
        make_finding(
            job.job_id,
            status,
            window,
            verdict.evidence,
            [],
            gpu_state,
            group_n,
            straggler_reason(status, verdict, gpu_state),
            settings,
            cause=cast(FindingCause, gpu_state.cause or UNKNOWN),
        )
        for status in statuses
    ]
    if CLEARED in statuses:
        gpu_state.reset_episode()
    return findings


def _remember(
    gpu_state: GpuDetectorState,
    code: int,
    confirm_score: float | None,
    settings: DetectorSettings,
) -> None:
    """The memory of one evaluated window of one GPU (:func:`_remember_each`)."""
    _remember_each([gpu_state], code, [confirm_score], settings)


def _remember_each(
    gpu_states: list[GpuDetectorState],
    code: int,
    confirm_scores: list[float | None],
    settings: DetectorSettings,
) -> None:
    """The memory of one evaluated window with history code ``code`` for each GPU state and
    its confirming score: the code in its history, the CUSUM step, and the end of a lone
    candidate's episode once it aged out. Run for every clean GPU of every window (a peer
    group's at once): the settings are read once and the built-in ``min``/``max`` are written
    as comparisons, which give the same values."""
    keep, cap, k, suspect_n = (
        settings.history_n, settings.cusum_z_cap, settings.cusum_k, settings.suspect_n
    )  # fmt: skip
    for gpu_state, confirm_score in zip(gpu_states, confirm_scores, strict=True):
        history = gpu_state.history
        history.append(code)
        if len(history) > keep:
            del history[:-keep]
        # min(confirm_score, cap), or no step without a score
        step = 0.0 if confirm_score is None else cap if cap < confirm_score else confirm_score
        cusum = gpu_state.cusum + step - k
        gpu_state.cusum = cusum if cusum > 0.0 else 0.0  # max(0.0, cusum)
        if (
            gpu_state.episode_start_ms is not None
            and gpu_state.status is None
            and not any(history[-suspect_n:])
        ):
            gpu_state.episode_start_ms = None  # an earlier lone candidate window aged out


def _cause(window: GpuWindow, verdict: GpuVerdict, settings: DetectorSettings) -> FindingCause:
    """The named cause of a flagged GPU window (see :mod:`~peerwatch.streams.core.causes`)."""
    sm = next((ev for ev in verdict.evidence if ev["feature"] == "sm"), None)
    sm_low = sm is None or sm["value"] < sm["peer_median"]
    return straggler_cause(window, verdict.flags, settings, sm_low)


def _hard_finding(
    job: JobContext,
    window: GpuWindow,
    gpu_state: GpuDetectorState,
    group_n: int,
    settings: DetectorSettings,
) -> StragglerFinding | None:
    """HARD_ERROR when a rule fires that has not fired in the last clear_after_windows."""
    rules = hard_rules(window, settings)
    if is_idle_job(job.job_id):
        # On unallocated GPUs only new events count (XIDs, ECC and NVLink error increases).
        # Lasting conditions (lost, remap pending/failed, PCIe width) of idle GPUs are
        # reported on arrival, when they appear (streams/core/hard_watch.py); an idle window
        # holding one is no new evidence.
        rules = [r for r in rules if r.startswith(_IDLE_RULE_PREFIXES)]
    if not rules:
        return None
    start_ms = int(window["window_start_ms"])
    memory_ms = settings.clear_after_windows * settings.window_ms
    new = [
        r
        for r in rules
        if r not in gpu_state.hard_last_ms or start_ms - gpu_state.hard_last_ms[r] > memory_ms
    ]
    for rule in rules:
        gpu_state.hard_last_ms[rule] = start_ms
    if not new:
        return None
    finding = make_finding(
        job.job_id,
        HARD_ERROR,
        window,
        [],
        rules,
        None,
        group_n,
        f"hard: {', '.join(rules)}",
        settings,
    )
    finding["windows_flagged"] = finding["windows_considered"] = 1
    finding["first_flagged_ms"] = start_ms
    return finding


def _job_wide(
    job: JobContext,
    start_ms: int,
    end_ms: int,
    job_wide_groups: list[_JobWideGroup],
    state: JobDetectorState,
    settings: DetectorSettings,
) -> list[StragglerFinding]:
    """One JOB_WIDE finding when a job-wide episode starts; it ends after clean windows."""
    if not job_wide_groups:
        if state.job_wide_start_ms is not None:
            state.job_wide_clean += 1
            if state.job_wide_clean >= settings.clear_after_windows:
                state.job_wide_start_ms = None
                state.job_wide_clean = 0
        return []
    state.job_wide_clean = 0
    if state.job_wide_start_ms is not None:
        return []
    state.job_wide_start_ms = start_ms
    if state.max_gpus_seen < settings.job_wide_report_min_gpus:
        return []  # a small job's GPUs abstain (gated job_wide), with nothing to report
    role, group, verdicts = max(job_wide_groups, key=lambda g: len(g[1]))
    slow = [v for v in verdicts if v.flags]
    cause = majority_cause(
        _cause(w, v, settings) for w, v in zip(group, verdicts, strict=True) if v.flags
    )
    features = sorted({f for v in slow for f in v.flags})
    where = f" in role {role}" if role else ""
    reason = (
        f"job-wide: {len(slow)} of {len(group)} GPUs slow{where} ({', '.join(features)}); "
        "no GPU blamed"
    )
    return [
        job_wide_finding(
            job.job_id,
            start_ms,
            end_ms,
            len(group),
            len(slow),
            reason,
            settings.id_hex_chars,
            cause,
        )
    ]
