"""Reading Slurm through its commands: the narrow :class:`SlurmClient` Protocol and the real one.

:class:`CommandSlurmClient` runs ``squeue``, ``sacct``, ``sinfo``/``scontrol`` from ``bin_dir``
(or ``$PATH``) through :class:`~peerwatch.producers.slurm.command.SlurmCommands` (argument
vectors, never a shell, a timeout per command, every failure a
:class:`~peerwatch.errors.SlurmCommandError`). It returns parsed JSON documents; turning them
into records is ``parse.py``'s job.

Version differences handled here:

* node records: Slurm 22.05's ``sinfo --json`` lists ``nodes``; newer ``sinfo --json`` prints
  partition/state aggregates, and per-node records come from ``scontrol show nodes --json``
  (which 22.05's scontrol does not have). The choice follows ``sinfo --version`` and falls back
  on the shape of the answer.
* ``sacct --json`` exit codes are wrong on 22.05 (SUCCESS for failed jobs); the watcher takes
  exit codes from squeue and treats a zero exit code of a failed sacct job as unknown.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Protocol

from peerwatch.producers.slurm.command import Runner, SlurmCommands, run_command
from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["CommandSlurmClient", "SlurmClient", "parse_version"]

#: First release whose scontrol prints ``--json`` (per-node records moved there from sinfo).
SCONTROL_JSON_SINCE = (23, 2)


class SlurmClient(Protocol):
    """What the watcher reads from Slurm: three parsed JSON documents."""

    def squeue_json(self) -> dict[str, Any]:
        """``squeue --json`` including recently finished jobs."""
        ...

    def sacct_json(self, since_ms: int) -> dict[str, Any]:
        """``sacct --json`` for all users' jobs since ``since_ms`` (ms since the epoch)."""
        ...

    def nodes_json(self) -> dict[str, Any]:
        """A document with a per-node ``nodes`` list (``sinfo`` or ``scontrol show nodes``)."""
        ...


def parse_version(text: str) -> tuple[int, int]:
    """``slurm 23.11.4`` / ``slurm-wlm 22.05.8`` -> ``(23, 11)``. Raises SlurmParseError."""
    match = re.search(r"(\d+)\.(\d+)(?:\.\d+)?", text)
    if not match:
        raise SlurmParseError(f"no Slurm version in {text.strip()[:80]!r}")
    return int(match.group(1)), int(match.group(2))


def _local_time(ts_ms: int) -> str:
    # sacct reads times without a zone as the local time of the machine it runs on.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts_ms / 1000))


class CommandSlurmClient(SlurmCommands):
    """:class:`SlurmClient` over the Slurm commands in ``bin_dir`` (``None``: from ``$PATH``).

    No process is started before the first call. ``timeout_s`` bounds each command."""

    def __init__(
        self,
        bin_dir: Path | None = None,
        timeout_s: float = 30.0,
        runner: Runner = run_command,
    ) -> None:
        super().__init__(bin_dir, timeout_s, runner)
        self._version: tuple[int, int] | None = None
        self._nodes_via_scontrol: bool | None = None

    def version(self) -> tuple[int, int]:
        """(major, minor) from ``sinfo --version``, cached. Raises SlurmCommandError/ParseError."""
        if self._version is None:
            self._version = parse_version(self.run("sinfo", "--version"))
        return self._version

    def squeue_json(self) -> dict[str, Any]:
        return self.run_json("squeue", "--json", "--states=all")

    def sacct_json(self, since_ms: int) -> dict[str, Any]:
        return self.run_json("sacct", "--json", "--allusers", "--starttime", _local_time(since_ms))

    def nodes_json(self) -> dict[str, Any]:
        if self._nodes_via_scontrol is None:
            self._nodes_via_scontrol = self.version() >= SCONTROL_JSON_SINCE
        if self._nodes_via_scontrol:
            return self.run_json("scontrol", "show", "nodes", "--json")
        doc = self.run_json("sinfo", "--json")
        if "nodes" not in doc and "sinfo" in doc:
            self._nodes_via_scontrol = True  # a newer sinfo than its version said
            return self.run_json("scontrol", "show", "nodes", "--json")
        return doc

    def job_detail(self, job_id: str) -> str:
        """``scontrol show job -d -o JOB``: one line with per-node GRES indices (for hooks)."""
        return self.run("scontrol", "show", "job", "-d", "-o", job_id)
