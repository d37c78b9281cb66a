"""The settings tree: one object per process, from defaults < config file < environment.

Tables (each a frozen dataclass that validates itself, :mod:`peerwatch.settings_base`):

``[kafka]`` :class:`KafkaSettings` · ``[stream]`` :class:`~peerwatch.streams.core.settings.StreamSettings`
· ``[detector]`` :class:`~peerwatch.streams.core.settings.DetectorSettings` · ``[policy]``
:class:`~peerwatch.streams.core.settings.PolicySettings` · ``[drain]``
:class:`~peerwatch.exporters.drain.config.DrainSettings` · ``[export]`` :class:`ExportSettings` ·
``[alertmanager]`` :class:`AlertmanagerSettings` · ``[agent]`` :class:`AgentSettings` ·
``[telemetry]`` :class:`TelemetrySettings` · ``[signing]``
:class:`~peerwatch.signing.SigningSettings`; the paths shared by every process are top-level keys.

The config file is TOML (``--config FILE`` or ``$PEERWATCH_CONFIG``). Environment names are
derived from the fields: ``PEERWATCH_<TABLE>_<FIELD>`` (``PEERWATCH_<FIELD>`` for top-level keys),
plus the documented short names of :data:`ENV_ALIASES`. Unknown tables and keys are refused by
name; a bad value raises :class:`~peerwatch.errors.ConfigError` naming ``<table>.<field>``.
:func:`to_toml` prints the tree (secrets omitted), :func:`reference` documents it.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from peerwatch.errors import ConfigError
from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.settings_base import (
    Secret,
    check_one_of,
    check_types,
    conform,
    from_mapping,
    hints,
    parse_text,
    setting,
)
from peerwatch.signing import SigningSettings
from peerwatch.streams.core.settings import (
    DetectorSettings,
    NetworkSettings,
    PolicySettings,
    StreamSettings,
)

__all__ = [
    "AlertmanagerSettings",
    "KafkaSettings",
    "Secret",
    "Settings",
    "expand",
    "load_settings",
    "with_overrides",
]

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
OTLP_PROTOCOLS = ("grpc", "http")
DAY_S = 86400


@dataclass(frozen=True)
class KafkaSettings:
    """``[kafka]``: how every peerwatch process reaches Kafka. TLS/SASL settings pass through to
    every client (:mod:`peerwatch.kafka_config`)."""

    bootstrap_servers: str = setting("127.0.0.1:9092", "host:port of the brokers, comma-separated")
    client_id: str = setting("peerwatch", "client id the brokers see")
    security_protocol: str = setting("PLAINTEXT", "one of " + ", ".join(SECURITY_PROTOCOLS))
    sasl_mechanism: str | None = setting(None, "one of " + ", ".join(SASL_MECHANISMS))
    sasl_username: str | None = setting(None, "SASL user")
    sasl_password: Secret | None = setting(None, "SASL password (secret)")
    sasl_password_file: str | None = setting(
        None,
        "file holding the SASL password (e.g. a systemd credential, "
        "$CREDENTIALS_DIRECTORY/kafka-password); read when a client is made; wins over "
        "sasl_password",
    )
    ssl_ca_location: str | None = setting(None, "CA bundle file (PEM)")
    ssl_certificate_location: str | None = setting(None, "client certificate file (PEM)")
    ssl_key_location: str | None = setting(None, "client key file (PEM)")
    ssl_key_password: Secret | None = setting(None, "client key password (secret)")
    schema_registry_url: str | None = setting(
        None, "Confluent schema registry; unset = single-object encoding"
    )
    librdkafka_extra: Mapping[str, str] = setting(
        {}, "extra librdkafka properties for confluent-kafka clients"
    )

    def __post_init__(self) -> None:
        t = "kafka"
        check_types(self, t)
        if not self.bootstrap_servers.strip():
            raise ConfigError(f"{t}.bootstrap_servers", "must not be empty")
        for hostport in self.bootstrap_servers.split(","):
            host, sep, port = hostport.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ConfigError(
                    f"{t}.bootstrap_servers", f"{hostport!r} is not host:port (comma-separated)"
                )
        check_one_of(self, t, "security_protocol", SECURITY_PROTOCOLS)
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise ConfigError(
                    f"{t}.sasl_mechanism",
                    f"{self.sasl_mechanism!r} is required with {self.security_protocol} and must "
                    f"be one of {', '.join(SASL_MECHANISMS)}",
                )
            if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
                self.sasl_username and (self.sasl_password or self.sasl_password_file)
            ):
                raise ConfigError(
                    f"{t}.sasl_username",
                    f"sasl_username and sasl_password (or sasl_password_file) are required with "
                    f"{self.sasl_mechanism}",
                )

    def password(self) -> str | None:
        """The SASL password: ``sasl_password_file``'s content (trailing newline dropped) or
        ``sasl_password``. Call it where a client is configured, never to print. Raises
        ConfigError naming ``kafka.sasl_password_file`` when the file cannot be read or is
        empty."""
        if self.sasl_password_file:
            path = os.path.expandvars(os.path.expanduser(self.sasl_password_file))
            try:
                text = Path(path).read_text().rstrip("\r\n")
            except OSError as exc:
                raise ConfigError(
                    "kafka.sasl_password_file", f"cannot read {path}: {exc.strerror}"
                ) from exc
            if not text:
                raise ConfigError("kafka.sasl_password_file", f"{path} is empty")
            return text
        return self.sasl_password.reveal() if self.sasl_password else None


@dataclass(frozen=True)
class ExportSettings:
    """``[export]``: the OTLP exporter (``peerwatch export otlp``): the collector and the
    exporter's bounds."""

    endpoint: str = setting("http://127.0.0.1:4317", "collector URL (http:// or https://)")
    protocol: str = setting("grpc", "OTLP transport: grpc or http")
    interval_s: float = setting(10.0, "metric export interval (s)", lo=0.001, hi=3600)
    timeout_s: float = setting(10.0, "timeout of one export (s)", lo=0.01, hi=600)
    max_series: int = setting(
        100_000, "most metric series held; the oldest are dropped beyond", lo=1, hi=100000000
    )
    stale_after_s: float = setting(
        900.0, "a series not updated this long is dropped (s)", lo=0.01, hi=30 * DAY_S
    )
    max_queued_events: int = setting(2048, "most log events queued for export", lo=1, hi=10000000)
    event_batch_size: int = setting(512, "log events per export batch", lo=1, hi=10000000)
    event_delay_s: float = setting(
        1.0, "longest wait before a log batch is exported (s)", lo=0.001, hi=3600
    )

    def __post_init__(self) -> None:
        t = "export"
        check_types(self, t)
        check_one_of(self, t, "protocol", OTLP_PROTOCOLS)
        if not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"{t}.endpoint", f"{self.endpoint!r} must start with http(s)://")
        if self.event_batch_size > self.max_queued_events:
            raise ConfigError(f"{t}.event_batch_size", "must not exceed max_queued_events")


@dataclass(frozen=True)
class AlertmanagerSettings:
    """``[alertmanager]``: ``peerwatch export alertmanager`` (findings and recommendations as
    alerts through Alertmanager's v2 API) and the local Alertmanager of ``peerwatch
    alertmanager start``."""

    url: str = setting("http://127.0.0.1:9093", "Alertmanager base URL (http:// or https://)")
    timeout_s: float = setting(
        5.0,
        "deadline of one whole POST to Alertmanager, connect to last byte (s; it blocks the "
        "exporter's consume loop)",
        lo=0.01,
        hi=60,
    )
    resend_s: float = setting(
        60.0, "active alerts are re-sent this often (Prometheus resend_delay)", lo=0.01, hi=DAY_S
    )
    retry_max_s: float = setting(
        60.0, "longest wait between retries while Alertmanager fails (s)", lo=0.01, hi=DAY_S
    )
    resolved_retention_s: float = setting(
        900.0,
        "resolved alerts are re-sent for this long after they end (s)",
        lo=0.01,
        hi=30 * DAY_S,
    )
    finding_ttl_s: float = setting(
        3600.0,
        "a finding's alert ends this long after its last CONFIRMED heartbeat (s)",
        lo=0.01,
        hi=30 * DAY_S,
    )
    lookback_s: float = setting(
        7 * 86400.0,
        "on start, the topics are replayed from this far back to rebuild the alerts",
        lo=0.01,
        hi=365 * DAY_S,
    )
    max_alerts: int = setting(
        10_000, "most alerts held; new ones beyond are counted and dropped", lo=1, hi=10000000
    )
    port: int = setting(
        9093, "`peerwatch alertmanager start`: listen port on 127.0.0.1", lo=1, hi=65535
    )

    def __post_init__(self) -> None:
        t = "alertmanager"
        check_types(self, t)
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"{t}.url", f"{self.url!r} must start with http(s)://")


@dataclass(frozen=True)
class TelemetrySettings:
    """``[telemetry]``: peerwatch's own metrics (stream worker, agent, archiver, drain
    controller: lag, rates, dead letters, spool...) over OTLP to a collector; off when
    ``endpoint`` is empty."""

    endpoint: str = setting("", "collector URL for peerwatch's own metrics; empty: not exported")
    protocol: str = setting("grpc", "OTLP transport: grpc or http")
    interval_s: float = setting(15.0, "export interval (s)", lo=0.001, hi=3600)
    timeout_s: float = setting(10.0, "timeout of one export (s)", lo=0.01, hi=600)

    def __post_init__(self) -> None:
        t = "telemetry"
        check_types(self, t)
        check_one_of(self, t, "protocol", OTLP_PROTOCOLS)
        if self.endpoint and not self.endpoint.startswith(("http://", "https://")):
            raise ConfigError(f"{t}.endpoint", f"{self.endpoint!r} must start with http(s)://")


@dataclass(frozen=True)
class AgentSettings:
    """``[agent]``: the per-node GPU agent (``peerwatch agent``)."""

    interval_s: float = setting(1.0, "sampling interval (s)", lo=0.001, hi=3600)
    allow_no_gpu: bool = setting(
        False, "without NVML, publish records with no GPUs instead of exiting 2"
    )
    xid_state: str | None = setting(
        None, "also append each XID to this JSON-lines file (read by `peerwatch health`)"
    )
    energy_interval_s: float = setting(
        1.0,
        "read each GPU's energy counter at most this often (s; on the wall-clock grid; at most "
        "once a tick): the costliest NVML read of a tick (3.2 ms of CPU per GPU on an H200); "
        "between reads energy_mj is null and the next delta spans the interval",
        lo=0.001,
        hi=3600,
    )
    nic: bool = setting(
        True, "also publish the node's NIC ports (NodeNicSample on peerwatch.nic.samples) each tick"
    )
    sysfs_root: str = setting(
        "/sys", "root of the sysfs tree the NIC ports are read from (a recorded tree in tests)"
    )
    nic_ports: tuple[str, ...] = setting(
        (),
        "NIC ports to sample (mlx5_0/1, eth0); empty: every port that is up when the agent starts",
    )

    def __post_init__(self) -> None:
        # interval_s >= 1 ms (its range): the agent's tick is whole milliseconds.
        check_types(self, "agent")


@dataclass(frozen=True)
class Settings:
    """Everything a peerwatch process is configured with: the top-level paths and the tables."""

    spool_dir: str = setting(
        "~/.local/state/peerwatch/spool", "where undeliverable records are spooled"
    )
    cache_dir: str = setting(
        "~/.cache/peerwatch", "downloads (Kafka, the collector), outside any repository"
    )
    state_dir: str = setting("~/.local/state/peerwatch", "data and logs of local services")
    topic_prefix: str = setting(
        "", "prepended to every topic name (isolates tests, tenants or environments)"
    )
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    stream: StreamSettings = field(default_factory=StreamSettings)
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    drain: DrainSettings = field(default_factory=DrainSettings)
    export: ExportSettings = field(default_factory=ExportSettings)
    alertmanager: AlertmanagerSettings = field(default_factory=AlertmanagerSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    signing: SigningSettings = field(default_factory=SigningSettings)

    def __post_init__(self) -> None:
        for name in ROOT_KEYS:
            conform(str, getattr(self, name), name)


#: Table name -> its class, in the order of the printed tree.
TABLES: dict[str, type] = {
    "kafka": KafkaSettings,
    "stream": StreamSettings,
    "detector": DetectorSettings,
    "policy": PolicySettings,
    "network": NetworkSettings,
    "drain": DrainSettings,
    "export": ExportSettings,
    "alertmanager": AlertmanagerSettings,
    "agent": AgentSettings,
    "telemetry": TelemetrySettings,
    "signing": SigningSettings,
}
ROOT_KEYS = ("spool_dir", "cache_dir", "state_dir", "topic_prefix")
CONFIG_FILE_ENV = "PEERWATCH_CONFIG"
#: The flat drain-controller file of earlier releases; its keys are the ``[drain]`` table's.
DRAIN_FILE_ENV = "PEERWATCH_DRAIN_CONFIG"
#: Largest config file read: the full tree printed by `peerwatch config` is about 20 KB.
MAX_CONFIG_BYTES = 1 << 20
#: Documented short names kept working; the derived name wins when both are set.
ENV_ALIASES: dict[str, str] = {
    "PEERWATCH_KAFKA_BOOTSTRAP": "kafka.bootstrap_servers",
    "PEERWATCH_SCHEMA_REGISTRY_URL": "kafka.schema_registry_url",
}


def env_name(table: str, name: str) -> str:
    """The environment variable of a setting: ``PEERWATCH_<TABLE>_<FIELD>``."""
    return "_".join(p.upper() for p in ("PEERWATCH", table, name) if p)


def catalogue() -> Iterator[tuple[str, str, Any]]:
    """Every setting as ``(table, name, field)``; the table is ``""`` for top-level keys."""
    for f in fields(Settings):
        if f.name in ROOT_KEYS:
            yield "", f.name, f
    for table, cls in TABLES.items():
        for f in fields(cls):
            yield table, f.name, f


def _type_of(table: str, name: str) -> Any:
    return hints(TABLES[table] if table else Settings)[name]


def _read_toml(path: str | os.PathLike[str], where: str) -> dict[str, Any]:
    """The TOML document at ``path``. Raises ConfigError naming ``where`` for a file that cannot
    be read or is over MAX_CONFIG_BYTES, not UTF-8, not TOML, nested too deep or holding an
    integer of more digits than Python converts."""
    shown = repr(str(path))  # a hostile path prints escaped
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(where, f"cannot read {shown}: {exc.strerror}") from exc
    except ValueError as exc:  # a NUL in the path
        raise ConfigError(where, f"cannot read {shown}: {exc}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(where, f"{shown} is over {MAX_CONFIG_BYTES} bytes")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(where, f"{shown} is not UTF-8 text: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(where, f"{shown} is not valid TOML: {exc}") from exc
    except ValueError as exc:  # an integer over sys.get_int_max_str_digits() digits
        raise ConfigError(where, f"{shown}: {exc}") from exc
    except RecursionError as exc:
        raise ConfigError(where, f"{shown} nests arrays or tables too deep") from exc


def from_tree(doc: Mapping[str, Any], base: Settings | None = None) -> Settings:
    """``base`` (or the defaults) with the values of a TOML-shaped mapping. Raises ConfigError
    naming an unknown table or key, or a bad value."""
    base = base or Settings()
    changes: dict[str, Any] = {}
    for key, value in doc.items():
        if key in TABLES:
            if not isinstance(value, Mapping):
                raise ConfigError(key, "must be a table")
            changes[key] = from_mapping(TABLES[key], key, value, getattr(base, key))
        elif key in ROOT_KEYS:
            changes[key] = conform(str, value, key)
        else:
            raise ConfigError(key, f"unknown setting (tables: {', '.join(TABLES)})")
    return replace(base, **changes)


def _env_values(env: Mapping[str, str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The settings the environment sets (table -> field -> value), and each one's variable
    (``table.field`` -> variable name)."""
    out: dict[str, dict[str, Any]] = {}
    used: dict[str, str] = {}
    named = {env_name(t, n): (t, n) for t, n, _ in catalogue()}
    for var, dotted in ENV_ALIASES.items():
        table, _, name = dotted.partition(".")
        if env.get(var) and not env.get(env_name(table, name)):
            named[var] = (table, name)
    for var, (table, name) in named.items():
        text = env.get(var)
        if text:  # an empty variable counts as unset
            where = f"{table}.{name}" if table else name
            out.setdefault(table, {})[name] = parse_text(_type_of(table, name), text, where)
            used[where] = var
    return out, used


def _layers(
    config_file: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    drain_file: str | os.PathLike[str] | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The merged TOML-shaped tree of file, drain file and environment, and where each value
    set in it came from (``table.field`` -> ``file PATH``, ``drain file PATH``, ``env VAR``).
    Raises ConfigError."""
    doc: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = config_file or env.get(CONFIG_FILE_ENV)
    if path:
        doc = _read_toml(path, CONFIG_FILE_ENV)
        for key, value in doc.items():
            names = value if isinstance(value, Mapping) and key in TABLES else {"": None}
            for name in names:
                sources[f"{key}.{name}" if name else key] = f"file {path}"
    drain_path = drain_file or env.get(DRAIN_FILE_ENV)
    if drain_path:
        drain = doc.get("drain", {})
        if not isinstance(drain, Mapping):
            raise ConfigError("drain", "must be a table")
        extra = _read_toml(drain_path, DRAIN_FILE_ENV)
        doc["drain"] = {**drain, **extra}
        sources.update({f"drain.{name}": f"drain file {drain_path}" for name in extra})
    values, used = _env_values(env)
    credentials = _credential_values(env)
    # Credentials first, so that an environment variable set on purpose still wins.
    for table, fields_set in [*credentials.items(), *values.items()]:
        if table:
            section = doc.get(table, {})
            if not isinstance(section, Mapping):
                raise ConfigError(table, "must be a table")
            doc[table] = {**section, **fields_set}
        else:
            doc.update(fields_set)
    sources.update({f"{t}.{n}" if t else n: f"credential {CREDENTIAL_PREFIX}{t}.{n}"
                    for t, names in credentials.items() for n in names})  # fmt: skip
    sources.update({dotted: f"env {var}" for dotted, var in used.items()})
    return doc, sources


#: systemd's LoadCredential= directory (``$CREDENTIALS_DIRECTORY``, set for the service only).
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"
#: The credential id of the units' ``LoadCredential=peerwatch:<folder>``, plus systemd's "_".
CREDENTIAL_PREFIX = "peerwatch_"


def _credential_values(env: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Secret settings from systemd credentials: the file
    ``$CREDENTIALS_DIRECTORY/peerwatch_<table>.<field>`` (the units'
    ``LoadCredential=peerwatch:/etc/peerwatch/credentials`` loads each file of that folder, e.g.
    ``kafka.sasl_password``, under the ``peerwatch_`` prefix), its content without the trailing
    newline (an empty one counts as unset). The secret never enters the environment, where
    ``/proc/<pid>/environ`` and child processes would see it. Raises ConfigError naming the
    setting for a credential that cannot be read."""
    folder = env.get(CREDENTIALS_ENV)
    out: dict[str, dict[str, Any]] = {}
    if not folder:
        return out
    for table, name, _ in catalogue():
        inner = _type_of(table, name)
        if Secret not in (inner, *getattr(inner, "__args__", ())):
            continue
        where = f"{table}.{name}" if table else name
        path = Path(folder) / (CREDENTIAL_PREFIX + where)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(where, f"cannot read the credential {path}: {exc}") from exc
        value = text.rstrip("\r\n")
        if value:  # an empty file counts as unset, as an empty variable does
            out.setdefault(table, {})[name] = Secret(value)
    return out


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    drain_file: str | os.PathLike[str] | None = None,
) -> Settings:
    """The process settings: defaults < TOML config file (``config_file`` or
    ``$PEERWATCH_CONFIG``; a flat drain file, ``drain_file`` or ``$PEERWATCH_DRAIN_CONFIG``, is
    read as its ``[drain]`` table) < systemd credentials (secrets only, see
    :func:`_credential_values`) < environment. Raises :class:`ConfigError` naming the field."""
    doc, _ = _layers(config_file, os.environ if env is None else env, drain_file)
    # Build once from everything: cross-field checks (SASL needs a user) see the final values.
    return from_tree(doc)


def setting_sources(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    drain_file: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """Where each setting :func:`load_settings` would read comes from: ``table.field`` ->
    ``file PATH``, ``drain file PATH`` or ``env VAR``; settings not listed keep their default.
    Raises ConfigError as :func:`load_settings` does."""
    _, sources = _layers(config_file, os.environ if env is None else env, drain_file)
    return sources


def with_overrides(settings: Settings, overrides: Mapping[str, Any]) -> Settings:
    """``settings`` with ``{"table.field": value}`` overrides (CLI flags) applied; None values are
    skipped (a flag not given). Validated like the file; raises ConfigError naming the field."""
    doc: dict[str, Any] = {}
    for dotted, value in overrides.items():
        if value is None:
            continue
        table, dot, name = dotted.partition(".")
        if dot:
            doc.setdefault(table, {})[name] = value
        else:
            doc[table] = value
    return from_tree(doc, settings) if doc else settings


def expand(path: str) -> Path:
    """A settings path with ``~`` and environment variables expanded."""
    return Path(os.path.expandvars(os.path.expanduser(path)))
