"""Counter arithmetic for NIC counters, pure and dependency-free (the agent, the health check and
the stream all import it).

Facts it encodes (Linux ``drivers/infiniband/core/sysfs.c``, the IB PortCounters attribute):

* The legacy PortCounters error counters are narrow and *saturate* (stop at all ones) rather
  than wrap: ``symbol_error`` 16 bits, ``link_error_recovery`` 8, ``link_downed`` 8,
  ``port_rcv_errors`` 16, ``port_rcv_remote_physical_errors`` 16,
  ``port_rcv_switch_relay_errors`` 16, ``port_xmit_discards`` 16,
  ``port_xmit_constraint_errors`` 8, ``port_rcv_constraint_errors`` 8,
  ``local_link_integrity_errors`` 4, ``excessive_buffer_overrun_errors`` 4, ``VL15_dropped`` 16,
  ``port_xmit_wait`` 32. The data and packet counters are 32 bits on an HCA without extended
  counters (they saturate at 2**32 - 1 too) and 64 bits with them; a 64-bit counter that reads
  exactly 2**32 - 1 is vanishingly unlikely, so that value is taken as saturated either way.
* ``port_xmit_data`` / ``port_rcv_data`` count 4-byte words (octets / 4): bytes = value * 4.
* A counter that goes *down* was reset (``perfquery -x``, driver reload, reboot, an mlx5 32-bit
  Q counter wrapping): the new value is the baseline, the reset is counted, the rate is unknown
  for that interval; never a negative rate.
* netdev ``statistics/`` and ``hw_counters/`` are 64-bit kernel counters: no saturation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Width in bits of the IB PortCounters fields that saturate (kernel sysfs.c, PortCounters).
IB_COUNTER_BITS: Mapping[str, int] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
    "port_xmit_data": 32,
    "port_rcv_data": 32,
    "port_xmit_packets": 32,
    "port_rcv_packets": 32,
}

#: Counters in 4-byte words: multiply by this for bytes.
WORD_COUNTERS: Mapping[str, int] = {"port_xmit_data": 4, "port_rcv_data": 4}

#: Every IB ``counters/`` file the agent reads.
IB_COUNTERS: tuple[str, ...] = tuple(IB_COUNTER_BITS)

#: ``hw_counters/`` files the agent reads where present (mlx5 names).
HW_COUNTERS: tuple[str, ...] = (
    "rnr_nak_retry_err",
    "local_ack_timeout_err",
    "out_of_sequence",
    "packet_seq_err",
    "roce_slow_restart",
    "roce_adp_retrans",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "rp_cnp_handled",
    "out_of_buffer",
    "implied_nak_seq_err",
    "req_cqe_error",
    "resp_cqe_error",
)

#: netdev ``statistics/`` files the agent reads (``carrier_changes`` is read beside them).
NETDEV_COUNTERS: tuple[str, ...] = (
    "rx_crc_errors",
    "rx_errors",
    "tx_errors",
    "rx_missed_errors",
    "rx_dropped",
    "tx_dropped",
    "rx_bytes",
    "tx_bytes",
)


def saturation_value(name: str) -> int | None:
    """The value at which IB counter ``name`` stops (all ones), or None for a counter that does
    not saturate (netdev statistics, hw_counters, names not in ``IB_COUNTER_BITS``)."""
    bits = IB_COUNTER_BITS.get(name)
    return None if bits is None else (1 << bits) - 1


@dataclass(frozen=True)
class CounterDelta:
    """One counter between two readings.

    ``delta`` is in the counter's own unit (bytes for the ``*_data`` word counters), ``rate_per_s``
    the delta over the elapsed seconds; both None when no rate can be had: ``reset`` (the value
    went down: new baseline), ``saturated`` (the newer value is at the counter's maximum, so the
    true increase is unknown), or a missing value or a non-positive interval.
    """

    delta: int | None
    rate_per_s: float | None
    reset: bool = False
    saturated: bool = False


def counter_delta(
    name: str, previous: int | None, current: int | None, elapsed_s: float
) -> CounterDelta:
    """The change of counter ``name`` from ``previous`` to ``current`` over ``elapsed_s`` seconds.

    Never a negative delta: a decrease is a reset. A counter already saturated before and still at
    its maximum is saturated (delta unknown, not zero). Raises nothing.
    """
    if previous is None or current is None:
        return CounterDelta(None, None)
    top = saturation_value(name)
    # Exactly at the top, not above it: a counter the HCA extends to 64 bits (the data, packet and
    # wait counters) reads past 2**32 - 1 and counts on.
    saturated = top is not None and current == top
    if current < previous:
        return CounterDelta(None, None, reset=True, saturated=saturated)
    if saturated:
        return CounterDelta(None, None, saturated=True)
    delta = (current - previous) * WORD_COUNTERS.get(name, 1)
    rate = delta / elapsed_s if elapsed_s > 0 else None
    return CounterDelta(delta, rate)


@dataclass
class CounterTracker:
    """Keeps the last reading of each (port, counter) and turns each new reading into deltas.

    Feed it one port's counters per tick with :meth:`update`; it counts resets and saturations
    (``resets``, ``saturations``) so a caller can publish them. A missing value (null read) keeps
    the previous baseline, so the next good reading spans the gap.
    """

    last: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    resets: int = 0
    saturations: int = 0

    def update(
        self, port: str, ts_ms: int, counters: Mapping[str, int | None]
    ) -> dict[str, CounterDelta]:
        """Deltas of ``counters`` (name -> raw value) of ``port`` at ``ts_ms`` against the
        previous reading of each counter; a counter seen for the first time gives no entry."""
        out: dict[str, CounterDelta] = {}
        for name, value in counters.items():
            if value is None:
                continue
            key = (port, name)
            before = self.last.get(key)
            self.last[key] = (ts_ms, value)
            if before is None:
                continue
            delta = counter_delta(name, before[1], value, (ts_ms - before[0]) / 1000)
            self.resets += delta.reset
            self.saturations += delta.saturated
            out[name] = delta
        return out


@dataclass(frozen=True)
class Downtime:
    """A port's link over a window: seconds not up, seconds unknown (no readings), and flaps
    (up -> not-up transitions)."""

    down_s: float
    unknown_s: float
    flaps: int


def downtime(
    readings: Iterable[tuple[int, bool | None]],
    start_ms: int,
    end_ms: int,
    max_gap_ms: int,
) -> Downtime:
    """Seconds the port was not up in ``[start_ms, end_ms)``, from ``(ts_ms, up)`` readings in
    time order (``up`` None: state unreadable).

    Each reading's state holds until the next reading, for at most ``max_gap_ms`` (e.g. two
    sampling intervals): time past that, time before the first reading and time of an unreadable
    state is *unknown*, never counted as down or up (a missing tick is not an outage). A flap is
    a transition from up to not up between consecutive readings inside the window (a reading
    before ``start_ms`` sets the initial state). Raises ValueError when ``end_ms < start_ms``.
    """
    if end_ms < start_ms:
        raise ValueError(f"window ends before it starts: {start_ms}..{end_ms}")
    down_ms = 0
    known_ms = 0
    flaps = 0
    prev: tuple[int, bool | None] | None = None
    points = sorted(readings, key=lambda r: r[0])
    for i, (ts, up) in enumerate(points):
        if prev is not None and prev[1] is True and up is False and start_ms <= ts < end_ms:
            flaps += 1
        nxt = points[i + 1][0] if i + 1 < len(points) else end_ms
        hold_end = min(nxt, ts + max_gap_ms, end_ms)
        lo = max(ts, start_ms)
        if hold_end > lo and up is not None:
            known_ms += hold_end - lo
            if not up:
                down_ms += hold_end - lo
        if up is not None:
            prev = (ts, up)
    total_ms = end_ms - start_ms
    return Downtime(down_ms / 1000, (total_ms - known_ms) / 1000, flaps)
