"""Check outcomes (CheckOutcome dicts) and the Nagios status order."""

from __future__ import annotations

from typing import Any

# Nagios order: the index is the exit code; the worst (highest) wins.
STATUSES: tuple[str, ...] = ("OK", "WARNING", "CRITICAL", "UNKNOWN")
EXIT_CODES: dict[str, int] = {s: i for i, s in enumerate(STATUSES)}

OK, WARNING, CRITICAL, UNKNOWN = STATUSES


def outcome(name: str, status: str, message: str, gpu_index: int | None = None) -> dict[str, Any]:
    """One io.peerwatch.CheckOutcome dict. ``status`` is one of ``STATUSES``."""
    if status not in EXIT_CODES:
        raise ValueError(f"unknown health status {status!r}")
    return {"name": name, "status": status, "message": message, "gpu_index": gpu_index}


def worst(statuses: list[str]) -> str:
    """The worst status (OK < WARNING < UNKNOWN < CRITICAL); OK for none.

    UNKNOWN ranks below CRITICAL here although its exit code is higher: a check that could not
    run must not hide one that found a real fault, but must not pass as OK either.
    """
    rank = {OK: 0, WARNING: 1, UNKNOWN: 2, CRITICAL: 3}
    return max(statuses, key=rank.__getitem__, default=OK)
