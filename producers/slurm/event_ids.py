"""Deterministic event ids for Slurm events.

An id is a hash of the facts that identify one transition (job, kind, start time, node set...),
never of the time it was observed, so a restarted watcher or a re-run hook that sees the same
Slurm state produces the same id and consumers can drop the repeat.
"""

from __future__ import annotations

import hashlib

__all__ = ["event_id"]

_SEP = "\x1f"  # ASCII unit separator: cannot occur in Slurm names, so parts never run together


def event_id(*parts: object) -> str:
    """32 hex characters (128 bits of SHA-256) over ``parts``; ``None`` hashes as empty.

    Sequences are joined with commas in the order given: sort them first where order is not
    meaningful (node sets)."""
    fields = []
    for part in parts:
        if part is None:
            fields.append("")
        elif isinstance(part, (list, tuple)):
            fields.append(",".join(str(p) for p in part))
        else:
            fields.append(str(part))
    # surrogatepass: a lone surrogate in Slurm's text hashes instead of raising (valid text
    # hashes as before).
    return hashlib.sha256(_SEP.join(fields).encode("utf-8", "surrogatepass")).hexdigest()[:32]
