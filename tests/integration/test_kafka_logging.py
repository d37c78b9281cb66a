"""librdkafka's log lines reach Python logging (logger ``peerwatch.librdkafka``) through the
real client, and nothing is written to stderr by librdkafka itself."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka import Consumer

from peerwatch.kafka_config import LIBRDKAFKA_LOGGER, consumer_config
from peerwatch.settings import KafkaSettings


def test_client_logs_go_through_python_logging_not_stderr(
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER)
    # debug=cgrp makes the consumer group code log every step (DEBUG lines, forwarded on poll).
    consumer = Consumer(consumer_config(kafka_settings, f"log-{uuid.uuid4().hex}", debug="cgrp"))
    try:
        consumer.subscribe([topic_prefix + "log-test"])
        consumer.poll(2.0)
    finally:
        consumer.close()
    lines = [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER]
    assert any("CGRP" in r.getMessage() and "#consumer-" in r.getMessage() for r in lines)
    assert {r.levelno for r in lines} == {logging.DEBUG}
    err = capfd.readouterr().err
    assert "|CGRP" not in err and not any(line.startswith("%") for line in err.splitlines())
