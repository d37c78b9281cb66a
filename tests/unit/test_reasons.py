"""The one reason sanitiser (peerwatch/reasons.py), shared by the stream core and the drain
controller: the stricter of the two former rule sets (``;`` banned, 100 characters of text)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.reasons import (
    EMPTY_REASON,
    REASON_MAX_CHARS,
    SLURM_REASON_MAX_CHARS,
    reason_is_clean,
    sanitize_reason,
    slurm_reason,
)
from peerwatch.streams.core.settings import PolicySettings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("xid 79; node lost", "xid 79 node lost"),  # ";" was allowed by the stream core
        ("a;b;;c", "a b c"),
        ("clk -5.6% z=-3.8 gpu[3] job 42 (x/y) <a@b#c> p+q_r.s,t:u", None),  # all kept
        ("why? because! a*b & c|d {e} ~f ^g", "why because a b c d e f g"),
        ("tab\there\nnew\rline\x00nul\x1besc\x7fdel", "tab here new line nul esc del"),
        ("caf\u00e9 \u2603 ok", "caf ok"),
        ("\udcff\udcfe bad bytes", "bad bytes"),  # lone surrogates of a surrogateescape decode
        ("  Peerwatch: PEERWATCH:peerwatch:  twice  ", "twice"),
        ("\"quoted\" 'single' `tick` $HOME back\\slash", "quoted single tick HOME back slash"),
        ("", ""),
        (";;; $$$", ""),
    ],
)
def test_sanitize_reason_rules(text: str, expected: str | None) -> None:
    assert sanitize_reason(text) == (text if expected is None else expected)


def test_non_utf8_bytes_never_raise() -> None:
    assert sanitize_reason(b"gpu 3 \xff\xfe slow; caf\xc3\xa9") == "gpu 3 slow caf"
    assert slurm_reason(b"\xff") == "peerwatch: " + EMPTY_REASON


def test_length_cap_is_100_characters_of_text() -> None:
    assert REASON_MAX_CHARS == 100 == PolicySettings().reason_max_chars
    assert sanitize_reason("x" * 500) == "x" * 100
    assert sanitize_reason("word " * 40, 12) == "word word wo"
    assert sanitize_reason("ab" + " " * 20 + "c", 5) == "ab c"
    # The whole Slurm reason: the prefix, a space and the same 100 characters.
    assert SLURM_REASON_MAX_CHARS == 111 == DrainSettings().max_reason_chars
    assert slurm_reason("y" * 500) == "peerwatch: " + "y" * 100


def test_slurm_reason_prefix_and_small_limits() -> None:
    assert slurm_reason("peerwatch: sm clock low") == "peerwatch: sm clock low"
    assert slurm_reason("") == "peerwatch: no reason given"
    assert slurm_reason("", 12) == "peerwatch: n"
    assert slurm_reason("abc", 13) == "peerwatch: ab"
    with pytest.raises(ValueError, match="no room"):
        slurm_reason("abc", 11)


@given(st.text(max_size=400))
def test_a_stream_reason_reaches_slurm_unchanged(text: str) -> None:
    body = sanitize_reason(text)
    assert sanitize_reason(body) == body
    assert reason_is_clean(body) and ";" not in body and len(body) <= REASON_MAX_CHARS
    if body:
        assert slurm_reason(body) == "peerwatch: " + body == slurm_reason(text)


def test_reason_is_clean() -> None:
    assert reason_is_clean("peerwatch: gpu 3 clk -5.6% z=-3.8")
    for bad in ("a;b", "a\nb", "$(x)", "caf\u00e9", "a!"):
        assert not reason_is_clean(bad)
