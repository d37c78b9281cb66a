"""What may reach ``scontrol``: node names checked against a strict pattern, reasons sanitised.

Nothing here runs a command. Slurm is always called with an argument vector, so these rules are
defence in depth: a hostile string can neither name several nodes (hostlist brackets, commas)
nor carry characters a shell or a log viewer would interpret.
"""

from __future__ import annotations

import re

from peerwatch.exporters.drain.config import REASON_PREFIX

#: One plain Slurm node name: no hostlist expression (``[]``, ``,``), no spaces, bounded length.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
#: Printable ASCII minus quotes, ``;``, ``$``, backtick and backslash.
FORBIDDEN = frozenset("\"'`;$\\")
EMPTY_REASON = "no reason given"
_SPACES = re.compile(r" {2,}")


def valid_node_name(name: str) -> bool:
    """True when ``name`` is one plain node name (pattern :data:`NODE_NAME`)."""
    return NODE_NAME.fullmatch(name) is not None


def safe_label(text: str, max_chars: int = 64) -> str:
    """A printable, bounded rendering of untrusted text for audit fields and log lines."""
    out = "".join(c if " " <= c <= "~" and c not in FORBIDDEN else "?" for c in text[:max_chars])
    return out + ("..." if len(text) > max_chars else "")


def sanitise_reason(reason: str, max_chars: int = 128) -> str:
    """The exact Slurm reason: ``"peerwatch: <text>"``, printable ASCII only, none of
    :data:`FORBIDDEN`, runs of spaces collapsed, at most ``max_chars`` characters in all.

    A leading ``peerwatch:`` in ``reason`` is not repeated; an empty result says
    ``no reason given``. ``max_chars`` must leave room for the prefix (ValueError otherwise).
    """
    head = REASON_PREFIX + " "
    if max_chars < len(head) + 1:
        raise ValueError(f"max_chars {max_chars} leaves no room after {head!r}")
    text = "".join(c if " " <= c <= "~" and c not in FORBIDDEN else " " for c in reason)
    text = _SPACES.sub(" ", text).strip()
    while text.lower().startswith(REASON_PREFIX):
        text = text[len(REASON_PREFIX) :].strip()
    text = text or EMPTY_REASON
    return (head + text)[:max_chars].rstrip()
