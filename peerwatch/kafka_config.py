"""The one place where settings become Kafka client configuration (librdkafka and aiokafka).

Every confluent-kafka client gets :func:`client_logger` as its ``logger``: librdkafka's own log
lines (``%4|...|GETPID|... Coordinator load in progress: retrying``) go through Python logging
(logger ``peerwatch.librdkafka``, formatted and filtered like the rest) instead of straight to
stderr, and the transient conditions a client retries by itself while a cluster or a consumer
group starts are logged at DEBUG. Repeated lines are rate limited and summarised in this one
place (:class:`RepeatLimiter`): a client retrying an unreachable broker logs one line a minute
with the count of its retries.
"""

from __future__ import annotations

import logging
import re
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from peerwatch.errors import KafkaAuthError
from peerwatch.settings import KafkaSettings

#: Producer defaults for telemetry: nothing lost, nothing duplicated by retries, keys partitioned
#: exactly as aiokafka/faust do (librdkafka's default CRC32 partitioner would not match murmur2).
PRODUCER_DEFAULTS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 10,
    "compression.type": "lz4",
    "partitioner": "murmur2_random",
}


LIBRDKAFKA_LOGGER = "peerwatch.librdkafka"
#: Substrings (lower case) of librdkafka log lines that report a transient condition the client
#: retries by itself (group coordinator loading or moving, partition leader elections): DEBUG.
TRANSIENT_LOG_TEXT: tuple[str, ...] = (
    "coordinator load in progress",
    "coordinator not available",
    "coordinator_not_available",
    "not coordinator",
    "not_coordinator",
    "leader not available",
    "leader_not_available",
    "rebalance in progress",
)


def is_transient(text: str) -> bool:
    """Whether a librdkafka log line reports a transient condition retried by the client."""
    lowered = text.lower()
    return any(t in lowered for t in TRANSIENT_LOG_TEXT)


#: A client log line said again within this window is counted, not logged (s).
REPEAT_WINDOW_S = 60.0
#: Most client log lines (INFO and above) a process logs per window, whatever they say.
MAX_LINES_PER_WINDOW = 30
#: Distinct lines remembered (the oldest forgotten beyond it): memory stays bounded.
MAX_REMEMBERED_LINES = 1000
_DIGITS = re.compile(r"\d+")


@dataclass
class _Seen:
    since_s: float
    repeats: int = 0


class RepeatLimiter:
    """Rate limit for repeated log lines (pure; ``clock`` is monotonic seconds).

    A line is known by its text with every number blanked (``after 0ms`` and ``after 4ms`` are
    the same line, as are the brokers and clients librdkafka names by number). The first of a
    kind is logged; repeats within ``window_s`` are only counted; the first after the window is
    logged with the count ("... (240 more in the last 60 s)"). Besides, at most ``max_lines``
    lines of any kind are logged per window (the rest counted the same way).
    """

    def __init__(
        self,
        window_s: float = REPEAT_WINDOW_S,
        max_lines: int = MAX_LINES_PER_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.max_lines = max_lines
        self.clock = clock
        self.suppressed = 0
        self._seen: dict[str, _Seen] = {}
        self._window_start_s = -float("inf")
        self._lines = 0
        self._lock = threading.Lock()

    def admit(self, text: str) -> str | None:
        """None: do not log ``text`` (counted); else what to append to it ("" or the count of
        the repeats not logged since this kind was last logged)."""
        key = _DIGITS.sub("#", text)
        with self._lock:
            now = self.clock()
            if now - self._window_start_s >= self.window_s:
                self._window_start_s, self._lines = now, 0
            seen = self._seen.get(key)
            if seen is not None and now - seen.since_s < self.window_s:
                seen.repeats += 1
                self.suppressed += 1
                return None
            if self._lines >= self.max_lines:
                if seen is None:
                    self._remember(key, _Seen(now, 1))
                else:
                    seen.repeats += 1
                self.suppressed += 1
                return None
            self._lines += 1
            suffix = ""
            if seen is not None and seen.repeats:
                suffix = f" ({seen.repeats} more in the last {now - seen.since_s:.0f} s)"
            self._remember(key, _Seen(now))
            return suffix

    def _remember(self, key: str, seen: _Seen) -> None:
        self._seen.pop(key, None)
        self._seen[key] = seen
        if len(self._seen) > MAX_REMEMBERED_LINES:
            del self._seen[next(iter(self._seen))]


class LibrdkafkaLogger:
    """What confluent-kafka calls for each librdkafka log line (``logger`` configuration):
    ``log(level, "%s [%s] %s", facility, client name, message)`` with a Python level. Forwards
    to the ``peerwatch.librdkafka`` logger, transient retries at DEBUG; lines at INFO and above
    go through a :class:`RepeatLimiter` (a broker unreachable for an hour is one line a minute
    per kind of failure, with the count of retries, not thousands)."""

    def __init__(self, name: str = LIBRDKAFKA_LOGGER, limiter: RepeatLimiter | None = None) -> None:
        self.name = name
        self.logger = logging.getLogger(name)
        self.limiter = limiter or RepeatLimiter()

    def log(self, level: int, msg: str, *args: Any) -> None:
        text = str(args[-1]) if args else msg
        if level > logging.DEBUG and is_transient(text):
            level = logging.DEBUG
        if level > logging.DEBUG and self.logger.isEnabledFor(level):
            try:
                line = msg % args if args else msg
            except (TypeError, ValueError):  # not the shape confluent-kafka calls with
                line = f"{msg} {args}"
            suffix = self.limiter.admit(line)
            if suffix is None:
                return
            if suffix:
                msg, args = "%s%s", (line, suffix)
        self.logger.log(level, msg, *args)

    def __reduce__(self) -> tuple[Any, ...]:  # configs cross process boundaries (spawn)
        return (LibrdkafkaLogger, (self.name,))


_CLIENT_LOGGER = LibrdkafkaLogger()


def client_logger() -> LibrdkafkaLogger:
    """The ``logger`` every confluent-kafka client is configured with (see the module doc)."""
    return _CLIENT_LOGGER


#: librdkafka error names of authentication and TLS errors ...
AUTH_ERROR_NAMES = frozenset({"_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED", "_SSL"})
#: ... and the texts (lower case) that make one a refusal retrying cannot cure: the broker
#: refused the credentials, or the TLS handshake failed (a certificate not from the trusted
#: CA). librdkafka also reports a connection lost mid-handshake as _AUTHENTICATION ("SASL
#: authentication error: SaslAuthenticateRequest failed: Local: Broker transport failure"):
#: that one is transient and left to its retries.
REFUSAL_TEXT: tuple[str, ...] = (
    "authentication failed",
    "invalid credentials",
    "certificate verify failed",
    "handshake failed",
)


class AuthGuard:
    """Every confluent-kafka client's default ``error_cb``: on an authentication or TLS error it
    raises :class:`~peerwatch.errors.KafkaAuthError` naming the user and the cause, which
    confluent-kafka re-raises from the client's ``poll``/``consume``/``flush``: the process
    stops with the reason instead of reconnecting forever (librdkafka never gives up on its
    own). Other errors are left to librdkafka's log lines (:class:`LibrdkafkaLogger`)."""

    def __init__(self, user: str | None, mechanism: str | None) -> None:
        self.user = user
        self.mechanism = mechanism

    def __call__(self, err: Any) -> None:
        name, text = str(err.name()), str(err.str())
        if name not in AUTH_ERROR_NAMES or not any(t in text.lower() for t in REFUSAL_TEXT):
            return
        if name == "_SSL":
            raise KafkaAuthError(
                f"TLS handshake with Kafka failed ({text}): is kafka.ssl_ca_location the "
                "CA that signed the broker's certificate?"
            )
        raise KafkaAuthError(
            f"Kafka refused the credentials of user {self.user!r} ({self.mechanism}): "
            f"{text}; check kafka.sasl_username and kafka.sasl_password(_file)"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # configs cross process boundaries (spawn)
        return (AuthGuard, (self.user, self.mechanism))


def _common(settings: KafkaSettings) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "logger": client_logger(),
        "error_cb": AuthGuard(settings.sasl_username, settings.sasl_mechanism),
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": settings.client_id,
        "security.protocol": settings.security_protocol,
    }
    if settings.sasl_mechanism:
        conf["sasl.mechanism"] = settings.sasl_mechanism
    if settings.sasl_username:
        conf["sasl.username"] = settings.sasl_username
    password = settings.password()
    if password:
        conf["sasl.password"] = password
    for key, value in (
        ("ssl.ca.location", settings.ssl_ca_location),
        ("ssl.certificate.location", settings.ssl_certificate_location),
        ("ssl.key.location", settings.ssl_key_location),
    ):
        if value:
            conf[key] = value
    if settings.ssl_key_password:
        conf["ssl.key.password"] = settings.ssl_key_password.reveal()
    conf.update(settings.librdkafka_extra)
    return conf


def producer_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka Producer config: idempotent, acks=all, lz4, murmur2 partitioner."""
    return {**_common(settings), **PRODUCER_DEFAULTS, **overrides}


def consumer_config(settings: KafkaSettings, group_id: str, **overrides: Any) -> dict[str, Any]:
    """confluent-kafka Consumer config; offsets are committed explicitly by the caller."""
    return {
        **_common(settings),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        **overrides,
    }


def admin_config(settings: KafkaSettings) -> dict[str, Any]:
    """confluent-kafka AdminClient config."""
    return _common(settings)


def aiokafka_kwargs(settings: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for aiokafka clients (and so faust) with the same security settings."""
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "client_id": settings.client_id,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=settings.ssl_ca_location)
        if settings.ssl_certificate_location:
            context.load_cert_chain(
                settings.ssl_certificate_location,
                settings.ssl_key_location,
                settings.ssl_key_password.reveal() if settings.ssl_key_password else None,
            )
        kwargs["ssl_context"] = context
    if settings.sasl_mechanism:
        kwargs["sasl_mechanism"] = settings.sasl_mechanism
    if settings.sasl_username:
        kwargs["sasl_plain_username"] = settings.sasl_username
    password = settings.password()
    if password:
        kwargs["sasl_plain_password"] = password
    return kwargs
