"""NIC link rules, declared once as data (like :data:`~peerwatch.streams.core.hard_rules.HARD_RULES`).

DETECTION.md "Network", hard on arrival: a port not ACTIVE/LinkUp on an allocated node for longer
than ``network.port_down_s`` (NCCL's IB timeout, about 7 s, tears the job's connections); any
rise of ``link_downed``, ``local_link_integrity_errors``, ``excessive_buffer_overrun_errors``,
``rnr_nak_retry_err``; rates above NVSentinel's documented defaults (``symbol_error`` > 10/s,
``link_error_recovery`` > 5/min, ``port_rcv_errors`` > 10/s, ``local_ack_timeout_err`` > 1/s,
``port_xmit_discards`` > 100/s, ``roce_slow_restart`` > 10/s). A port below its rated speed is a
finding, never a drain. On PAM4 links raw bit errors are normal: no rule ever reads a total since
boot, only what a counter did since the port's previous reading (a first reading, a reset and a
saturated counter restart the baseline and fire nothing).

Every evaluator reads :data:`LINK_RULES`: :class:`~peerwatch.streams.core.link_watch.LinkWatch`
on arrival. A new rule is one row here (and, for a new kind, one branch in the evaluator).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from peerwatch.streams.core.settings import NetworkSettings

#: How a rule reads its evidence.
#: ``down``: the port's known-down time in its current down episode (each reading's state holds
#: until the next reading, for at most ``max_gap_intervals`` sampling intervals, as
#: :func:`peerwatch.producers.nic.counters.downtime` counts it) passes the limit (seconds).
#: ``rise``: the counter rose over the port's previous reading.
#: ``rate``: the counter's increase over a span of ``max(rate_span_s, per_s)`` seconds exceeds
#: ``limit * span / per_s`` (fires at the reading that shows it, possibly before the span ends).
#: ``below``: the link rate read is below the rated speed (``rated_gbps``, or the highest rate the
#: port has shown when that is 0).
LinkRuleKind = Literal["down", "rise", "rate", "below"]


@dataclass(frozen=True)
class LinkRule:
    """One link rule: its ``name`` (as findings list it in ``hard_rules``), ``kind``, the raw
    counter it reads (``counters/`` or ``hw_counters/`` name; None for state rules), the
    :class:`NetworkSettings` field holding its limit (``limit``), the limit's time unit in
    seconds (``per_s``: 1 per second, 60 per minute), whether it drains (HARD_ERROR) or only
    makes a finding, and whether it needs the node's GPUs allocated."""

    name: str
    kind: LinkRuleKind
    counter: str | None = None
    limit: str | None = None
    per_s: float = 1.0
    drain: bool = True
    allocated_only: bool = False

    def threshold(self, settings: NetworkSettings) -> float:
        """The rule's limit from ``settings`` (0 when it has none)."""
        return float(getattr(settings, self.limit)) if self.limit else 0.0

    def span_s(self, settings: NetworkSettings) -> float:
        """Seconds a ``rate`` rule judges its counter over."""
        return max(settings.rate_span_s, self.per_s)


# fmt: off
LINK_RULES: tuple[LinkRule, ...] = (
    LinkRule("port_down", "down", limit="port_down_s", allocated_only=True),
    LinkRule("link_downed", "rise", "link_downed"),
    LinkRule("local_link_integrity_errors", "rise", "local_link_integrity_errors"),
    LinkRule("excessive_buffer_overrun_errors", "rise", "excessive_buffer_overrun_errors"),
    LinkRule("rnr_nak_retry_err", "rise", "rnr_nak_retry_err"),
    LinkRule("symbol_error_rate", "rate", "symbol_error", "symbol_error_per_s"),
    LinkRule("link_error_recovery_rate", "rate", "link_error_recovery",
             "link_error_recovery_per_min", per_s=60.0),
    LinkRule("port_rcv_errors_rate", "rate", "port_rcv_errors", "port_rcv_errors_per_s"),
    LinkRule("local_ack_timeout_err_rate", "rate", "local_ack_timeout_err",
             "local_ack_timeout_err_per_s"),
    LinkRule("port_xmit_discards_rate", "rate", "port_xmit_discards", "port_xmit_discards_per_s"),
    LinkRule("roce_slow_restart_rate", "rate", "roce_slow_restart", "roce_slow_restart_per_s"),
    LinkRule("port_below_rated", "below", limit="rated_gbps", drain=False),
)
# fmt: on
#: The rule of each name.
LINK_RULE_BY_NAME = {rule.name: rule for rule in LINK_RULES}
#: Every raw counter some rule reads.
RULE_COUNTERS = tuple(sorted({r.counter for r in LINK_RULES if r.counter}))
