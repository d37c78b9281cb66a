"""The drain controller's check of where a recommendation comes from, before anything is decided.

With ``[signing]`` configured, a record on the recommendations topic is decided only when it
carries a valid HMAC of a stream worker (:mod:`peerwatch.signing`); anything else is refused
unread (``unverified_source``) with a DrainAction on the audit topic, and the controller's state
is left untouched, so a forged record can neither drain a node nor poison the duplicate check of
a genuine recommendation that reuses its id.
"""

from __future__ import annotations

from typing import Any

from peerwatch.exporters.drain.decide import Decision, Outcome, Refusal
from peerwatch.exporters.drain.sanitize import safe_label
from peerwatch.signing import Verifier


def refusal_of(verifier: Verifier | None, msg: Any) -> str | None:
    """None when ``msg`` (a confluent-kafka Message) may be decided: no verifier configured, or
    validly signed; else why not (``"unsigned: ..."``, ``"forged: ..."``)."""
    if verifier is None:
        return None
    verdict = verifier.verify(msg.key(), msg.value(), msg.headers())
    return None if verdict.ok else verdict.reason


def unverified_decision(key: bytes | None, why: str, enforce: bool, now_ms: int) -> Decision:
    """The audited refusal of an unsigned or forged record (its content is not trusted, not
    even decoded: the node named is the record's key, escaped)."""
    node = safe_label(key.decode("utf-8", "replace")) if key else "?"
    return Decision(
        Outcome.REFUSED, node, now_ms, enforce, f"unverified_source: {safe_label(why, 400)}",
        refusal=Refusal.UNVERIFIED_SOURCE,
    )  # fmt: skip
