"""One settings object per process: environment ``PEERWATCH_*`` > config file > defaults.

The catalogue of every setting and its environment variable is ``ENV_VARS`` below and
``docs/configuration.md``. Secrets are held in :class:`Secret` so they never reach a log line.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from peerwatch.errors import ConfigError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")


class Secret:
    """A string that prints as ``'**********'``; call :meth:`reveal` at the one place it is used."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('**********')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True)
class KafkaSettings:
    """How every peerwatch process reaches Kafka. TLS/SASL settings pass through to all clients."""

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "peerwatch"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: Secret | None = None
    schema_registry_url: str | None = None
    #: Extra librdkafka properties for confluent-kafka clients (e.g. ``{"socket.keepalive.enable": "true"}``).
    librdkafka_extra: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> KafkaSettings:
        """Return self, or raise :class:`ConfigError` naming the field at fault."""
        if not self.bootstrap_servers.strip():
            raise ConfigError("kafka.bootstrap_servers", "must not be empty")
        for hostport in self.bootstrap_servers.split(","):
            host, sep, port = hostport.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(
                    "kafka.bootstrap_servers", f"{hostport!r} is not host:port (comma-separated)"
                )
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                "kafka.security_protocol",
                f"{self.security_protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}",
            )
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise ConfigError(
                    "kafka.sasl_mechanism",
                    f"{self.sasl_mechanism!r} is required with {self.security_protocol} and must be "
                    f"one of {', '.join(SASL_MECHANISMS)}",
                )
            if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
                self.sasl_username and self.sasl_password
            ):
                raise ConfigError(
                    "kafka.sasl_username",
                    f"sasl_username and sasl_password are required with {self.sasl_mechanism}",
                )
        return self


@dataclass(frozen=True)
class Settings:
    """Everything a peerwatch process is configured with."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    #: Where the on-disk spool of undeliverable records lives.
    spool_dir: str = "~/.local/state/peerwatch/spool"
    #: Where downloads (Kafka jars, the collector) are cached, outside any repository.
    cache_dir: str = "~/.cache/peerwatch"
    #: Where local services keep their data and logs.
    state_dir: str = "~/.local/state/peerwatch"
    #: Prepended to every topic name of the catalogue (isolates tests, tenants or environments).
    topic_prefix: str = ""


#: Environment variable -> (section, field). The documented catalogue of every variable.
ENV_VARS: dict[str, tuple[str, str]] = {
    "PEERWATCH_KAFKA_BOOTSTRAP": ("kafka", "bootstrap_servers"),
    "PEERWATCH_KAFKA_CLIENT_ID": ("kafka", "client_id"),
    "PEERWATCH_KAFKA_SECURITY_PROTOCOL": ("kafka", "security_protocol"),
    "PEERWATCH_KAFKA_SASL_MECHANISM": ("kafka", "sasl_mechanism"),
    "PEERWATCH_KAFKA_SASL_USERNAME": ("kafka", "sasl_username"),
    "PEERWATCH_KAFKA_SASL_PASSWORD": ("kafka", "sasl_password"),
    "PEERWATCH_KAFKA_SSL_CA_LOCATION": ("kafka", "ssl_ca_location"),
    "PEERWATCH_KAFKA_SSL_CERTIFICATE_LOCATION": ("kafka", "ssl_certificate_location"),
    "PEERWATCH_KAFKA_SSL_KEY_LOCATION": ("kafka", "ssl_key_location"),
    "PEERWATCH_KAFKA_SSL_KEY_PASSWORD": ("kafka", "ssl_key_password"),
    "PEERWATCH_SCHEMA_REGISTRY_URL": ("kafka", "schema_registry_url"),
    "PEERWATCH_SPOOL_DIR": ("", "spool_dir"),
    "PEERWATCH_CACHE_DIR": ("", "cache_dir"),
    "PEERWATCH_STATE_DIR": ("", "state_dir"),
    "PEERWATCH_TOPIC_PREFIX": ("", "topic_prefix"),
}
CONFIG_FILE_ENV = "PEERWATCH_CONFIG"
_SECRETS = {"sasl_password", "ssl_key_password"}


def _convert(section: str, name: str, value: Any) -> Any:
    where = f"{section}.{name}" if section else name
    if name == "librdkafka_extra":
        if not isinstance(value, Mapping):
            raise ConfigError(where, "must be a table of librdkafka property = string")
        return {str(k): str(v) for k, v in value.items()}
    if not isinstance(value, str):
        raise ConfigError(where, f"must be a string, got {type(value).__name__}")
    return Secret(value) if name in _SECRETS else value


def _apply(obj: Any, section: str, values: Mapping[str, Any]) -> Any:
    known = {f.name for f in fields(obj)}
    changes = {}
    for name, value in values.items():
        if name not in known:
            where = f"{section}.{name}" if section else name
            raise ConfigError(where, "unknown setting")
        changes[name] = _convert(section, name, value)
    return replace(obj, **changes)


def load_settings(
    config_file: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    """Build the process settings: env ``PEERWATCH_*`` > TOML config file > defaults.

    The config file is ``config_file`` or ``$PEERWATCH_CONFIG``; its ``[kafka]`` table holds the Kafka
    fields, top-level keys the others. Raises :class:`ConfigError` naming the field at fault.
    """
    env = os.environ if env is None else env
    path = config_file or env.get(CONFIG_FILE_ENV)
    file_values: dict[str, Any] = {}
    if path:
        try:
            file_values = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(CONFIG_FILE_ENV, f"cannot read {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(CONFIG_FILE_ENV, f"{path} is not valid TOML: {exc}") from exc
    kafka_values = file_values.pop("kafka", {})
    if not isinstance(kafka_values, Mapping):
        raise ConfigError("kafka", "must be a table")
    env_kafka: dict[str, str] = {}
    env_top: dict[str, str] = {}
    for var, (section, name) in ENV_VARS.items():
        if env.get(var):
            (env_kafka if section == "kafka" else env_top)[name] = env[var]
    kafka = _apply(KafkaSettings(), "kafka", {**kafka_values, **env_kafka}).validate()
    settings: Settings = _apply(Settings(kafka=kafka), "", {**file_values, **env_top})
    return settings


def expand(path: str) -> Path:
    """A settings path with ``~`` and environment variables expanded."""
    return Path(os.path.expandvars(os.path.expanduser(path)))
