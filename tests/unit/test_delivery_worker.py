"""The delivery worker never dies unseen (issue 12 item 7): an error in it is logged, counted and
the worker restarted; a worker gone for good makes ``send`` raise once the bounded queue is full,
and memory stays bounded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from peerwatch.errors import ServiceError
from peerwatch.producers.delivery import Delivery, DeliverySettings
from peerwatch.settings import KafkaSettings

KAFKA = KafkaSettings(bootstrap_servers="127.0.0.1:1")  # nothing listens: no broker needed


def wait_for(cond: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_worker_that_cannot_survive_makes_send_raise(tmp_path: Path) -> None:
    def factory(config: dict[str, Any]) -> Any:
        raise SystemExit("gone")  # not an Exception: the worker cannot go on

    delivery = Delivery(KAFKA, DeliverySettings(tmp_path / "spool", queue_max_records=5),
                        producer_factory=factory).start()  # fmt: skip
    wait_for(lambda: not delivery.worker_alive)
    for i in range(5):  # the bounded queue takes these
        delivery.send("t", b"k", b"v%d" % i)
    with pytest.raises(ServiceError, match="delivery worker stopped"):
        delivery.send("t", b"k", b"too many")
    stats = delivery.close(1.0)  # returns although the queue is full and nobody reads it
    assert stats.worker_errors == 1 and delivery.last_error == "SystemExit: gone"


def test_a_spool_that_cannot_open_is_retried_and_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "spool"
    blocked.write_text("a file where the spool directory should be")
    delivery = Delivery(KAFKA, DeliverySettings(blocked, queue_max_records=3)).start()
    try:
        wait_for(lambda: delivery.stats.worker_errors >= 2)
        assert delivery.worker_alive and delivery.stats.worker_restarts >= 1
        assert delivery.last_error is not None and "spool" in delivery.last_error
        assert "the delivery worker failed; restarting" in caplog.text
        for i in range(10):  # queue 3 + overflow 3, then counted drops: memory stays bounded
            delivery.send("t", b"k", b"v%d" % i)
        assert delivery.stats.dropped_in_memory == 4
        blocked.unlink()  # the disk is back: the worker opens the spool at its next restart
        wait_for(lambda: delivery.stats.sent == 3, 60)  # the queued three taken up
    finally:
        stats = delivery.close(1.0)
    # No broker: what the worker held went to the spool at close; only the counted drops lost.
    assert stats.dropped == 4 and delivery.spooled_records == 6


def test_spooling_lasts_as_long_as_the_outage(tmp_path: Path) -> None:
    # librdkafka reports "all brokers down" once per outage. Delivery must not go back to
    # librdkafka's memory queue while the broker still does not answer, even when nothing was
    # waiting at the retry: a record sent minutes into the outage is as durable as the first.
    delivery = Delivery(KAFKA, DeliverySettings(tmp_path / "spool", retry_interval_s=0.05)).start()
    try:
        wait_for(lambda: delivery.spooling)  # reported before anything was sent
        time.sleep(0.5)  # several retries with an empty spool: the broker still does not answer
        assert delivery.spooling
        delivery.send("t", b"k", b"late")
        wait_for(lambda: delivery.spooled_records == 1)
    finally:
        stats = delivery.close(1.0)
    assert stats.dropped == 0 and delivery.spooled_records == 1


def test_close_logs_one_readable_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 40 item 12: the worker's shutdown ran twice, logging two raw ``DeliveryStats(...)``
    lines per health run into slurmd's log."""
    caplog.set_level("INFO", logger="peerwatch.producers.delivery")
    delivery = Delivery(KAFKA, DeliverySettings(tmp_path / "spool")).start()
    delivery.send("t", b"k", b"v")
    delivery.close(0.5)
    closed = [r.getMessage() for r in caplog.records if "delivery closed" in r.getMessage()]
    assert closed == ["delivery closed: 1 sent, 0 delivered, 1 spooled, 1 failed attempts; "
                      "the spool holds 1"]  # fmt: skip


def test_delivery_stats_summary_names_what_is_not_zero() -> None:
    from peerwatch.producers.delivery import DeliveryStats

    assert DeliveryStats(sent=1, delivered=3, replayed=2).summary() == (
        "1 sent, 3 delivered (2 from the spool)"
    )
    assert DeliveryStats(sent=2, spooled=2, dropped=1, worker_errors=1).summary() == (
        "2 sent, 0 delivered, 2 spooled, 1 dropped, 1 worker errors"
    )
