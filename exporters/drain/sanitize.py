"""What may reach ``scontrol``: node names checked against a strict pattern, labels made safe.

Reasons are sanitised by :mod:`peerwatch.reasons` (one rule set with the stream core). Nothing
here runs a command. Slurm is always called with an argument vector, so these rules are
defence in depth: a hostile string can neither name several nodes (hostlist brackets, commas)
nor carry characters a shell or a log viewer would interpret.
"""

from __future__ import annotations

import re

#: One plain Slurm node name: no hostlist expression (``[]``, ``,``), no spaces, bounded length.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: Printable ASCII minus quotes, ``;``, ``$``, backtick and backslash.
FORBIDDEN = frozenset("\"'`;$\\")


def valid_node_name(name: str) -> bool:
    """True when ``name`` is one plain node name (pattern :data:`NODE_NAME`)."""
    return NODE_NAME.fullmatch(name) is not None


def safe_label(text: str, max_chars: int = 64) -> str:
    """A printable, bounded rendering of untrusted text for audit fields and log lines."""
    out = "".join(c if " " <= c <= "~" and c not in FORBIDDEN else "?" for c in text[:max_chars])
    return out + ("..." if len(text) > max_chars else "")
