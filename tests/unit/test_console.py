"""The display sanitiser and the rich console helpers: hostile text shown escaped and capped,
progress bars only on a terminal."""

from __future__ import annotations

import io
import logging
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerwatch.console import CountProgress, EventTimeProgress, render, user_text
from peerwatch.display import ELLIPSIS, display_text, is_displayable


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),  # clear screen
        ("\x1b]0;owned\x07", "\\x1b]0;owned\\x07"),  # window title
        ("\x1b]8;;http://x/\x1b\\y", "\\x1b]8;;http://x/\\x1b\\y"),  # OSC 8 hyperlink
        ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
        ("a\u2066b\u2069", "a\\u2066b\\u2069"),  # bidi isolates
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("\x9b2J", "\\x9b2J"),  # C1 CSI
        ("line\nbreak\ttab\r", "line\\x0abreak\\x09tab\\x0d"),
        ("名前 ünïcödé", "名前 ünïcödé"),  # plain non-ASCII stays readable
        (b"\xffok", "\ufffdok"),
        (None, ""),
        (42, "42"),
        ("bad\udcffsurrogate", "bad?surrogate"),
    ],
)
def test_display_text_escapes_what_a_terminal_would_interpret(raw: object, shown: str) -> None:
    assert display_text(raw) == shown
    assert is_displayable(display_text(raw))


def test_display_text_caps_and_never_cuts_an_escape_in_half() -> None:
    assert display_text("x" * 100, 10) == "x" * 9 + ELLIPSIS
    capped = display_text("ab" + "\x1b" * 20, 10)
    assert capped == "ab\\x1b" + ELLIPSIS and len(capped) <= 10
    assert len(display_text("y" * 10_000_000, 80)) == 80  # bounded work on a huge field


def test_user_text_is_never_read_as_markup() -> None:
    out = render([user_text("[bold]x[/bold] [link=http://e/]y[/link]")], width=80, colour=True)
    assert "[bold]x[/bold]" in out and "\x1b]8" not in out and "\x1b[1m" not in out


def test_replay_progress_draws_only_on_a_terminal() -> None:
    piped = io.StringIO()
    bar = EventTimeProgress(0, 1000, piped)
    bar.update(500, 10, force=True)
    bar.done(20)
    assert piped.getvalue() == ""
    tty = Tty()
    bar = EventTimeProgress(0, 1000, tty)
    bar.update(500, 10, force=True)
    bar.done(20)
    text = tty.getvalue()
    assert "replay" in text and "100%" in text and "20 records" in text and "ETA" in text


def test_count_progress_counts_and_is_silent_when_disabled() -> None:
    tty = Tty()
    with CountProgress("eval", 3, tty) as bar:
        for name in ("a", "b", "c"):
            bar.advance(name)
    assert "3/3" in tty.getvalue()
    quiet = Tty()
    with CountProgress("eval", 3, quiet, enabled=False) as bar:
        bar.advance("a")
    assert quiet.getvalue() == ""


def test_log_lines_escape_hostile_text() -> None:
    from peerwatch.display import SafeFormatter

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "job %s", ("\x1b[2J\u202e",), None)
    line = SafeFormatter("%(levelname)s %(message)s").format(record)
    assert line == "INFO job \\x1b[2J\\u202e"


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary()), st.integers(min_value=1, max_value=200))
def test_any_text_displays_safe_and_within_its_cap(raw: str | bytes, cap: int) -> None:
    shown = display_text(raw, cap)
    assert is_displayable(shown) and len(shown) <= cap
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in shown)  # encodable by any terminal
    out = render([user_text(raw, cap)], width=80, colour=True)
    assert not re.search("\x1b(?!\\[[0-9;]*m)", out)  # no escape but rich's own colours
