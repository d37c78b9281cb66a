"""A tiny HTTP peer on 127.0.0.1 that answers badly on purpose (a real socket, no HTTP library),
for the Alertmanager client's tests and ``scripts/fuzz_inputs.py``.

Each connection gets its request read (headers and a ``Content-Length`` body), then ``answer``
writes whatever it likes to the socket. Answers that would go on for ever (an endless body, one
byte at a time) stop when the client hangs up, when the server stops, or after
:data:`ANSWER_CAP_S` seconds, so a test that fails cannot leave a thread behind for long.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from peerwatch.exporters.alerts import AlertBook

#: No answer goes on longer than this (s): a guard against a hung test, not a tested value.
ANSWER_CAP_S = 30.0

Answer = Callable[[socket.socket, threading.Event], None]


def _read_request(conn: socket.socket) -> None:
    """Read one request (headers, then ``Content-Length`` bytes): the client must not fail on a
    write before it reads the answer under test."""
    conn.settimeout(5.0)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        body += chunk


def send_for_ever(conn: socket.socket, stop: threading.Event, chunk: bytes, pause_s: float) -> int:
    """Send ``chunk`` again and again (``pause_s`` apart) until the client hangs up, ``stop`` is
    set or :data:`ANSWER_CAP_S` passed; returns the bytes sent."""
    sent = 0
    end = time.monotonic() + ANSWER_CAP_S
    while not stop.is_set() and time.monotonic() < end:
        try:
            conn.sendall(chunk)
        except OSError:  # the client gave up: what the tests want
            break
        sent += len(chunk)
        if pause_s:
            stop.wait(pause_s)
    return sent


# -- the hostile answers -----------------------------------------------------------------------
def not_http(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"SSH-2.0-OpenSSH_9.6p1\r\n")


def header_of(size: int) -> Answer:
    """A 200 with one header line of ``size`` bytes (h11, httpx's parser, takes up to 100 KiB;
    urllib refused anything over 64 KiB with an exception that escaped)."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * size + b"\r\nContent-Length: 0\r\n\r\n")

    return answer


def short_body(conn: socket.socket, stop: threading.Event) -> None:
    """Announces 1000 bytes, sends 2, hangs up."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{}")


def endless_body(conn: socket.socket, stop: threading.Event) -> None:
    """A 200 whose body never ends (as fast as the client reads)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    send_for_ever(conn, stop, b"x" * 65536, 0.0)


def trickle(conn: socket.socket, stop: threading.Event) -> None:
    """One byte every 50 ms, for ever: each read gets a byte well within any read timeout."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    send_for_ever(conn, stop, b"a", 0.05)


def accepted(conn: socket.socket, stop: threading.Event) -> None:
    """What Alertmanager answers to a good POST."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


HOSTILE_ANSWERS: dict[str, Answer] = {
    "not HTTP": not_http,
    "header of 1 MiB": header_of(1024 * 1024),
    "short body": short_body,
    "endless body": endless_body,
    "one byte at a time": trickle,
}


class HostileServer:
    """Listens on 127.0.0.1 (a free port) and answers each connection with ``self.answer``
    (settable between requests). Use :func:`serving`."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, name="hostile-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn, self.answer), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket, answer: Answer) -> None:
        with conn:
            try:
                _read_request(conn)
                answer(conn, self._stop)
            except OSError:
                pass  # the client hung up first

    def start(self) -> HostileServer:
        self._accepting.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._accepting.join(5.0)
        self._sock.close()
        for t in self._threads:
            t.join(5.0)


@contextmanager
def serving(answer: Answer) -> Iterator[HostileServer]:
    server = HostileServer(answer).start()
    try:
        yield server
    finally:
        server.stop()


def book_with_one_alert(now_ms: int) -> AlertBook:
    """An alert book holding one firing alert (a CONFIRMED straggler finding at ``now_ms``):
    what the sender under test has to deliver."""
    from peerwatch.exporters.alerts import AlertBook

    book = AlertBook(finding_ttl_ms=3_600_000, resend_ms=60_000, resolved_retention_ms=900_000,
                     max_alerts=100)  # fmt: skip
    book.apply("StragglerFinding", {
        "finding_id": "f1", "job_id": "1001", "node": "gpu00003", "gpu_index": 5,
        "gpu_uuid": None, "status": "CONFIRMED", "window_start_ms": now_ms - 30_000,
        "window_end_ms": now_ms, "features": [], "hard_rules": [], "windows_flagged": 4,
        "windows_considered": 6, "first_flagged_ms": now_ms - 120_000, "peer_group_size": 16,
        "reason": "confirmed slow vs peers", "cause": "THERMAL", "detected_ms": now_ms,
    })  # fmt: skip
    return book
