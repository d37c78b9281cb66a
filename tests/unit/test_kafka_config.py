"""Every confluent-kafka client logs through Python logging; transient retries at DEBUG."""

from __future__ import annotations

import logging
import pickle

import pytest

from peerwatch.kafka_config import (
    LIBRDKAFKA_LOGGER,
    LibrdkafkaLogger,
    RepeatLimiter,
    admin_config,
    client_logger,
    consumer_config,
    is_transient,
    producer_config,
)
from peerwatch.settings import KafkaSettings

FMT = "%s [%s] %s"


def test_every_client_config_carries_the_one_logger() -> None:
    kafka = KafkaSettings()
    for conf in (producer_config(kafka), consumer_config(kafka, "g"), admin_config(kafka)):
        assert conf["logger"] is client_logger()


@pytest.mark.parametrize(
    ("level", "facility", "text", "expected"),
    [
        (logging.WARNING, "GETPID", "[thrd:main]: Coordinator load in progress: retrying",
         logging.DEBUG),
        (logging.WARNING, "CGRPCOORD", "FindCoordinator response error: COORDINATOR_NOT_AVAILABLE",
         logging.DEBUG),
        (logging.INFO, "METADATA", "Topic t partition 0 Leader not available: retrying",
         logging.DEBUG),
        (logging.ERROR, "FAIL", "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: "
         "Connection refused", logging.ERROR),
        (logging.WARNING, "SSL", "certificate verify failed", logging.WARNING),
    ],
)  # fmt: skip
def test_transient_startup_retries_go_to_debug_the_rest_keeps_its_level(
    caplog: pytest.LogCaptureFixture, level: int, facility: str, text: str, expected: int
) -> None:
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER)
    LibrdkafkaLogger().log(level, FMT, facility, "rdkafka#producer-1", text)
    [record] = caplog.records
    assert record.name == LIBRDKAFKA_LOGGER and record.levelno == expected
    assert record.getMessage() == f"{facility} [rdkafka#producer-1] {text}"
    assert is_transient(text) == (expected == logging.DEBUG)


def test_the_logger_survives_pickling_for_spawned_processes() -> None:
    again = pickle.loads(pickle.dumps(LibrdkafkaLogger()))
    assert isinstance(again, LibrdkafkaLogger) and again.logger.name == LIBRDKAFKA_LOGGER


class Ticks:
    def __init__(self) -> None:
        self.s = 0.0

    def __call__(self) -> float:
        return self.s


REFUSED = ("127.0.0.1:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused "
           "(after {}ms in state CONNECT)")  # fmt: skip


def test_a_repeated_client_error_is_logged_once_a_window_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Ticks()
    logger = LibrdkafkaLogger(limiter=RepeatLimiter(window_s=60.0, max_lines=30, clock=clock))
    caplog.set_level(logging.INFO, logger=LIBRDKAFKA_LOGGER)
    for i in range(240):  # four retries a second for a minute, "after Nms" varying
        logger.log(logging.ERROR, FMT, "FAIL", "peerwatch#consumer-1", REFUSED.format(i % 5))
        clock.s += 0.25
    logger.log(logging.ERROR, FMT, "FAIL", "peerwatch#consumer-1", REFUSED.format(0))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0] == "FAIL [peerwatch#consumer-1] " + REFUSED.format(0)
    assert lines[1].endswith("(after 0ms in state CONNECT) (239 more in the last 60 s)")
    assert logger.limiter.suppressed == 239


def test_the_limiter_caps_lines_of_any_kind_per_window() -> None:
    clock = Ticks()
    limiter = RepeatLimiter(window_s=60.0, max_lines=3, clock=clock)
    kinds = ["broker down", "topic gone", "SSL failed", "SASL failed", "bad config"]
    assert [limiter.admit(k) for k in kinds] == ["", "", "", None, None]
    assert limiter.admit("SASL failed") is None  # a repeat, still counted
    clock.s = 60.0
    assert limiter.admit("SASL failed") == " (2 more in the last 60 s)"
    assert limiter.suppressed == 3


def test_debug_lines_are_not_limited(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER)
    logger = LibrdkafkaLogger(limiter=RepeatLimiter(max_lines=1))
    for _ in range(5):
        logger.log(logging.DEBUG, FMT, "CGRP", "c", "joining group")
    assert len(caplog.records) == 5
