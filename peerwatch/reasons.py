"""The one reason sanitiser: what a drain reason may contain, from the stream core to ``scontrol``.

The stream core writes :func:`sanitize_reason`'s text into DrainRecommendation ``reason``; the
drain controller sanitises that field again (it may come from anywhere) and sets
:func:`slurm_reason`, ``"peerwatch: <the same text>"``, as the node's Slurm reason. The rules are
one set, so a reason the stream core wrote reaches Slurm unchanged.

Slurm is always called with an argument vector, so these rules are defence in depth: a reason
can neither carry characters a shell or a log viewer would interpret nor pass itself off as
several ``scontrol`` arguments.
"""

from __future__ import annotations

import re

#: Every reason peerwatch sets in Slurm starts with this; only nodes carrying it are ever resumed.
REASON_PREFIX = "peerwatch:"
#: Characters a reason keeps: ASCII letters and digits, space and ``_.,:/+%=()[]<>@#-``.
#: Everything else (quotes, ``;``, ``$``, backtick, backslash, ``!?*&|{}~^``, control characters,
#: anything not ASCII) becomes a space.
_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,:/+%=()\[\]<>@#-]")
#: The length cap of the reason text, prefix not counted (see :func:`sanitize_reason`).
REASON_MAX_CHARS = 100
#: The length cap of a whole Slurm reason: the prefix, a space and :data:`REASON_MAX_CHARS`.
SLURM_REASON_MAX_CHARS = len(REASON_PREFIX) + 1 + REASON_MAX_CHARS
#: The Slurm reason's text when nothing is left of the given one.
EMPTY_REASON = "no reason given"


def sanitize_reason(text: str | bytes, max_chars: int = REASON_MAX_CHARS) -> str:
    """``text`` fit for a Slurm reason, without the ``peerwatch:`` prefix; may be empty.

    Every character outside ``[A-Za-z0-9 _.,:/+%=()[]<>@#-]`` becomes a space (so ``;``, quotes,
    ``$``, backticks, backslashes, control characters and non-ASCII go), runs of spaces collapse
    to one, leading ``peerwatch:`` prefixes (any case) are dropped, and the result is cut to
    ``max_chars`` characters and stripped. ``bytes`` are decoded as UTF-8 first, each byte that is
    not UTF-8 becoming a space like any other non-ASCII character (so do lone surrogates of a
    ``surrogateescape`` decoding).

    The cap is 100 characters of text, the shorter of the two limits peerwatch had (the drain
    controller's 128 counted the prefix): 100 characters say which GPU, job and evidence, stay
    readable in ``sinfo -R`` and audit lines, and nothing peerwatch writes needs more. The whole
    Slurm reason is then at most :data:`SLURM_REASON_MAX_CHARS` (111) characters.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = " ".join(_UNSAFE.sub(" ", text).split())
    while text.lower().startswith(REASON_PREFIX):
        text = text[len(REASON_PREFIX) :].lstrip()
    return text[:max_chars].rstrip()


def slurm_reason(text: str | bytes, max_chars: int = SLURM_REASON_MAX_CHARS) -> str:
    """The exact Slurm reason: ``"peerwatch: " + sanitize_reason(text)``, at most ``max_chars``
    characters in all (the default leaves the text its full :data:`REASON_MAX_CHARS`).

    An empty text says :data:`EMPTY_REASON`. ``max_chars`` must leave room for the prefix
    (ValueError otherwise).
    """
    head = REASON_PREFIX + " "
    room = max_chars - len(head)
    if room < 1:
        raise ValueError(f"max_chars {max_chars} leaves no room after {head!r}")
    return head + (sanitize_reason(text, room) or EMPTY_REASON[:room].rstrip())


def reason_is_clean(reason: str) -> bool:
    """True when ``reason`` holds only characters :func:`sanitize_reason` keeps."""
    return _UNSAFE.search(reason) is None
