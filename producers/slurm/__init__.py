"""Pure parsers for Slurm's command output: hostlists, GRES strings and the JSON of
``squeue --json``, ``sacct --json`` and ``sinfo --json`` (Slurm 22.05 through 25.x).

Nothing here runs a command: callers hand in text or parsed JSON. Malformed input raises
:class:`SlurmParseError`, a :class:`ValueError`.
"""

from peerwatch.producers.slurm.errors import SlurmParseError

__all__ = ["SlurmParseError"]
