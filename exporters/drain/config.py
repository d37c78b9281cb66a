"""Settings of the drain controller: env ``PEERWATCH_DRAIN_*`` > TOML file > defaults.

The TOML file is ``$PEERWATCH_DRAIN_CONFIG`` (a flat table of the fields below). ``DRAIN_ENV_VARS``
is the documented catalogue of the environment variables. Every limit is a setting.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from peerwatch.errors import ConfigError
from peerwatch.reasons import REASON_PREFIX, SLURM_REASON_MAX_CHARS

HOUR_S = 3600
DAY_S = 24 * HOUR_S

CONFIG_FILE_ENV = "PEERWATCH_DRAIN_CONFIG"


@dataclass(frozen=True)
class DrainSettings:
    """Limits and wiring of the drain controller (times in seconds, shares in percent)."""

    #: False = shadow mode: decide and audit, never change Slurm.
    enforce: bool = False
    #: At most ``max_drains_per_job`` drains per job within ``job_window_s``.
    max_drains_per_job: int = 1
    job_window_s: int = 30 * 60
    #: At most ``partition_rate_pct`` percent of a partition's nodes drained per ``partition_window_s``.
    partition_rate_pct: float = 2.0
    partition_window_s: int = HOUR_S
    #: Drains always allowed per window whatever the percentage gives (0 = strict percentage).
    partition_min_drains: int = 0
    #: The breaker opens when peerwatch-drained nodes would exceed this percent of a partition.
    breaker_pct: float = 5.0
    #: No soft drain of a node within this long after an operator resumed it (hard ones ignore it).
    operator_cooldown_s: int = DAY_S
    #: Whole Slurm reason, prefix included, is cut to this many characters (default 111: the
    #: prefix and the 100 characters of text :func:`peerwatch.reasons.sanitize_reason` allows).
    max_reason_chars: int = SLURM_REASON_MAX_CHARS
    #: Resume nodes we drained once the recommendation's ``expires_ms`` has passed.
    auto_resume_on_expiry: bool = False
    #: Partition name -> node count, overriding the count seen in Slurm (tests, staged clusters).
    partition_sizes: Mapping[str, int] = field(default_factory=dict)
    #: How long a shadow-mode would-be drain counts as drained when the recommendation has no expiry.
    shadow_hold_s: int = DAY_S
    #: Decided recommendation ids are remembered this long (longer than the topic's retention).
    state_retention_s: int = 35 * DAY_S
    state_file: str = "~/.local/state/peerwatch/drain-controller.json"
    #: Folder of scontrol/sinfo; empty = found on PATH.
    slurm_bin: str = ""
    slurm_timeout_s: float = 30.0
    group_id: str = "peerwatch-drain-controller"
    poll_timeout_s: float = 1.0
    #: Seconds to wait for the audit record's delivery before the offset is not committed.
    delivery_timeout_s: float = 30.0

    def validate(self) -> DrainSettings:
        """Return self, or raise :class:`ConfigError` naming the field at fault."""
        for name in ("max_drains_per_job", "partition_min_drains"):
            if getattr(self, name) < 0:
                raise ConfigError(f"drain.{name}", "must be >= 0")
        for name in ("job_window_s", "partition_window_s", "operator_cooldown_s", "shadow_hold_s",
                     "state_retention_s"):  # fmt: skip
            if getattr(self, name) < 0:
                raise ConfigError(f"drain.{name}", "must be >= 0 seconds")
        for name in ("partition_rate_pct", "breaker_pct"):
            if not 0 <= getattr(self, name) <= 100:
                raise ConfigError(f"drain.{name}", "must be a percentage in [0, 100]")
        if self.max_reason_chars < len(REASON_PREFIX) + 8:
            raise ConfigError("drain.max_reason_chars", f"must be >= {len(REASON_PREFIX) + 8}")
        for part, size in self.partition_sizes.items():
            if size <= 0:
                raise ConfigError("drain.partition_sizes", f"{part}: size must be > 0")
        if self.slurm_timeout_s <= 0 or self.delivery_timeout_s <= 0 or self.poll_timeout_s <= 0:
            raise ConfigError("drain", "timeouts must be > 0")
        return self


DRAIN_ENV_VARS: dict[str, str] = {
    f"PEERWATCH_DRAIN_{f.name.upper()}": f.name for f in fields(DrainSettings)
}


def _parse_sizes(text: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, count = item.partition("=")
        if not sep or not count.strip().isdigit():
            raise ConfigError("drain.partition_sizes", f"{item!r} is not partition=count")
        sizes[name.strip()] = int(count)
    return sizes


def _convert(name: str, value: Any) -> Any:
    where = f"drain.{name}"
    kind = {f.name: f.type for f in fields(DrainSettings)}[name]
    try:
        if name == "partition_sizes":
            if isinstance(value, str):
                return _parse_sizes(value)
            if isinstance(value, Mapping):
                return {str(k): int(v) for k, v in value.items()}
            raise ValueError("expected a table or partition=count,...")
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"{value!r} is not a boolean")
        if kind == "int":
            if isinstance(value, bool):
                raise ValueError("expected an integer")
            return int(value)
        if kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(where, str(exc)) from exc


def load_drain_settings(
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> DrainSettings:
    """Env ``PEERWATCH_DRAIN_*`` > TOML file (``config_file`` or ``$PEERWATCH_DRAIN_CONFIG``) >
    defaults; ``overrides`` (CLI flags) win over all. Raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    path = config_file or env.get(CONFIG_FILE_ENV)
    values: dict[str, Any] = {}
    if path:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except OSError as exc:
            raise ConfigError(CONFIG_FILE_ENV, f"cannot read {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(CONFIG_FILE_ENV, f"{path} is not valid TOML: {exc}") from exc
    for var, name in DRAIN_ENV_VARS.items():
        if var in env and env[var] != "":
            values[name] = env[var]
    values.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in fields(DrainSettings)}
    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name not in known:
            raise ConfigError(f"drain.{name}", "unknown setting")
        changes[name] = _convert(name, value)
    return replace(DrainSettings(), **changes).validate()
