"""Per-port NIC metrics from ``peerwatch.nic.samples``: pure mapping, bounded state.

One *port series* is one port of one node (``(node, port name)``), whatever job runs there: a
link belongs to the node, and the job dashboards join ports to a job's nodes by ``host.name``.
Each port's readings are folded into *spans* of at least the export interval
(:class:`~peerwatch.producers.nic.spans.PortSpans`: the NIC counter arithmetic of
:mod:`peerwatch.producers.nic.counters`, per pair of readings); a closed span is a
:class:`~peerwatch.producers.nic.window.PortWindow`, and its rates are the very features the
stream compares across a job's nodes (:data:`peerwatch.streams.core.network_peers.FEATURES`:
error, retransmit and CNP rates, bytes/s, the ``port_xmit_wait`` share). One arithmetic, read
twice.

Metrics (attributes ``host.name``, ``hw.id`` = ``<node>/<port>``, ``hw.type=network``,
``network.interface.name`` = the port name, ``peerwatch.nic.device``, ``peerwatch.nic.kind``,
and ``peerwatch.nic.link_layer`` where known):

=================================== ========= ======= =============================================
name                                unit      kind    value
=================================== ========= ======= =============================================
``peerwatch.nic.link.up``           1         gauge   1 when the latest reading is up, else 0
``peerwatch.nic.link.speed``        Gbit/s    gauge   link rate of the latest reading
``peerwatch.nic.link.rated_speed``  Gbit/s    gauge   ``network.rated_gbps``, else the port's highest
``peerwatch.nic.link.down_time``    s         counter seconds not up (unknown time not counted)
``peerwatch.nic.link.flaps``        {flap}    counter up -> not-up transitions
``peerwatch.nic.errors.rate``       {error}/s gauge   link and receive error counters per second
``peerwatch.nic.retransmits.rate``  {event}/s gauge   retransmit and transport timeouts per second
``peerwatch.nic.cnp.rate``          {packet}/s gauge  congestion notifications per second
``peerwatch.nic.io.rate``           By/s      gauge   bytes/s, ``network.io.direction`` transmit or
                                                      receive
``peerwatch.nic.xmit_wait.ratio``   1         gauge   share of the span the port could not send
=================================== ========= ======= =============================================

A rate the span cannot give (a reset, a saturated counter, a counter the port lacks) produces no
point: the gauge keeps its previous value rather than a made-up zero.

Bounded: the spans hold at most ``max_series`` ports and the exported series are a
:class:`~peerwatch.exporters.series.SeriesStore` of the same size (both counted).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peerwatch.exporters.otlp import AttrValue, MetricPoint, MetricSpec
from peerwatch.producers.nic.spans import ClosedSpan
from peerwatch.streams.core.network_peers import FEATURES
from peerwatch.streams.core.settings import NetworkSettings

NIC_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("peerwatch.nic.link.up", "1", "gauge",
               "1 while the port is up (IB: ACTIVE and LinkUp; netdev: operstate up), else 0."),
    MetricSpec("peerwatch.nic.link.speed", "Gbit/s", "gauge", "Current link rate, Gb/s."),
    MetricSpec("peerwatch.nic.link.rated_speed", "Gbit/s", "gauge",
               "Rated link rate, Gb/s: network.rated_gbps, else the highest the port has shown."),
    MetricSpec("peerwatch.nic.link.down_time", "s", "counter", "Seconds the port was not up."),
    MetricSpec("peerwatch.nic.link.flaps", "{flap}", "counter", "Up to not-up transitions."),
    MetricSpec("peerwatch.nic.errors.rate", "{error}/s", "gauge",
               "Link and receive error counters per second (symbol, recovery, rcv, discards...)."),
    MetricSpec("peerwatch.nic.retransmits.rate", "{event}/s", "gauge",
               "Retransmits and transport timeouts per second (mlx5 hw_counters)."),
    MetricSpec("peerwatch.nic.cnp.rate", "{packet}/s", "gauge",
               "Congestion notification packets per second (RoCE DCQCN)."),
    MetricSpec("peerwatch.nic.io.rate", "By/s", "gauge",
               "Bytes per second, by network.io.direction (transmit, receive)."),
    MetricSpec("peerwatch.nic.xmit_wait.ratio", "1", "gauge",
               "Share of the span the port had data to send and could not (port_xmit_wait)."),
)  # fmt: skip
#: (metric, network_peers feature, extra attributes) of the rate gauges read off a span.
_FEATURE_GAUGES: tuple[tuple[str, str, Mapping[str, str]], ...] = (
    ("peerwatch.nic.errors.rate", "net_errors", {}),
    ("peerwatch.nic.retransmits.rate", "net_retrans", {}),
    ("peerwatch.nic.cnp.rate", "net_cnp", {}),
    ("peerwatch.nic.io.rate", "net_tx", {"network.io.direction": "transmit"}),
    ("peerwatch.nic.io.rate", "net_rx", {"network.io.direction": "receive"}),
    ("peerwatch.nic.xmit_wait.ratio", "net_wait", {}),
)
_FEATURE = {f.name: f for f in FEATURES}


def series_per_port() -> int:
    """The most series one port exports (the io rate counts twice: transmit and receive): the
    unit of the port part of the cardinality estimate in docs/sizing.md."""
    return len(NIC_METRICS) + 1


def port_attributes(node: str, reading: Mapping[str, Any]) -> dict[str, AttrValue]:
    """The identity attributes of one port of ``node``. Raises KeyError without a port name."""
    name = str(reading["name"])
    attrs: dict[str, AttrValue] = {
        "host.name": node,
        "hw.id": f"{node}/{name}",
        "hw.type": "network",
        "network.interface.name": name,
        "peerwatch.nic.device": str(reading.get("device") or name),
        "peerwatch.nic.kind": str(reading.get("kind") or "UNKNOWN"),
    }
    if reading.get("link_layer"):
        attrs["peerwatch.nic.link_layer"] = str(reading["link_layer"])
    return attrs


def span_points(closed: ClosedSpan, network: NetworkSettings) -> list[MetricPoint]:
    """The metric points of one closed span (see the module table); a value the span cannot
    give produces no point. Raises nothing."""
    attrs = port_attributes(closed.key[0], closed.reading)
    points: list[MetricPoint] = []
    if closed.up is not None:
        points.append(MetricPoint("peerwatch.nic.link.up", float(closed.up), attrs))
    if closed.rate_gbps is not None:
        points.append(MetricPoint("peerwatch.nic.link.speed", closed.rate_gbps, attrs))
    if closed.rated_gbps:
        points.append(MetricPoint("peerwatch.nic.link.rated_speed", closed.rated_gbps, attrs))
    window = closed.window
    points.append(MetricPoint("peerwatch.nic.link.down_time", window.down_s, attrs, "counter"))
    points.append(MetricPoint("peerwatch.nic.link.flaps", float(window.flaps), attrs, "counter"))
    for metric, feature, extra in _FEATURE_GAUGES:
        value = _FEATURE[feature].value(window, network)
        if value is not None:
            points.append(MetricPoint(metric, value, {**attrs, **extra}))
    return points
