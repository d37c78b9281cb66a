"""Silent nodes: allocated GPUs whose node stopped sending samples (nobody monitors the monitor).

A pure, event-time watch. The driver tells it when each node last sent a sample
(:meth:`SilenceWatch.saw`) and, now and then, which nodes have GPUs allocated now (node -> (job
id, job start ms), :meth:`~peerwatch.streams.core.allocation.AllocationTable.open_nodes`) and
what time it is (:meth:`SilenceWatch.check`).

When to check is one rule for both runners, :class:`SilenceClock`: at every multiple of
``stream.silent_check_s`` of event time, once every source (samples partition; offline the one
aggregator) has a sample at or past it; "now" is that multiple, and a node's latest sample is
its latest *before* it (a watch made with ``held=True`` keeps later samples aside until the
check that may count them). So a worker that read some partitions further than others judges
at the same moments, on the same samples, as a replay of the same records. The one exception
is live only: when every partition of a worker has been quiet a while and its samples came in
real time, the wall clock moves "now" on (a fleet gone quiet is still seen; a replay has no
such moment).

A watched node is *silent* when it sent nothing for ``silent_after_ms``, counted from its last
sample, its job's start or the moment the watch began watching it, whichever is latest (so a
node that never reported since its job started is found, and a worker that just started does
not blame nodes it has not read yet). Nodes going silent together are one event: when one
node crosses the threshold, every watched node within ``group_ms`` of crossing it joins it.
An event becomes:

- one ``FLEET_WIDE`` finding (job id ``fleet``, no node) when it holds at least
  ``fleet_min_nodes`` nodes of more than one job (a rack, a switch, a partition);
- else, per job, one job-level ``SILENT`` finding (no node) for two or more of its nodes, and a
  node-level ``SILENT`` finding for a job's single silent node.

Every finding has cause ``NO_SAMPLES``. When all nodes of an event sent samples again (or left
their job), a ``CLEARED`` finding with the same job and node closes it. State: a few numbers
per watched node and one entry per open event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from peerwatch.schemas.records import FindingStatus, StragglerFinding
from peerwatch.streams.core.model import CLEARED, FLEET_WIDE, SILENT, stable_id
from peerwatch.streams.core.windows import VALUE_LIMIT

#: The job id of a FLEET_WIDE silence finding (it spans several jobs).
FLEET_JOB = "fleet"
_FAR_PAST = -(1 << 62)


def valid_times(ts_ms: np.ndarray) -> np.ndarray:
    """Which sample times are times at all (0..VALUE_LIMIT; the aggregator refuses the rest)."""
    ok: np.ndarray = (ts_ms >= 0) & (ts_ms < VALUE_LIMIT)
    return ok


def newest_valid_ms(ts_ms: np.ndarray) -> int | None:
    """The latest valid sample time of a batch (None: none is valid)."""
    ok = valid_times(ts_ms)
    return int(ts_ms[ok].max()) if ok.any() else None


@dataclass
class _Event:
    """One open silence: its finding's identity and the nodes still silent."""

    finding_id: str
    job_id: str
    node: str | None
    status: FindingStatus
    since_ms: int
    members: dict[str, int] = field(default_factory=dict)  # node -> silent since (ms)


class SilenceWatch:
    """See the module docstring. Times are int ms (UTC)."""

    def __init__(
        self,
        silent_after_ms: int = 30_000,
        group_ms: int = 10_000,
        fleet_min_nodes: int = 8,
        window_ms: int = 30_000,
        hex_chars: int = 32,
        held: bool = False,
    ) -> None:
        """``held``: keep samples at or past the latest check's time aside until a check at a
        later time (:class:`SilenceClock`'s rule); without it every sample counts at once."""
        if silent_after_ms <= 0 or not 0 <= group_ms < silent_after_ms or fleet_min_nodes < 2:
            raise ValueError("need silent_after_ms > group_ms >= 0 and fleet_min_nodes >= 2")
        self.silent_after_ms = silent_after_ms
        self.group_ms = group_ms
        self.fleet_min_nodes = fleet_min_nodes
        self.window_ms = window_ms
        self.hex_chars = hex_chars
        self._last_ms: dict[str, int] = {}
        #: latest times of column batches not yet noted in ``_last_ms``: per names table (by
        #: its id; the table itself held, so the id stays its own), one entry per code
        self._pending: dict[int, tuple[Sequence[str], np.ndarray]] = {}
        self.watched_since: dict[str, int] = {}
        self.silent: dict[str, str] = {}  # node -> finding id of its open event
        self.events: dict[str, _Event] = {}
        self.findings = 0
        self.held = held
        #: samples at or past this time are held (until the first check: every sample)
        self._horizon_ms = _FAR_PAST if held else None
        self._held: list[tuple[Sequence[str], np.ndarray, np.ndarray]] = []

    @property
    def last_ms(self) -> dict[str, int]:
        """Each node's latest sample time (ms) seen."""
        if self._pending:
            self._note_pending()
        return self._last_ms

    def saw(self, node: str, ts_ms: int) -> None:
        """A sample of ``node`` at ``ts_ms``."""
        self._saw_all(((node, ts_ms),))

    def _saw_all(self, samples: Iterable[tuple[str, int]]) -> None:
        """A sample of each ``(node, ts_ms)`` (one loop for thousands of nodes)."""
        last = self._last_ms
        for node, ts_ms in samples:
            if ts_ms > last.get(node, _FAR_PAST):
                last[node] = ts_ms

    def _note_pending(self) -> None:
        """The latest times of the column batches seen since the last call, noted by node name
        (one loop over the nodes that sent samples: once per check, not per batch)."""
        pending, self._pending = self._pending, {}
        for names, latest in pending.values():
            codes = np.flatnonzero(latest > _FAR_PAST)
            self._saw_all(zip(map(names.__getitem__, codes.tolist()), latest[codes].tolist(),
                              strict=True))  # fmt: skip

    def saw_columns(
        self, node_codes: np.ndarray, ts_ms: np.ndarray, names: Sequence[str]
    ) -> tuple[int, int] | None:
        """The samples of a column batch: their nodes (codes into ``names``) and times. A time
        outside 0..VALUE_LIMIT is no sample (the aggregator refuses it too). Returns the lowest
        and the highest of the nodes' latest times, None when no time is valid."""
        ok = valid_times(ts_ms)
        if not ok.any():  # none valid, or no sample at all
            return None
        if not ok.all():
            node_codes, ts_ms = node_codes[ok], ts_ms[ok]
        codes, top = _latest(node_codes, ts_ms)
        if self._horizon_ms is None:
            self._note(codes, top, names)
        else:
            self._hold_or_note(node_codes, ts_ms, names)
        return int(top.min()), int(top.max())

    def _hold_or_note(
        self, node_codes: np.ndarray, ts_ms: np.ndarray, names: Sequence[str]
    ) -> None:
        """Samples at or past the horizon held, the others noted."""
        later = ts_ms >= (_FAR_PAST if self._horizon_ms is None else self._horizon_ms)
        if later.any():
            self._held.append((names, node_codes[later], ts_ms[later]))
            node_codes, ts_ms = node_codes[~later], ts_ms[~later]
        if len(ts_ms):
            self._note(*_latest(node_codes, ts_ms), names)

    def _release_held(self, now_ms: int) -> None:
        """Held samples before ``now_ms`` noted, later ones held on; the horizon moves there."""
        held, self._held = self._held, []
        self._horizon_ms = now_ms
        # one pass per string table over all its held samples (a backlog holds many small runs:
        # passing each again at every check cost more than the rest of the watch)
        tables: dict[int, tuple[Sequence[str], list[np.ndarray], list[np.ndarray]]] = {}
        for names, codes, ts in held:
            got = tables.setdefault(id(names), (names, [], []))
            got[1].append(codes)
            got[2].append(ts)
        for names, code_runs, ts_runs in tables.values():
            self._hold_or_note(np.concatenate(code_runs), np.concatenate(ts_runs), names)

    def _note(self, codes: np.ndarray, top: np.ndarray, names: Sequence[str]) -> None:
        """Each node's (code's) latest time, kept by code until a check needs them by name
        (:meth:`_note_pending`)."""
        held = self._pending.get(id(names))
        size = int(codes[-1]) + 1
        if held is None or len(held[1]) < size:
            grown = np.full(max(size, len(names)), _FAR_PAST, np.int64)
            if held is not None:
                grown[: len(held[1])] = held[1]
            held = self._pending[id(names)] = (names, grown)
        latest = held[1]
        latest[codes] = np.maximum(latest[codes], top)

    def check(
        self,
        watched: Mapping[str, tuple[str, int]],
        now_ms: int,
        clock: Callable[[str], int | None] | None = None,
        watch_from: Callable[[str], int | None] | None = None,
    ) -> list[StragglerFinding]:
        """Findings at event time ``now_ms`` for the nodes of ``watched`` (node -> (job id, job
        start ms)): CLEARED ones first, then new SILENT / FLEET_WIDE ones. ``clock`` gives a
        node's own event time where it differs (live: its partition's; None: not known yet,
        the node is not looked at). ``watch_from`` gives, for a node watched for the first
        time, since when the driver has read its samples; default: the node's clock now. A
        held watch first notes the held samples before ``now_ms``."""
        if self.held:
            self._release_held(now_ms)
        out = self._clear(watched, now_ms)
        last = self.last_ms
        crossed: list[str] = []
        near: list[str] = []
        # one pass over every watched node at each check: names bound once, max() written out
        watched_since, silent = self.watched_since, self.silent
        silent_after_ms = self.silent_after_ms
        near_ms = silent_after_ms - self.group_ms
        for node, (_job, start_ms) in watched.items():
            at = now_ms if clock is None else clock(node)
            if at is None:
                continue
            since = watched_since.get(node)
            if since is None:
                begun = watch_from(node) if watch_from is not None else None
                since = watched_since[node] = at if begun is None else min(begun, at)
            if node in silent:
                continue
            latest = last.get(node, _FAR_PAST)
            if start_ms > latest:
                latest = start_ms
            quiet = at - (since if since > latest else latest)
            if quiet >= silent_after_ms:
                crossed.append(node)
            elif quiet >= near_ms:
                near.append(node)
        for node in [n for n in watched_since if n not in watched]:
            del watched_since[node]  # left its job: watched afresh if allocated again
        for node in [n for n in last if n not in watched and n not in silent]:
            if now_ms - last[node] > 2 * silent_after_ms:
                del last[node]  # bounded: only nodes that matter lately
        if crossed:
            out += self._open(sorted(crossed + near), crossed, watched, now_ms)
        self.findings += len(out)
        return out

    def _since(self, node: str, watched: Mapping[str, tuple[str, int]]) -> int:
        start = watched[node][1]
        return max(self.last_ms.get(node, _FAR_PAST), start, self.watched_since.get(node, start))

    def _open(
        self,
        nodes: list[str],
        crossed: list[str],
        watched: Mapping[str, tuple[str, int]],
        now_ms: int,
    ) -> list[StragglerFinding]:
        detected = max(self._since(n, watched) for n in crossed) + self.silent_after_ms
        by_job: dict[str, list[str]] = {}
        for n in nodes:
            by_job.setdefault(watched[n][0], []).append(n)
        groups: list[tuple[str, str | None, FindingStatus, list[str]]] = []
        if len(nodes) >= self.fleet_min_nodes and len(by_job) > 1:
            groups.append((FLEET_JOB, None, FLEET_WIDE, nodes))
        else:
            for job, members in sorted(by_job.items()):
                node = members[0] if len(members) == 1 else None
                groups.append((job, node, SILENT, members))
        out = []
        for job, node, status, members in groups:
            since = min(self._since(n, watched) for n in members)
            event = _Event(
                stable_id(job, node, None, status, since, hex_chars=self.hex_chars),
                job,
                node,
                status,
                since,
                {n: self._since(n, watched) for n in members},
            )
            self.events[event.finding_id] = event
            for n in members:
                self.silent[n] = event.finding_id
            jobs = sorted({watched[n][0] for n in members})
            where = node or f"{len(members)} nodes ({_names(members)})"
            of = f" of {len(jobs)} jobs" if status == FLEET_WIDE else f" job {job}"
            reason = f"no samples from {where}{of} for {(now_ms - since) // 1000} s"
            out.append(self._finding(event, status, now_ms, detected, len(members), reason))
        return out

    def _clear(self, watched: Mapping[str, tuple[str, int]], now_ms: int) -> list[StragglerFinding]:
        out = []
        for node, fid in list(self.silent.items()):
            event = self.events[fid]
            back = self.last_ms.get(node, _FAR_PAST) > event.members[node]
            if back or node not in watched:
                del self.silent[node]
                del event.members[node]
                if not event.members:
                    del self.events[fid]
                    why = "samples again" if back else "no longer watched (job ended, moved)"
                    out.append(self._finding(event, CLEARED, now_ms, now_ms, 0, why))
        return out

    def _finding(
        self,
        event: _Event,
        status: FindingStatus,
        now_ms: int,
        detected_ms: int,
        nodes: int,
        reason: str,
    ) -> StragglerFinding:
        finding_id = event.finding_id
        if status == CLEARED:
            finding_id = stable_id(event.finding_id, CLEARED, hex_chars=self.hex_chars)
        start = event.since_ms - event.since_ms % self.window_ms
        return {
            "finding_id": finding_id,
            "job_id": event.job_id,
            "node": event.node,
            "gpu_index": None,
            "gpu_uuid": None,
            "status": status,
            "window_start_ms": start,
            "window_end_ms": max(now_ms, start + 1),
            "features": [],
            "hard_rules": [],
            "windows_flagged": nodes,
            "windows_considered": nodes,
            "first_flagged_ms": event.since_ms,
            "peer_group_size": nodes,
            "reason": reason,
            "cause": "NO_SAMPLES",
            "detected_ms": detected_ms,
            "port": None,
            "switch": None,
        }

    def counters(self) -> dict[str, int]:
        """Nodes with a known last sample, nodes silent now, findings made."""
        return {
            "silence_nodes_known": len(self.last_ms),
            "silent_nodes": len(self.silent),
            "silence_findings": self.findings,
        }


def _latest(node_codes: np.ndarray, ts_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct node codes of a batch (sorted) and each one's latest time."""
    codes, inverse = np.unique(node_codes, return_inverse=True)
    top = np.full(len(codes), _FAR_PAST, np.int64)
    np.maximum.at(top, inverse, ts_ms)
    return codes, top


class SilenceClock:
    """When the silence watch checks (module docstring): at every multiple of ``every_ms`` of
    event time that every source's latest sample time reached. Feed each source's newest
    sample time (:meth:`saw`); :meth:`due` returns the check times now due, each once."""

    def __init__(self, every_ms: int) -> None:
        if every_ms <= 0:
            raise ValueError("every_ms must be positive")
        self.every_ms = every_ms
        #: source -> its latest sample time (ms)
        self.latest: dict[int, int] = {}
        #: the next check time (None before any sample)
        self.next_ms: int | None = None
        self._checked = False

    def saw(self, src: int, newest_ms: int) -> None:
        """Source ``src`` has a sample at ``newest_ms``. Until the first check, the first check
        time follows the earliest sample seen (whichever source is read first)."""
        if newest_ms > self.latest.get(src, _FAR_PAST):
            self.latest[src] = newest_ms
        first = newest_ms - newest_ms % self.every_ms  # the first check: with the first sample
        if self.next_ms is None or (not self._checked and first < self.next_ms):
            self.next_ms = first

    def due(self, sources: Iterable[int] | None = None, now_ms: int | None = None) -> list[int]:
        """The check times every source of ``sources`` (default: every source seen) reached,
        in order; a source not seen yet holds every check back. ``now_ms``: the event time
        instead (live, a worker whose partitions are all quiet: moved on by the wall clock)."""
        if self.next_ms is None:
            return []
        if now_ms is None:
            srcs = list(self.latest) if sources is None else list(sources)
            if not srcs:
                return []
            now_ms = min(self.latest.get(s, _FAR_PAST) for s in srcs)
        out = []
        while self.next_ms <= now_ms:
            out.append(self.next_ms)
            self.next_ms += self.every_ms
        if out:
            self._checked = True
        return out


def _names(nodes: list[str], most: int = 4) -> str:
    shown = " ".join(nodes[:most])
    return shown + (f" +{len(nodes) - most}" if len(nodes) > most else "")
