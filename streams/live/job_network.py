"""Stage 3's network comparison in the live worker: the pure
:class:`~peerwatch.streams.core.network_jobs.JobNetwork` (the one the offline pipeline runs) fed
the ``network`` messages of ``<app>-window-batches`` and called at each released job window,
each job's memory kept in the stage's changelog-backed job table.

The hot stage sends a job's :class:`~peerwatch.streams.core.network_jobs.JobPorts` of a window
(one message per samples partition that closed it) before the job's window batches of that
window, on the same topic and key, so they are held here when the window is released. A message
that does not parse is hostile input: :func:`~peerwatch.streams.core.network_jobs.job_ports_of_json`
raises, and the agent dead-letters it (the handler's record errors). Each job's memory (held
ports, its pace, the ports' persistence) is kept under ``~network|<job>`` in the job table after
every comparison, and read back at the job's first use in this process (after a restart or a
rebalance); a damaged one is counted (``state_damaged``) and dropped. The ports held for a window
not yet released are memory only (:meth:`JobNetwork.snapshot`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from typing import Any

from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.job_stage import Release
from peerwatch.streams.core.network_jobs import JobNetwork, job_ports_of_json

log = logging.getLogger(__name__)

#: The job table key of a job's network memory (no job id starts with "~").
NETWORK_KEY = "~network|{job}"
#: What restoring a damaged saved memory may raise.
_DAMAGED = (KeyError, TypeError, ValueError, AttributeError, OverflowError)


class LiveJobNetwork:
    """:class:`JobNetwork` with its memory in ``job_table`` (see the module docstring)."""

    def __init__(
        self, network: JobNetwork, job_table: MutableMapping[bytes, Any], counters: Any
    ) -> None:
        self.network = network
        self.job_table = job_table
        self.counters = counters
        self._restored: set[str] = set()

    def forget(self) -> None:
        """Partitions were revoked: forget every job's memory (restored again at first use)."""
        self.network = JobNetwork(self.network.settings, self.network.peers.detector)
        self._restored.clear()

    def _key(self, job_id: str) -> bytes:
        return NETWORK_KEY.format(job=job_id).encode()

    def _restore(self, job_id: str) -> None:
        if job_id in self._restored:
            return
        self._restored.add(job_id)
        saved = self.job_table.get(self._key(job_id))
        if not saved:
            return
        try:
            if not isinstance(saved, Mapping):
                raise TypeError(f"saved network memory of type {type(saved).__name__}")
            self.network.restore(job_id, saved)
        except _DAMAGED as exc:  # damaged: dropped, the job's network learns again
            self.counters.state_damaged += 1
            log.warning("stage 3: saved network memory of job %s dropped: %s", job_id, exc)
            self.network.end_job(job_id)
            self.job_table.pop(self._key(job_id), None)

    def _save(self, job_id: str) -> None:
        self.job_table[self._key(job_id)] = self.network.snapshot(job_id)

    def add(self, message: Mapping[str, Any]) -> bool:
        """One ``network`` message (decoded JSON), held in memory until its window's release.
        Raises KeyError, TypeError or ValueError for a message that is not a valid one (the
        caller dead-letters it); returns False when its window was released already (nothing
        kept)."""
        jp = job_ports_of_json(message)
        self._restore(jp.job_id)
        return self.network.add(jp)

    def release(self, r: Release, window_ms: int) -> list[StragglerFinding]:
        """One released job window: the NETWORK findings it makes (the job's memory saved)."""
        job_id, res = r.context.job_id, r.result
        self._restore(job_id)
        found = self.network.release(
            job_id, r.window_start_ms, r.window_start_ms + window_ms,
            res.job_wide, res.job_sm, res.job_step_ms,
        )  # fmt: skip
        if job_id in self.network.peers.last_window:  # a job without NIC data writes nothing
            self._save(job_id)
        return found

    def prune(self, before_ms: int) -> None:
        """Forget jobs whose last window started before ``before_ms`` (memory and table)."""
        before = set(self.network.paces)
        self.network.prune(before_ms)
        for job_id in before - set(self.network.paces):
            self.job_table.pop(self._key(job_id), None)
