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


def test_a_client_pointed_at_a_closed_port_logs_a_bounded_number_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 40 item 8: a consumer retrying a closed port several times a second logs each kind
    of failure once a minute (with the count of retries), not once per retry."""
    import socket
    import time

    from peerwatch.kafka_config import client_logger

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}")
    caplog.set_level(logging.INFO, logger=LIBRDKAFKA_LOGGER)
    before = client_logger().limiter.suppressed
    conf = consumer_config(settings, f"closed-{uuid.uuid4().hex}",
                           **{"reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 50})  # fmt: skip
    consumer = Consumer(conf)
    try:
        consumer.subscribe(["closed-port-test"])
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            consumer.poll(0.2)
    finally:
        consumer.close()
    lines = [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER]
    retries = client_logger().limiter.suppressed - before
    assert any("Connection refused" in r.getMessage() for r in lines)
    assert len(lines) <= 4, [r.getMessage() for r in lines]  # a kind or two, each once
    assert retries >= 10  # the client did retry many times: counted, not logged
