"""Every confluent-kafka client logs through Python logging; transient retries at DEBUG."""

from __future__ import annotations

import logging
import pickle

import pytest

from peerwatch.kafka_config import (
    LIBRDKAFKA_LOGGER,
    LibrdkafkaLogger,
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
    client_logger().log(level, FMT, facility, "rdkafka#producer-1", text)
    [record] = caplog.records
    assert record.name == LIBRDKAFKA_LOGGER and record.levelno == expected
    assert record.getMessage() == f"{facility} [rdkafka#producer-1] {text}"
    assert is_transient(text) == (expected == logging.DEBUG)


def test_the_logger_survives_pickling_for_spawned_processes() -> None:
    again = pickle.loads(pickle.dumps(LibrdkafkaLogger()))
    assert isinstance(again, LibrdkafkaLogger) and again.logger.name == LIBRDKAFKA_LOGGER
