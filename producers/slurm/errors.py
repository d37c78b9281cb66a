"""Errors of the Slurm parsers."""

from __future__ import annotations

from peerwatch.errors import PeerwatchError


class SlurmParseError(PeerwatchError, ValueError):
    """Slurm output (a hostlist, a GRES string, a JSON document) is not in a shape we know.

    A ``ValueError`` too, so callers that treat bad input generically can catch that.
    """
