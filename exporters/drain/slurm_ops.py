"""The drain controller's narrow view of Slurm: list nodes, drain one, resume one.

``ScontrolSlurm`` runs ``sinfo --json`` (or ``scontrol show nodes --json`` where sinfo prints
aggregates, Slurm >= 23.02) and ``scontrol update`` through the shared runner
(:class:`~peerwatch.producers.slurm.command.SlurmCommands`: argument vectors, never a shell).
Failures become :class:`~peerwatch.errors.SlurmCommandError`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from peerwatch.errors import SlurmCommandError
from peerwatch.exporters.drain.decide import NodeFacts
from peerwatch.exporters.drain.sanitize import valid_node_name
from peerwatch.producers.slurm.command import Runner, SlurmCommands, run_command
from peerwatch.producers.slurm.errors import SlurmParseError
from peerwatch.producers.slurm.parse import SlurmNode, parse_sinfo_nodes
from peerwatch.reasons import reason_is_clean

log = logging.getLogger(__name__)


class SlurmOps(Protocol):
    """What the drain controller needs from Slurm."""

    def nodes(self) -> list[NodeFacts]:
        """Every node Slurm knows, with state, reason and partitions. Raises SlurmCommandError."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """Set ``node`` to DRAIN with ``reason``. Raises SlurmCommandError."""
        ...

    def resume(self, node: str) -> None:
        """Set ``node`` to RESUME. Raises SlurmCommandError."""
        ...


def facts_of(node: SlurmNode) -> NodeFacts:
    """The policy's view of a parsed sinfo node."""
    return NodeFacts(
        name=node.name, state=node.state, flags=node.state_flags, reason=node.reason or None,
        reason_user=node.reason_set_by_user, partitions=node.partitions,
    )  # fmt: skip


def drain_argv(scontrol: str, node: str, reason: str) -> list[str]:
    """The argument vector that drains ``node``. Raises ValueError for an unsafe name or reason
    (the policy never hands one in; this is the last line of defence)."""
    _check(node, reason)
    return [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def resume_argv(scontrol: str, node: str) -> list[str]:
    """The argument vector that resumes ``node``. Raises ValueError for an unsafe name."""
    _check(node, "")
    return [scontrol, "update", f"NodeName={node}", "State=RESUME"]


def _check(node: str, reason: str) -> None:
    if not valid_node_name(node):
        raise ValueError(f"refusing unsafe node name {node!r}")
    if not reason_is_clean(reason):
        raise ValueError(f"refusing unsafe reason {reason!r}")


class ScontrolSlurm:
    """The real Slurm, through its command-line tools in ``bin_dir`` (PATH when None)."""

    def __init__(
        self, bin_dir: str | Path | None = None, timeout_s: float = 30.0,
        runner: Runner = run_command,
    ) -> None:  # fmt: skip
        self._commands = SlurmCommands(bin_dir, timeout_s, runner)
        #: Node entries of Slurm's list that could not be read (each skipped, with a warning).
        self.skipped_nodes = 0

    def nodes(self) -> list[NodeFacts]:
        try:
            doc = self._commands.run_json("sinfo", "--json")
            if "nodes" not in doc and "sinfo" in doc:
                # Newer sinfo --json prints aggregates; scontrol has the per-node records.
                doc = self._commands.run_json("scontrol", "show", "nodes", "--json")
            nodes, skipped = parse_sinfo_nodes(doc)
        except SlurmParseError as exc:
            raise SlurmCommandError(f"cannot read Slurm's node list: {exc}") from exc
        for bad in skipped:  # that node is unknown to this decision; the others are read
            self.skipped_nodes += 1
            log.warning("drain: node %r skipped: %s", bad.ident, bad.reason)
        return [facts_of(n) for n in nodes]

    def drain(self, node: str, reason: str) -> None:
        try:
            argv = drain_argv("scontrol", node, reason)
        except ValueError as exc:
            raise SlurmCommandError(str(exc)) from exc
        self._commands.run(*argv)

    def resume(self, node: str) -> None:
        try:
            argv = resume_argv("scontrol", node)
        except ValueError as exc:
            raise SlurmCommandError(str(exc)) from exc
        self._commands.run(*argv)
