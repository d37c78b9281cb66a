"""The Alertmanager sender against a hostile HTTP peer on 127.0.0.1 (a real socket, see
tests/hostile_http.py): whatever the peer answers, ``AlertSender.tick`` returns, counts a
failure, keeps the alert and backs off; once a real answer comes, the alert is sent."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fakes import FakeClock
from hostile_http import (
    HOSTILE_ANSWERS,
    Answer,
    accepted,
    book_with_one_alert,
    header_of,
    serving,
)

from peerwatch.errors import ServiceError
from peerwatch.exporters.alertmanager import MAX_ANSWER_BYTES, AlertmanagerClient, AlertSender

#: Guards against a hang only (a tick that never returns): never a measured bound.
HANG_GUARD_S = 60.0


def _in_thread(fn: Any) -> Any:
    """``fn()`` in a thread joined with the hang guard: a hang fails the test, not the suite."""
    out: list[Any] = []

    def call() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test below
            out.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(HANG_GUARD_S)
    assert not t.is_alive(), "hung"
    return out[0]


@pytest.mark.parametrize("name", sorted(HOSTILE_ANSWERS))
def test_a_hostile_answer_is_a_retried_failure_not_a_crash(name: str) -> None:
    clock = FakeClock()
    book = book_with_one_alert(clock.now_ms())
    with serving(HOSTILE_ANSWERS[name]) as server:
        sender = AlertSender(book, AlertmanagerClient(server.url, 1.0), retry_max_s=8.0,
                             clock=clock)  # fmt: skip
        assert _in_thread(sender.tick) == 0
        assert sender.stats.failures == 1 and sender.stats.alerts_sent == 0
        assert len(book.due(clock.now_ms())) == 1  # kept for the retry
        assert _in_thread(sender.tick) == 0 and server.connections == 1  # backing off
        server.answer = accepted  # the peer becomes a working Alertmanager
        clock.ms += 500
        assert _in_thread(sender.tick) == 1
        assert server.connections == 2 and sender.stats.failures == 1


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("not HTTP", "unreachable: RemoteProtocolError"),
        ("header of 1 MiB", "unreachable: RemoteProtocolError"),
        ("short body", "unreachable: RemoteProtocolError"),
        ("endless body", f"more than {MAX_ANSWER_BYTES} bytes"),
        ("one byte at a time", "no complete answer within 1 s"),
    ],
)
def test_the_client_names_what_was_wrong_with_the_answer(name: str, message: str) -> None:
    with serving(HOSTILE_ANSWERS[name]) as server:
        client = AlertmanagerClient(server.url, 1.0)
        error = _in_thread(lambda: client.post_alerts([{"labels": {"alertname": "x"}}]))
    assert isinstance(error, ServiceError)
    assert message in str(error)


def test_a_header_over_64_kib_within_the_parser_limit_is_an_answer_not_a_crash() -> None:
    with serving(header_of(70 * 1024)) as server:
        client = AlertmanagerClient(server.url, 1.0)
        assert _in_thread(lambda: client.post_alerts([])) is None


def test_a_request_deadline_holds_against_a_trickling_peer_with_a_long_read_timeout() -> None:
    """Each byte arrives 50 ms after the last, far within a per-read timeout: only the deadline
    of the whole request ends it (several times the read would otherwise take for ever)."""
    answers: list[Answer] = [HOSTILE_ANSWERS["one byte at a time"]]
    with serving(answers[0]) as server:
        client = AlertmanagerClient(server.url, 0.5)
        for _ in range(3):
            error = _in_thread(lambda: client.post_alerts([]))
            assert isinstance(error, ServiceError) and "within 0.5 s" in str(error)
        assert server.connections == 3


def test_the_fuzz_target_holds_on_seeded_hostile_peers() -> None:
    """scripts/fuzz_inputs.py's alertmanager target (make fuzz runs it for longer): seeded
    hostile answers, each held."""
    import importlib.util
    import pathlib
    import sys

    script = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "fuzz_inputs.py"
    spec = importlib.util.spec_from_file_location("fuzz_inputs_am", script)
    assert spec is not None and spec.loader is not None
    fz = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_inputs_am"] = fz
    try:
        spec.loader.exec_module(fz)
        result = fz.run(None, seed=12, targets=["alertmanager"], inputs=40)
    finally:
        sys.modules.pop("fuzz_inputs_am", None)
    assert result.failures == [] and result.inputs == {"alertmanager": 40}
