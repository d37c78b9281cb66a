"""The controller's persisted state: decided recommendation ids, drain ledgers, the breaker,
operator-resume times and an outbox of audit records not yet delivered.

It is one JSON document written atomically (temporary file, fsync, rename, fsync of the folder)
and read-modify-written under an exclusive ``flock`` so the CLI (``reset-breaker``, ``resume``)
and a running controller never lose each other's changes. All times are int ms (UTC).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from peerwatch.errors import ConfigError
from peerwatch.files import write_atomic
from peerwatch.schemas.records import DrainAction

STATE_VERSION = 1


@dataclass
class DrainedNode:
    """A node drained (or, in the shadow ledger, that would have been drained) by peerwatch."""

    node: str
    recommendation_id: str | None
    reason: str
    ts_ms: int
    partitions: list[str] = field(default_factory=list)
    expires_ms: int | None = None
    #: Shadow ledger only: the would-be drain stops counting after this time.
    hold_until_ms: int | None = None


@dataclass
class Ledger:
    """Drain history of one mode: times per job and per partition, and nodes held drained."""

    job_drains: dict[str, list[int]] = field(default_factory=dict)
    partition_drains: dict[str, list[int]] = field(default_factory=dict)
    drained: dict[str, DrainedNode] = field(default_factory=dict)

    def drains_since(self, table: dict[str, list[int]], key: str, since_ms: int) -> int:
        return sum(1 for t in table.get(key, ()) if t > since_ms)

    def add_drain(self, entry: DrainedNode, job_ids: list[str]) -> None:
        self.drained[entry.node] = entry
        for job in job_ids:
            self.job_drains.setdefault(job, []).append(entry.ts_ms)
        for part in entry.partitions:
            self.partition_drains.setdefault(part, []).append(entry.ts_ms)


@dataclass
class Breaker:
    """The circuit breaker: once open, it stays open (across restarts) until an operator resets it."""

    open: bool = False
    why: str = ""
    opened_ms: int | None = None
    last_reset_ms: int | None = None


@dataclass
class Decided:
    """How a recommendation was decided (the idempotence record)."""

    decision: str
    refusal: str | None
    ts_ms: int


@dataclass
class ControllerState:
    """Everything the controller must remember across restarts. Mutated in place by the controller."""

    decided: dict[str, Decided] = field(default_factory=dict)
    enforce: Ledger = field(default_factory=Ledger)
    shadow: Ledger = field(default_factory=Ledger)
    breaker: Breaker = field(default_factory=Breaker)
    #: Node -> when an operator resumed a node peerwatch had drained (starts the cooldown).
    operator_resumes: dict[str, int] = field(default_factory=dict)
    #: DrainAction records decided but not yet delivered to Kafka.
    outbox: list[DrainAction] = field(default_factory=list)

    def ledger(self, enforce: bool) -> Ledger:
        return self.enforce if enforce else self.shadow

    def open_breaker(self, why: str, now_ms: int) -> None:
        if not self.breaker.open:
            self.breaker = Breaker(True, why, now_ms, self.breaker.last_reset_ms)

    def reset_breaker(self, now_ms: int) -> bool:
        """Close the breaker; True when it was open."""
        was_open = self.breaker.open
        self.breaker = Breaker(False, "", None, now_ms)
        return was_open

    def prune(self, now_ms: int, retention_ms: int, window_ms: int) -> None:
        """Forget decided ids older than ``retention_ms`` and drain times older than ``window_ms``
        (the longest rate-limit window); drop expired shadow holds."""
        self.decided = {k: v for k, v in self.decided.items() if v.ts_ms > now_ms - retention_ms}
        for ledger in (self.enforce, self.shadow):
            for table in (ledger.job_drains, ledger.partition_drains):
                for key in list(table):
                    table[key] = [t for t in table[key] if t > now_ms - window_ms]
                    if not table[key]:
                        del table[key]
        self.shadow.drained = {
            n: d
            for n, d in self.shadow.drained.items()
            if d.hold_until_ms is None or d.hold_until_ms > now_ms
        }
        self.operator_resumes = {
            n: t for n, t in self.operator_resumes.items() if t > now_ms - retention_ms
        }

    def to_json(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, doc: Any) -> ControllerState:
        """Raises ValueError/KeyError/TypeError for a document of another shape."""
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            raise ValueError(f"not a version-{STATE_VERSION} drain-controller state document")

        def ledger(d: dict[str, Any]) -> Ledger:
            return Ledger(
                job_drains={str(k): [int(t) for t in v] for k, v in d["job_drains"].items()},
                partition_drains={
                    str(k): [int(t) for t in v] for k, v in d["partition_drains"].items()
                },
                drained={str(k): DrainedNode(**v) for k, v in d["drained"].items()},
            )

        return cls(
            decided={str(k): Decided(**v) for k, v in doc["decided"].items()},
            enforce=ledger(doc["enforce"]),
            shadow=ledger(doc["shadow"]),
            breaker=Breaker(**doc["breaker"]),
            operator_resumes={str(k): int(v) for k, v in doc["operator_resumes"].items()},
            # The cast: the outbox is our own state file, written by to_json from DrainAction
            # records; the codec checks each one against the schema when it is delivered.
            outbox=[cast(DrainAction, dict(a)) for a in doc["outbox"]],
        )


class StateStore:
    """The state file. ``transaction()`` holds an exclusive lock while state is read and written."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")

    def load(self) -> ControllerState:
        """The stored state, or a fresh one when the file does not exist.

        Raises ConfigError (field ``drain.state_file``) when the file is unreadable or corrupt:
        starting from scratch would forget the breaker and every decided id, so we refuse.
        """
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return ControllerState()
        except OSError as exc:
            raise ConfigError("drain.state_file", f"cannot read {self.path}: {exc}") from exc
        try:
            return ControllerState.from_json(json.loads(text))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                "drain.state_file", f"{self.path} is corrupt ({exc}); fix or move it aside"
            ) from exc

    def save(self, state: ControllerState) -> None:
        """Write ``state`` atomically: a crash leaves either the old or the new file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(state.to_json(), sort_keys=True).encode(), mode=0o600)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[ControllerState]:
        """Lock, load, yield the state, and save it when the block ends without an exception."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                state = self.load()
                yield state
                self.save(state)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
