"""Check outcomes (CheckOutcome dicts) and the Nagios status order."""

from __future__ import annotations

from peerwatch.schemas.records import CheckOutcome, HealthStatus

# Nagios order: the index is the exit code; the worst (highest) wins.
STATUSES: tuple[HealthStatus, ...] = ("OK", "WARNING", "CRITICAL", "UNKNOWN")
EXIT_CODES: dict[str, int] = {s: i for i, s in enumerate(STATUSES)}

OK, WARNING, CRITICAL, UNKNOWN = STATUSES
#: A status name -> the schema's enum value (narrows a ``str`` without a cast).
_STATUS_OF: dict[str, HealthStatus] = {s: s for s in STATUSES}


def outcome(name: str, status: str, message: str, gpu_index: int | None = None) -> CheckOutcome:
    """One io.peerwatch.CheckOutcome. ``status`` is one of ``STATUSES``; raises ValueError for
    another."""
    known = _STATUS_OF.get(status)
    if known is None:
        raise ValueError(f"unknown health status {status!r}")
    return {"name": name, "status": known, "message": message, "gpu_index": gpu_index}


def worst(statuses: list[HealthStatus]) -> HealthStatus:
    """The worst status (OK < WARNING < UNKNOWN < CRITICAL); OK for none.

    UNKNOWN ranks below CRITICAL here although its exit code is higher: a check that could not
    run must not hide one that found a real fault, but must not pass as OK either.
    """
    rank: dict[HealthStatus, int] = {OK: 0, WARNING: 1, UNKNOWN: 2, CRITICAL: 3}
    return max(statuses, key=rank.__getitem__, default=OK)
