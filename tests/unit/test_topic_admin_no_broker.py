"""Topic administration against an address where no broker listens: a ServiceError that says
so, not a bare TimeoutError from a future (librdkafka itself, no broker needed)."""

from __future__ import annotations

import concurrent.futures
import socket

import pytest

from peerwatch.errors import ServiceError
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import _result, ensure_topics
from peerwatch.topics import TOPICS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_no_broker_is_a_service_error_that_names_the_cause() -> None:
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{_free_port()}")
    with pytest.raises(
        ServiceError, match=r"no answer in 1 s \(describe .*broker running|cannot describe"
    ):
        ensure_topics(settings, TOPICS[:1], timeout_s=1.0)


def test_an_unanswered_future_names_the_request() -> None:
    with pytest.raises(ServiceError, match=r"no answer in 0\.01 s \(create t\)"):
        _result(concurrent.futures.Future(), 0.01, "create t")
    done: concurrent.futures.Future[int] = concurrent.futures.Future()
    done.set_result(3)
    assert _result(done, 0.01, "x") == 3
