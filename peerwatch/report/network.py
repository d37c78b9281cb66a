"""The network line of a job's report: the ports of the job's nodes that the stream named.

A pure function of records (:func:`network_ports`): the job's StragglerFindings with cause
``NETWORK`` that name a port (a link rule on arrival, or a port standing out against the job's
other nodes), the ``NETWORK`` recommendations about the job's nodes, and, where the caller read
them, the NodeNicSamples of those nodes over the job (:class:`PortTotals`: the whole job folded
as one span with the NIC counter arithmetic, :class:`~peerwatch.producers.nic.spans.PortSpans`),
for each named port's seconds down, flaps and error rate. A leaf-switch finding of the job is a
line of its own (no node). No I/O, no clock; every input is hostile: a record of the wrong shape
is skipped and counted, never raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peerwatch.producers.nic.spans import PortSpans
from peerwatch.producers.nic.window import PortWindow
from peerwatch.report.job_inputs import Skips, array, number
from peerwatch.streams.core.network_peers import FEATURES
from peerwatch.streams.core.settings import NetworkSettings

#: Statuses a network finding can have, worst first.
_ORDER = ("HARD_ERROR", "CONFIRMED", "FLEET_WIDE", "SUSPECT")
_ERRORS = next(f for f in FEATURES if f.name == "net_errors")
_WAIT = next(f for f in FEATURES if f.name == "net_wait")
#: A span that never closes on its own: a job's readings are one span, closed at the end.
_WHOLE_JOB_S = 10 * 365 * 86_400.0


@dataclass(frozen=True)
class PortLine:
    """One port (or leaf switch) the stream named for this job.

    ``statuses`` worst first; ``rules`` the link rules that fired; ``action`` what was
    recommended for the node (``DRAIN``, ``ALERT``; None: nothing); ``down_s`` / ``flaps`` /
    ``errors_per_s`` / ``wait_share`` over the job from its NIC samples (None: not read).
    """

    node: str | None
    port: str | None
    switch: str | None
    statuses: tuple[str, ...]
    rules: tuple[str, ...]
    action: str | None
    reason: str
    first_ms: int
    down_s: float | None = None
    flaps: int | None = None
    errors_per_s: float | None = None
    wait_share: float | None = None


@dataclass
class PortTotals:
    """NodeNicSamples of ``nodes`` in ``[start_ms, end_ms]`` folded into one span per port
    (feed them with :meth:`add`, in any number, as they are read: nothing is kept but each
    port's running totals). ``end_ms`` None: no end yet."""

    nodes: frozenset[str]
    start_ms: int | None = None
    end_ms: int | None = None
    network: NetworkSettings = field(default_factory=NetworkSettings)
    skipped: int = 0
    _spans: PortSpans | None = None

    def add(self, sample: Any) -> None:
        """Fold one NodeNicSample of one of ``nodes``; other nodes' and times' are ignored, a
        malformed one is counted in ``skipped``."""
        if not isinstance(sample, Mapping) or sample.get("node") not in self.nodes:
            return
        ts = number(sample, "ts_ms")
        if ts is None:
            self.skipped += 1
            return
        if (self.start_ms is not None and ts < self.start_ms) or (
            self.end_ms is not None and ts > self.end_ms
        ):
            return
        if self._spans is None:
            self._spans = PortSpans(span_s=_WHOLE_JOB_S, network=self.network,
                                    stale_after_s=_WHOLE_JOB_S)  # fmt: skip
        try:
            self._spans.add_sample(sample)
        except (KeyError, TypeError, ValueError, AttributeError):
            self.skipped += 1

    def windows(self) -> dict[tuple[str, str], PortWindow]:
        """Each port's window over what was folded (ports with fewer than two readings have
        none)."""
        if self._spans is None:
            return {}
        return {c.key: c.window for c in self._spans.close_all()}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def network_nodes(job_id: str, findings: Iterable[Any], recommendations: Iterable[Any]) -> set[str]:
    """The nodes whose ports the stream named for ``job_id`` (the NIC samples worth reading)."""
    return {
        node
        for r in _network_records(job_id, findings, recommendations, Skips())
        if (node := _str(r.get("node"))) is not None
    }


def _network_records(
    job_id: str, findings: Iterable[Any], recommendations: Iterable[Any], skips: Skips
) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for kind, records in (("finding", findings), ("recommendation", recommendations)):
        for r in records:
            if not isinstance(r, Mapping):
                skips.add(kind, "not a record")
                continue
            jobs = (
                [str(r.get("job_id"))] if kind == "finding" else map(str, array(r.get("job_ids")))
            )
            if r.get("cause") != "NETWORK" or job_id not in jobs:
                continue
            if not (_str(r.get("port")) or _str(r.get("switch"))):
                continue  # a NETWORK record naming neither a port nor a switch says nothing here
            out.append(r)
    return out


def network_ports(
    job_id: str,
    findings: Iterable[Any] = (),
    recommendations: Iterable[Any] = (),
    totals: Mapping[tuple[str, str], PortWindow] | None = None,
    network: NetworkSettings | None = None,
    skips: Skips | None = None,
) -> list[PortLine]:
    """One :class:`PortLine` per port (or switch) the stream named for ``job_id``, worst first.

    ``totals``: :meth:`PortTotals.windows` of the job's NIC samples, when read. Bad records are
    counted in ``skips``; raises nothing."""
    skips = skips if skips is not None else Skips()
    network = network or NetworkSettings()
    by: dict[tuple[str | None, str | None, str | None], list[Mapping[str, Any]]] = {}
    for r in _network_records(job_id, findings, recommendations, skips):
        time_ms = number(r, "detected_ms") or number(r, "ts_ms") or number(r, "window_end_ms")
        if time_ms is None:
            skips.add("network record", "no time")
            continue
        key = (_str(r.get("node")), _str(r.get("port")), _str(r.get("switch")))
        by.setdefault(key, []).append(r)
    lines = []
    for (node, port, switch), records in by.items():
        records.sort(key=lambda r: number(r, "detected_ms") or number(r, "ts_ms") or 0)
        statuses = {str(r["status"]) for r in records if isinstance(r.get("status"), str)}
        actions = {str(r["action"]) for r in records if r.get("action") in ("DRAIN", "ALERT")}
        window = totals.get((node, port)) if totals and node and port else None
        lines.append(
            PortLine(
                node=node, port=port, switch=switch,
                statuses=tuple(s for s in _ORDER if s in statuses),
                rules=tuple(sorted({str(x) for r in records for x in array(r.get("hard_rules"))
                                    if isinstance(x, str)})),
                action="DRAIN" if "DRAIN" in actions else ("ALERT" if actions else None),
                reason=str(records[-1].get("reason") or ""),
                first_ms=int(number(records[0], "detected_ms") or number(records[0], "ts_ms")
                             or 0),
                down_s=window.down_s if window else None,
                flaps=window.flaps if window else None,
                errors_per_s=_ERRORS.value(window, network) if window else None,
                wait_share=_WAIT.value(window, network) if window else None,
            )
        )  # fmt: skip
    lines.sort(key=lambda x: (_rank(x.statuses), x.action != "DRAIN", x.first_ms,
                              x.node or "", x.port or "", x.switch or ""))  # fmt: skip
    return lines


def _rank(statuses: Sequence[str]) -> int:
    return min((_ORDER.index(s) for s in statuses), default=len(_ORDER))


def line_text(line: PortLine) -> str:
    """One port's line as plain text (the caller escapes it for its terminal or page):
    ``gpu00007 mlx5_1/1: HARD_ERROR (symbol_error_rate); drain recommended; down 8.0 s,
    2 flaps, 40.0 errors/s``."""
    where = f"{line.node} {line.port}" if line.port else f"leaf switch {line.switch}"
    parts = [where + ": " + (", ".join(line.statuses) or "recommendation")
             + (f" ({', '.join(line.rules)})" if line.rules else "")]  # fmt: skip
    if line.action:
        parts.append("drain recommended" if line.action == "DRAIN" else "alert raised")
    measured = []
    if line.down_s is not None:
        measured.append(f"down {line.down_s:.1f} s")
    if line.flaps:
        measured.append(f"{line.flaps} flap{'s' if line.flaps != 1 else ''}")
    if line.errors_per_s is not None:
        measured.append(f"{line.errors_per_s:.1f} errors/s")
    if line.wait_share is not None:
        measured.append(f"xmit wait {line.wait_share:.0%}")
    if measured:
        parts.append(", ".join(measured))
    if line.reason:
        parts.append(line.reason)
    return "; ".join(parts)
