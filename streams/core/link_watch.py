"""NIC link rules on arrival: a finding from the NodeNicSample that shows the fault.

:class:`LinkWatch` reads each decoded NodeNicSample as it comes in and keeps per (node, port)
what the rules of :data:`~peerwatch.streams.core.network_rules.LINK_RULES` need: the last link
state and the known-down time of the current down episode, the last value of each rule counter,
the anchor of each rate span, the highest link rate seen, and when each rule last fired. A
finding leaves at the sample that shows the fault:

- ``HARD_ERROR`` (the policy drains) with cause ``NETWORK``, naming node and port, for the
  ``drain`` rules (port down on an allocated node, counter rises, rates);
- ``SUSPECT`` with cause ``NETWORK`` (an alert, never a drain) for a port below its rated speed.

A rule that fired on a port does not fire again on it within ``network.repeat_after_s`` (a storm
is one finding); the port-down rule fires once per down episode.

Hostile input: a sample whose node, time or ports do not parse is skipped and counted
(``invalid_samples``), a port reading without a name likewise (``invalid_ports``), a counter value
that is not an integer in ``[0, 2**64)`` is missing (``bad_values``). A reading whose time does not
move its port's clock forward (late, repeated) changes nothing (``stale_readings``).

The finding's ``job_id``: the job owning the port's rail GPUs (``gpu_indices``) at the sample's
time, else any job on the node, else the node's idle pseudo job; ``gpu_index`` is None (the port
is blamed, not a GPU); ``window_start_ms`` the start of the detector window holding the sample;
``detected_ms`` the sample's time.

State is plain data: :meth:`LinkWatch.snapshot` / :meth:`LinkWatch.restore`; :meth:`prune`
forgets ports silent for longer than a horizon.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeGuard

from peerwatch.producers.nic.counters import counter_delta
from peerwatch.schemas.records import FindingStatus, StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.model import HARD_ERROR, IDLE_JOB_PREFIX, SUSPECT, stable_id
from peerwatch.streams.core.network_rules import LINK_RULES, RULE_COUNTERS, LinkRule
from peerwatch.streams.core.settings import DetectorSettings, NetworkSettings

#: Sample times and counter values must lie in ``[0, TS_LIMIT)`` / ``[0, VALUE_LIMIT)``.
TS_LIMIT = 1 << 53
VALUE_LIMIT = 1 << 64
_FAR_PAST = -(1 << 62)


@dataclass
class PortMemory:
    """What :class:`LinkWatch` remembers of one port (plain data: see :meth:`to_dict`).

    ``last_ts``/``up``: the last reading's time and link state (None: unreadable). ``down_ms``:
    known-down ms of the current down episode (None: no episode); ``down_fired``: the episode
    fired. ``counters``: rule counter -> (ts_ms, value) of its last good reading. ``anchors``:
    rate rule -> (ts_ms, value) at which its span started. ``best_gbps``: highest rate read.
    ``fired``: rule -> ms it last fired.
    """

    last_ts: int = _FAR_PAST
    up: bool | None = None
    down_ms: int | None = None
    down_fired: bool = False
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    anchors: dict[str, tuple[int, int]] = field(default_factory=dict)
    best_gbps: float | None = None
    fired: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "last_ts": self.last_ts,
            "up": self.up,
            "down_ms": self.down_ms,
            "down_fired": self.down_fired,
            "counters": {k: list(v) for k, v in self.counters.items()},
            "anchors": {k: list(v) for k, v in self.anchors.items()},
            "best_gbps": self.best_gbps,
            "fired": dict(self.fired),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PortMemory:
        def pairs(raw: Any) -> dict[str, tuple[int, int]]:
            return {str(k): (int(v[0]), int(v[1])) for k, v in (raw or {}).items()}

        best = data.get("best_gbps")
        down = data.get("down_ms")
        return cls(
            last_ts=int(data.get("last_ts", _FAR_PAST)),
            up=data.get("up"),
            down_ms=None if down is None else int(down),
            down_fired=bool(data.get("down_fired")),
            counters=pairs(data.get("counters")),
            anchors=pairs(data.get("anchors")),
            best_gbps=None if best is None else float(best),
            fired={str(k): int(v) for k, v in (data.get("fired") or {}).items()},
        )


class _Rule(NamedTuple):
    """A rule of :data:`LINK_RULES` with its limit and span read once from the (frozen)
    settings: a reading evaluates every rule, so what does not change is not looked up again."""

    rule: LinkRule
    kind: str
    counter: str | None
    #: the rule's limit (:meth:`LinkRule.threshold`)
    limit: float
    #: a rate rule's span (:meth:`LinkRule.span_s`), in s and ms
    span_s: float
    span_ms: float


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, a decoded dict answered without the ABC's check (a
    reading asks three times)."""
    return type(value) is dict or isinstance(value, Mapping)


def _int_value(value: Any) -> int | None:
    """A counter value as an int, or None when it is not an integer in ``[0, VALUE_LIMIT)``."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < VALUE_LIMIT:
        return value
    return None


class LinkWatch:
    """Link rules on arrival over decoded NodeNicSample dicts (any number of nodes).

    ``allocations`` is read only (who owns the node's GPUs at the sample's time).
    """

    def __init__(
        self,
        allocations: AllocationTable,
        settings: NetworkSettings | None = None,
        detector: DetectorSettings | None = None,
    ) -> None:
        self.allocations = allocations
        self.settings = settings or NetworkSettings()
        self.detector = detector or DetectorSettings()
        self.ports: dict[tuple[str, str], PortMemory] = {}
        s = self.settings
        self._rules = [_Rule(r, r.kind, r.counter, r.threshold(s), r.span_s(s),
                             r.span_s(s) * 1000) for r in LINK_RULES]  # fmt: skip
        self._rate_rules = [r for r in self._rules if r.kind == "rate" and r.counter]
        self._repeat_ms = s.repeat_after_s * 1000
        self.samples = 0
        self.invalid_samples = 0
        self.invalid_ports = 0
        self.bad_values = 0
        self.stale_readings = 0
        self.findings = 0

    # -- input ----------------------------------------------------------------------------------
    def add(self, sample: Mapping[str, Any]) -> list[StragglerFinding]:
        """One decoded NodeNicSample; returns the findings it shows (HARD_ERROR first, then
        SUSPECT; ports in the sample's order). Raises nothing on bad input (counted)."""
        node, ts = sample.get("node"), sample.get("ts_ms")
        ports = sample.get("ports")
        interval = sample.get("interval_ms")
        if (
            not isinstance(node, str)
            or not node
            or not isinstance(ts, int)
            or isinstance(ts, bool)
            or not 0 <= ts < TS_LIMIT
            or not isinstance(ports, list)
        ):
            self.invalid_samples += 1
            return []
        self.samples += 1
        if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
            interval = 1000  # the agent's default; the gap bound only needs an order of size
        max_gap_ms = int(self.settings.max_gap_intervals * interval)
        out: list[StragglerFinding] = []
        for reading in ports:
            name = reading.get("name") if _is_mapping(reading) else None
            if not isinstance(name, str) or not name:
                self.invalid_ports += 1
                continue
            out += self._port(node, name, ts, reading, max_gap_ms)
        self.findings += len(out)
        return sorted(out, key=lambda f: f["status"] != HARD_ERROR)

    def _port(
        self, node: str, name: str, ts: int, reading: Mapping[str, Any], max_gap_ms: int
    ) -> list[StragglerFinding]:
        mem = self.ports.setdefault((node, name), PortMemory())
        if ts <= mem.last_ts:
            self.stale_readings += 1
            return []
        values = self._values(reading)
        fired = self._fired(mem, ts, reading, values, max_gap_ms, node)
        self._remember(mem, ts, reading, values, max_gap_ms)
        out: list[StragglerFinding] = []
        for drain in (True, False):
            names = self._fresh(mem, ts, [r for r in fired if r.drain == drain])
            if names:
                out.append(self._finding(node, name, ts, reading, names, drain))
        return out

    def _values(self, reading: Mapping[str, Any]) -> dict[str, int | None]:
        """The rule counters of a reading (None: absent, unreadable or bad, counted)."""
        out: dict[str, int | None] = {}
        for group in ("counters", "hw_counters"):
            raw = reading.get(group)
            if not _is_mapping(raw):
                continue
            for counter in RULE_COUNTERS:
                value = raw.get(counter)
                if value is None:
                    continue
                if type(value) is not int or not 0 <= value < VALUE_LIMIT:  # the common case first
                    value = _int_value(value)
                    self.bad_values += value is None
                out[counter] = value
        return out

    # -- rules ----------------------------------------------------------------------------------
    def _fired(
        self,
        mem: PortMemory,
        ts: int,
        reading: Mapping[str, Any],
        values: Mapping[str, int | None],
        max_gap_ms: int,
        node: str,
    ) -> list[LinkRule]:
        """The rules of :data:`LINK_RULES` the reading shows firing, in their order (one call
        per reading, not one per rule: a reading evaluates every rule)."""
        fired: list[LinkRule] = []
        for rule in self._rules:
            kind = rule.kind
            if kind == "down":
                if self._down_fires(rule, mem, ts, reading.get("up"), max_gap_ms, node):
                    fired.append(rule.rule)
                continue
            if kind == "below":
                rate = reading.get("rate_gbps")
                if not isinstance(rate, (int, float)) or isinstance(rate, bool) or rate <= 0:
                    continue
                rated = rule.limit or mem.best_gbps
                if rated is not None and rate < rated:
                    fired.append(rule.rule)
                continue
            assert rule.counter is not None
            current = values.get(rule.counter)
            if current is None:
                continue
            if kind == "rise":
                before = mem.counters.get(rule.counter)
                # a first reading is a total since boot: never judged. Above the previous value
                # is a rise (reaching the counter's maximum included); below it, a reset (new
                # baseline); still at the maximum, unknown: the same as counter_delta, without
                # its cost
                if before is not None and current > before[1]:
                    fired.append(rule.rule)
                continue
            anchor = mem.anchors.get(rule.rule.name)
            if anchor is None or current == anchor[1]:
                continue  # no rate yet, or nothing counted since the span began
            d = counter_delta(rule.counter, anchor[1], current, (ts - anchor[0]) / 1000)
            if d.delta is None:
                continue
            span_s = max(rule.span_s, (ts - anchor[0]) / 1000)
            if d.delta > rule.limit * span_s / rule.rule.per_s:
                fired.append(rule.rule)
        return fired

    def _down_fires(
        self, rule: _Rule, mem: PortMemory, ts: int, up: Any, max_gap_ms: int, node: str
    ) -> bool:
        """Advance the port's down episode to ``ts`` and say whether it passes the limit."""
        if mem.up is False and mem.down_ms is not None:
            mem.down_ms += min(ts - mem.last_ts, max_gap_ms)
        if up is True:
            mem.down_ms, mem.down_fired = None, False
            return False
        if up is False and mem.down_ms is None:
            mem.down_ms = 0
        if mem.down_ms is None or mem.down_fired:
            return False
        if mem.down_ms <= rule.limit * 1000:
            return False
        if rule.rule.allocated_only and not self.allocations.segment(node, ts)[0]:
            return False
        mem.down_fired = True
        return True

    def _remember(
        self,
        mem: PortMemory,
        ts: int,
        reading: Mapping[str, Any],
        values: Mapping[str, int | None],
        max_gap_ms: int,
    ) -> None:
        up = reading.get("up")
        mem.up = up if isinstance(up, bool) else None
        rate = reading.get("rate_gbps")
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
            mem.best_gbps = max(float(rate), mem.best_gbps or 0.0)
        for counter, value in values.items():
            if value is not None:
                mem.counters[counter] = (ts, value)
        for rule in self._rate_rules:
            value = values.get(rule.counter)  # type: ignore[arg-type]  # rate rules have one
            if value is None:
                continue
            anchor = mem.anchors.get(rule.rule.name)
            span_ms = rule.span_ms
            restart = (
                anchor is None
                or value < anchor[1]  # reset: new baseline
                or ts - anchor[0] >= span_ms
                or ts - mem.last_ts > max_gap_ms + span_ms  # a long silence: start over
            )
            if restart:
                mem.anchors[rule.rule.name] = (ts, value)
        mem.last_ts = ts

    def _fresh(self, mem: PortMemory, ts: int, rules: list[LinkRule]) -> list[str]:
        """The names of ``rules`` not fired on this port within ``repeat_after_s``; marks them."""
        out = []
        for rule in rules:
            last = mem.fired.get(rule.name, _FAR_PAST)
            if rule.kind == "down" or ts - last > self._repeat_ms:
                out.append(rule.name)
            mem.fired[rule.name] = ts
        return sorted(out)

    # -- output ---------------------------------------------------------------------------------
    def _job(self, node: str, ts: int, rail: Any) -> str:
        owners = self.allocations.segment(node, ts)[0]
        rail_jobs = [
            owners[g] for g in rail or () if isinstance(g, int) and g in owners
        ]  # fmt: skip
        jobs = rail_jobs or list(owners.values())
        if not jobs:
            return IDLE_JOB_PREFIX + node
        # the job holding most of them (ties: the smallest id), so the answer is deterministic
        return min(Counter(jobs).items(), key=lambda kv: (-kv[1], kv[0]))[0]

    def _finding(
        self,
        node: str,
        port: str,
        ts: int,
        reading: Mapping[str, Any],
        rules: list[str],
        drain: bool,
    ) -> StragglerFinding:
        job = self._job(node, ts, reading.get("gpu_indices"))
        window_ms = self.detector.window_ms
        start = ts - ts % window_ms
        status: FindingStatus = HARD_ERROR if drain else SUSPECT
        what = ", ".join(rules)
        rate = reading.get("rate_gbps")
        detail = f" at {rate:g} Gb/s" if not drain and isinstance(rate, (int, float)) else ""
        return {
            "finding_id": stable_id(
                job, node, port, status, "link", what, ts, hex_chars=self.detector.id_hex_chars
            ),
            "job_id": job,
            "node": node,
            "gpu_index": None,
            "gpu_uuid": None,
            "status": status,
            "window_start_ms": start,
            "window_end_ms": start + window_ms,
            "features": [],
            "hard_rules": rules,
            "windows_flagged": 1,
            "windows_considered": 1,
            "first_flagged_ms": start,
            "peer_group_size": 1,
            "reason": f"{'link' if drain else 'link degraded'} {port}{detail}: {what}",
            "cause": "NETWORK",
            "detected_ms": ts,
            "port": port,
            "switch": None,
        }

    # -- state ----------------------------------------------------------------------------------
    def prune(self, before_ms: int) -> int:
        """Forget ports whose last reading is older than ``before_ms``; returns how many."""
        old = [k for k, m in self.ports.items() if m.last_ts < before_ms]
        for key in old:
            del self.ports[key]
        return len(old)

    def snapshot(self) -> dict[str, Any]:
        """The per-port memory as plain JSON types (``restore`` takes it back)."""
        return {"ports": [[n, p, m.to_dict()] for (n, p), m in sorted(self.ports.items())]}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Replace the memory with a :meth:`snapshot`. Raises ValueError/TypeError/KeyError on a
        malformed snapshot (the caller's own store: not hostile input)."""
        self.ports = {(str(n), str(p)): PortMemory.from_dict(m) for n, p, m in data["ports"]}

    def counters(self) -> dict[str, int]:
        """Samples looked at, bad input skipped, stale readings, findings."""
        return {
            "link_samples": self.samples,
            "link_invalid_samples": self.invalid_samples,
            "link_invalid_ports": self.invalid_ports,
            "link_bad_values": self.bad_values,
            "link_stale_readings": self.stale_readings,
            "link_findings": self.findings,
        }
