"""The one display sanitiser: outside text (Slurm job and user names, node names, reasons,
anything read from Kafka or an archive) made safe for a terminal, an HTML page or a log line.

A job name set with ``sbatch -J`` is chosen by any cluster user. Printed raw, its escape
sequences clear the operator's screen (``ESC[2J``), set the window title (``ESC]0;...``), plant
an OSC 8 hyperlink, or its bidi controls (U+202E RIGHT-TO-LEFT OVERRIDE) show text in another
order than it is. :func:`display_text` turns every such character into a visible escape
(``\\x1b``, ``\\u202e``) and caps the length, so what the operator sees is what the field holds.

Drain reasons sent to Slurm follow the stricter rules of :mod:`peerwatch.reasons`; this module
is for showing text, not for passing it on.
"""

from __future__ import annotations

import logging
import re
from typing import Any

#: The display cap of one field, in characters (a job name, a user, a reason): long enough for
#: any real Slurm name (``sbatch -J`` names are rarely over 60), short enough for one table row.
FIELD_MAX_CHARS = 80
#: The cap of a long free-text field (evidence, a recommendation's reason).
TEXT_MAX_CHARS = 300
ELLIPSIS = "…"

#: C0 and C1 controls and DEL; the bidi embeddings, overrides and isolates, the implicit
#: direction marks and the Arabic letter mark; zero-width and invisible formatting characters
#: that make two different strings look alike; line and paragraph separators; the BOM.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def display_text(value: Any, max_chars: int = FIELD_MAX_CHARS) -> str:
    """``value`` as text fit to show: ``str(value)`` (bytes decoded as UTF-8, each bad byte as
    U+FFFD; None as ``""``) with every control, bidi and invisible formatting character written
    as a visible escape (``\\x1b``, ``\\u202e``; newline and tab too), then cut to ``max_chars``
    characters with a trailing ``…`` when longer. Escapes count towards the cap and are never
    cut in half. Raises nothing."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        text = value.decode("utf-8", errors="replace")
    else:
        try:
            text = str(value)
        except Exception:  # a hostile object's __str__: show its type, never raise
            text = f"<{type(value).__name__}>"
    # Lone surrogates (a surrogateescape decoding) cannot be encoded by a terminal or a page.
    text = text.encode("utf-8", errors="replace").decode("utf-8")
    if len(text) > max_chars * 8:  # bound the work on a huge field before escaping it
        text = text[: max_chars * 8]
    pieces = _pieces(text)
    if sum(len(chunk) for chunk, _ in pieces) <= max_chars:
        return "".join(chunk for chunk, _ in pieces)
    parts: list[str] = []
    room = max_chars - len(ELLIPSIS)
    for chunk, escaped in pieces:
        if len(chunk) > room:
            if not escaped:
                parts.append(chunk[: max(0, room)])
            break
        parts.append(chunk)
        room -= len(chunk)
    return "".join(parts) + ELLIPSIS


def _pieces(text: str) -> list[tuple[str, bool]]:
    """``text`` split into runs of safe characters and single escapes (``\\x1b``, ...), each
    with whether it is an escape."""
    out: list[tuple[str, bool]] = []
    last = 0
    for m in _UNSAFE.finditer(text):
        if m.start() > last:
            out.append((text[last : m.start()], False))
        out.append((_escape(m), True))
        last = m.end()
    if last < len(text):
        out.append((text[last:], False))
    return out


def is_displayable(text: str) -> bool:
    """True when ``text`` holds no character :func:`display_text` would escape."""
    return _UNSAFE.search(text) is None


#: The cap of one log message (a traceback, printed after it, is not capped).
LOG_MAX_CHARS = 4000


class SafeFormatter(logging.Formatter):
    """A log formatter that shows each message through :func:`display_text`: a job name in a
    log line cannot move the cursor of whoever tails the log, nor forge a second line (a
    newline in the message shows as ``\\x0a``). Exception tracebacks are printed as usual."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = display_text(record.message, LOG_MAX_CHARS)
        return super().formatMessage(record)


#: The log line format of every peerwatch command.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: int, fmt: str = LOG_FORMAT) -> None:
    """Root logging to stderr at ``level`` with :class:`SafeFormatter` (``logging.basicConfig``
    with the escaping formatter; does nothing where the root logger already has handlers)."""
    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter(fmt))
    logging.basicConfig(level=level, handlers=[handler])
