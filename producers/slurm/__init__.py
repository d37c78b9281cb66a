"""Slurm for peerwatch: pure parsers for Slurm's command output (hostlists, GRES strings and the
JSON of ``squeue --json``, ``sacct --json`` and ``sinfo --json``, Slurm 22.05 through 25.x), the
job watcher and hooks, and ``command``, the one runner of Slurm's commands (also the drain
controller's).

The parsers run no command: callers hand in text or parsed JSON. Malformed input raises
:class:`SlurmParseError`, a :class:`ValueError`.
"""

from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["SlurmParseError"]
