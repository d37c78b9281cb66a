"""The ``[drain]`` table of the settings tree: limits and wiring of the drain controller.

Loaded with the rest of the tree (:func:`peerwatch.settings.load_settings`): env
``PEERWATCH_DRAIN_<FIELD>`` > the config file's ``[drain]`` table (or the flat drain file of
``--drain-config`` / ``$PEERWATCH_DRAIN_CONFIG``) > defaults. Every limit is a setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from peerwatch.errors import ConfigError
from peerwatch.reasons import REASON_PREFIX, SLURM_REASON_MAX_CHARS
from peerwatch.settings_base import (
    check_at_least,
    check_positive,
    check_range,
    check_types,
    setting,
)

HOUR_S = 3600
DAY_S = 24 * HOUR_S


@dataclass(frozen=True)
class DrainSettings:
    """``[drain]``: limits and wiring of the drain controller (times in seconds, shares in
    percent)."""

    enforce: bool = setting(False, "change Slurm; false = shadow mode: decide and audit only")
    max_drains_per_job: int = setting(1, "at most this many drains per job within job_window_s")
    job_window_s: int = setting(30 * 60, "window of max_drains_per_job (s)")
    partition_rate_pct: float = setting(
        2.0, "at most this percent of a partition's nodes drained per partition_window_s"
    )
    partition_window_s: int = setting(HOUR_S, "window of partition_rate_pct (s)")
    partition_min_drains: int = setting(
        0, "drains always allowed per window whatever the percentage gives"
    )
    breaker_pct: float = setting(
        5.0, "the breaker opens when peerwatch-drained nodes would exceed this percent"
    )
    operator_cooldown_s: int = setting(
        DAY_S, "no soft drain of a node this long after an operator resumed it (s)"
    )
    max_reason_chars: int = setting(
        SLURM_REASON_MAX_CHARS,
        "whole Slurm reason, prefix included, is cut to this (the prefix and the 100 characters "
        "of text peerwatch.reasons.sanitize_reason allows)",
    )
    auto_resume_on_expiry: bool = setting(
        False, "resume nodes we drained once the recommendation's expires_ms has passed"
    )
    partition_sizes: Mapping[str, int] = setting(
        {}, "partition name -> node count, overriding Slurm's count (tests, staged clusters)"
    )
    shadow_hold_s: int = setting(
        DAY_S, "how long a shadow would-be drain counts as drained without an expiry (s)"
    )
    state_retention_s: int = setting(
        35 * DAY_S, "decided recommendation ids are remembered this long (s)"
    )
    state_file: str = setting(
        "~/.local/state/peerwatch/drain-controller.json", "the controller's state file"
    )
    slurm_bin: str = setting("", "folder of scontrol/sinfo; empty = found on PATH")
    slurm_timeout_s: float = setting(30.0, "timeout of one scontrol/sinfo call (s)")
    group_id: str = setting("peerwatch-drain-controller", "Kafka consumer group")
    poll_timeout_s: float = setting(1.0, "Kafka poll timeout (s)")
    delivery_timeout_s: float = setting(
        30.0, "wait for the audit record's delivery before the offset is not committed (s)"
    )

    def __post_init__(self) -> None:
        t = "drain"
        check_types(self, t)
        check_at_least(self, t, 0, "max_drains_per_job", "partition_min_drains", "job_window_s")
        check_at_least(self, t, 0, "partition_window_s", "operator_cooldown_s", "shadow_hold_s")
        check_at_least(self, t, 0, "state_retention_s")
        check_range(self, t, 0, 100, "partition_rate_pct", "breaker_pct")
        check_at_least(self, t, len(REASON_PREFIX) + 8, "max_reason_chars")
        for part, size in self.partition_sizes.items():
            if size <= 0:
                raise ConfigError(f"{t}.partition_sizes", f"{part}: size must be > 0")
        check_positive(self, t, "slurm_timeout_s", "delivery_timeout_s", "poll_timeout_s")
