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
from peerwatch.settings_base import check_types, setting
from peerwatch.topics import RECOMMENDATIONS

HOUR_S = 3600
DAY_S = 24 * HOUR_S
YEAR_S = 365 * DAY_S
#: ``state_retention_s`` floor: a decided id is remembered at least as long as Kafka keeps the
#: recommendation, so a replay of anything still on the topic finds it (DUPLICATE).
MIN_STATE_RETENTION_S = RECOMMENDATIONS.retention_ms // 1000


@dataclass(frozen=True)
class DrainSettings:
    """``[drain]``: limits and wiring of the drain controller (times in seconds, shares in
    percent)."""

    enforce: bool = setting(False, "change Slurm; false = shadow mode: decide and audit only")
    max_drains_per_job: int = setting(
        1, "at most this many drains per job within job_window_s", lo=0, hi=1000
    )
    job_window_s: int = setting(30 * 60, "window of max_drains_per_job (s)", lo=0, hi=30 * DAY_S)
    partition_rate_pct: float = setting(
        2.0,
        "at most this percent of a partition's nodes drained per partition_window_s",
        lo=0,
        hi=100,
    )
    partition_window_s: int = setting(
        HOUR_S, "window of partition_rate_pct (s)", lo=0, hi=30 * DAY_S
    )
    partition_min_drains: int = setting(
        0, "drains always allowed per window whatever the percentage gives", lo=0, hi=100_000
    )
    breaker_pct: float = setting(
        5.0,
        "the breaker opens when peerwatch-drained nodes would exceed this percent",
        lo=0,
        hi=100,
    )
    max_drained_nodes: int = setting(
        20,
        "cluster-wide cap: at most this many nodes drained by peerwatch at once, nodes in no "
        "partition included (the lower of this and max_drained_pct applies)",
        lo=0,
        hi=1_000_000,
    )
    max_drained_pct: float = setting(
        5.0,
        "cluster-wide cap: at most this percent of the cluster's nodes drained by peerwatch",
        lo=0,
        hi=100,
    )
    cluster_size: int = setting(
        0,
        "node count for max_drained_pct, overriding the nodes Slurm lists (0: Slurm's count)",
        lo=0,
        hi=1_000_000,
    )
    max_age_s: int = setting(
        300,
        "a soft recommendation whose evidence (ts_ms) is older than this is refused as stale "
        "(s): a backlog after an outage or a replayed topic is not today's cluster",
        lo=1,
        hi=7 * DAY_S,
    )
    hard_max_age_s: int = setting(
        HOUR_S,
        "the same bound for hard recommendations (XID, ECC, lost GPU: they do not heal alone, "
        "but a node may have been repaired and rebooted since) (s)",
        lo=1,
        hi=7 * DAY_S,
    )
    future_skew_s: int = setting(
        60,
        "evidence time (ts_ms) this far ahead of the controller's clock is refused as invalid (s)",
        lo=0,
        hi=HOUR_S,
    )
    operator_cooldown_s: int = setting(
        DAY_S,
        "no soft drain of a node this long after an operator resumed it (s)",
        lo=0,
        hi=YEAR_S,
    )
    max_reason_chars: int = setting(
        SLURM_REASON_MAX_CHARS,
        "whole Slurm reason, prefix included, is cut to this (the prefix and the 100 characters "
        "of text peerwatch.reasons.sanitize_reason allows)",
        lo=len(REASON_PREFIX) + 8,
        hi=SLURM_REASON_MAX_CHARS,
    )
    auto_resume_on_expiry: bool = setting(
        False, "resume nodes we drained once the recommendation's expires_ms has passed"
    )
    partition_sizes: Mapping[str, int] = setting(
        {},
        "partition name -> node count, overriding Slurm's count (tests, staged clusters)",
        lo=1,
        hi=1_000_000,
    )
    shadow_hold_s: int = setting(
        DAY_S,
        "how long a shadow would-be drain counts as drained without an expiry (s)",
        lo=0,
        hi=YEAR_S,
    )
    state_retention_s: int = setting(
        35 * DAY_S,
        "decided recommendation ids are remembered this long (s); at least the "
        f"recommendations topic's retention ({MIN_STATE_RETENTION_S} s)",
        lo=MIN_STATE_RETENTION_S,
        hi=10 * YEAR_S,
    )
    state_file: str = setting(
        "~/.local/state/peerwatch/drain-controller.json", "the controller's state file"
    )
    slurm_bin: str = setting("", "folder of scontrol/sinfo; empty = found on PATH")
    slurm_timeout_s: float = setting(
        30.0, "timeout of one scontrol/sinfo call (s)", lo=0.1, hi=HOUR_S
    )
    group_id: str = setting("peerwatch-drain-controller", "Kafka consumer group")
    poll_timeout_s: float = setting(1.0, "Kafka poll timeout (s)", lo=0.01, hi=60)
    delivery_timeout_s: float = setting(
        30.0,
        "wait for the audit record's delivery before the offset is not committed (s)",
        lo=0.1,
        hi=HOUR_S,
    )

    def __post_init__(self) -> None:
        check_types(self, "drain")
        if self.max_age_s > self.hard_max_age_s:
            # Hard evidence is the stronger: it never gets a shorter life than soft evidence.
            raise ConfigError("drain.max_age_s", "must not exceed hard_max_age_s")
