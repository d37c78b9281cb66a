"""Where a drain recommendation comes from: an HMAC the stream workers add and the drain
controller checks before deciding.

ACLs decide who may write ``peerwatch.drain.recommendations``; this decides whether the drain
controller believes what it reads there. The stream worker signs each recommendation with a key
only the stream workers and the controller hold (:class:`Signer`); the controller verifies it
(:class:`Verifier`) and refuses, with an audit record, anything unsigned, signed with an unknown
key or whose signature does not match (``exporters/drain/provenance.py``).

The MAC is HMAC-SHA256 over ``DOMAIN``, the record key's length (4 bytes, big-endian), the key
and the value: the bytes exactly as they were written to Kafka, so nothing is re-encoded to
check. It travels in two headers: :data:`KEY_ID_HEADER` (which key signed) and
:data:`SIGNATURE_HEADER` (the 32-byte MAC). A signature says nothing about age: the controller
checks the recommendation's own time and id like any other (a replayed record is a duplicate or
stale).

Rotation without a gap: the verifier accepts two keys, ``key`` and ``previous_key``, and the
signer always uses ``key``. (1) Give the controller the new key as ``key`` and the old one as
``previous_key`` and restart it: it accepts both. (2) Give the stream workers the new key and
restart them: they sign with it. (3) Once the controller's consumer lag on the recommendations
topic is zero (nothing signed with the old key is left unread), drop ``previous_key`` from the
controller. docs/operations.md, "Secured deployment", has the commands.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peerwatch.errors import ConfigError
from peerwatch.settings_base import check_types, setting

KEY_ID_HEADER = "peerwatch.sig.kid"
SIGNATURE_HEADER = "peerwatch.sig"
DOMAIN = b"peerwatch.drain.recommendation.v1\x00"
#: Shortest key accepted (bytes): HMAC-SHA256's own block of entropy.
MIN_KEY_BYTES = 32
#: Longest key id accepted in a header (bytes); longer ones are refused unread.
MAX_KEY_ID_BYTES = 64


@dataclass(frozen=True)
class SigningSettings:
    """``[signing]``: the HMAC over drain recommendations (stream workers sign, the drain
    controller verifies). Off when ``key_file`` is unset; when set, the controller refuses every
    recommendation that is not signed with ``key`` or ``previous_key``."""

    key_id: str = setting("current", "id of the key in key_file (sent in a header)")
    key_file: str | None = setting(
        None, "file holding the signing key (>= 32 bytes; e.g. $CREDENTIALS_DIRECTORY/signing-key)"
    )
    previous_key_id: str = setting("previous", "id of the key in previous_key_file")
    previous_key_file: str | None = setting(
        None, "drain controller: also accept this key while a rotation is under way"
    )

    def __post_init__(self) -> None:
        t = "signing"
        check_types(self, t)
        for name in ("key_id", "previous_key_id"):
            value = getattr(self, name)
            if not value or len(value.encode()) > MAX_KEY_ID_BYTES or not value.isprintable():
                raise ConfigError(f"{t}.{name}", f"must be 1-{MAX_KEY_ID_BYTES} printable bytes")
        if self.previous_key_file and not self.key_file:
            raise ConfigError(f"{t}.previous_key_file", "needs key_file too")
        if self.previous_key_file and self.key_id == self.previous_key_id:
            raise ConfigError(f"{t}.previous_key_id", "must differ from key_id")


class SigningKey:
    """A key id and its secret (never printed)."""

    __slots__ = ("_secret", "key_id")

    def __init__(self, key_id: str, secret: bytes) -> None:
        if len(secret) < MIN_KEY_BYTES:
            raise ValueError(f"key {key_id!r} is {len(secret)} bytes, at least {MIN_KEY_BYTES}")
        self.key_id = key_id
        self._secret = secret

    def __repr__(self) -> str:
        return f"SigningKey({self.key_id!r}, '**********')"

    def mac(self, key: bytes | None, value: bytes) -> bytes:
        """HMAC-SHA256 over the domain, the record key (length-prefixed) and the value."""
        k = key or b""
        body = DOMAIN + len(k).to_bytes(4, "big") + k + value
        return hmac.new(self._secret, body, hashlib.sha256).digest()


def read_key(key_id: str, path: str, field: str) -> SigningKey:
    """The key in file ``path`` (trailing newline dropped). Raises ConfigError naming ``field``
    when it cannot be read or is too short."""
    expanded = os.path.expandvars(os.path.expanduser(path))
    try:
        secret = Path(expanded).read_bytes().rstrip(b"\r\n")
    except OSError as exc:
        raise ConfigError(field, f"cannot read {expanded}: {exc.strerror}") from exc
    try:
        return SigningKey(key_id, secret)
    except ValueError as exc:
        raise ConfigError(field, str(exc)) from exc


class Signer:
    """Signs records with one key (the stream worker's side)."""

    def __init__(self, key: SigningKey) -> None:
        self.key = key

    def headers(self, key: bytes | None, value: bytes) -> list[tuple[str, bytes]]:
        """The two headers to send with the record ``key``/``value``."""
        return [(KEY_ID_HEADER, self.key.key_id.encode()),
                (SIGNATURE_HEADER, self.key.mac(key, value))]  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """``ok`` when signed by a known key; else ``reason`` says why not (fit for an audit
    record: no secret, the key id escaped by the caller)."""

    ok: bool
    reason: str
    key_id: str | None = None


class Verifier:
    """Checks records against up to two keys (the drain controller's side)."""

    def __init__(self, keys: Sequence[SigningKey]) -> None:
        if not keys:
            raise ValueError("a verifier needs at least one key")
        self.keys = {k.key_id: k for k in keys}

    def verify(self, key: bytes | None, value: bytes | None, headers: Any) -> Verdict:
        """Whether ``headers`` (Kafka's list of (name, bytes) pairs, or None) carry a valid
        signature of ``key``/``value``. Never raises on hostile headers."""
        found = _headers(headers)
        kid_raw, sig = found.get(KEY_ID_HEADER), found.get(SIGNATURE_HEADER)
        if kid_raw is None or sig is None:
            return Verdict(False, "unsigned: no signature headers")
        if len(kid_raw) > MAX_KEY_ID_BYTES:
            return Verdict(False, "forged: key id too long")
        kid = kid_raw.decode("utf-8", "replace")
        signing_key = self.keys.get(kid)
        if signing_key is None:
            return Verdict(False, f"forged: unknown key id {kid}", kid)
        if not hmac.compare_digest(signing_key.mac(key, value or b""), sig):
            return Verdict(False, f"forged: signature does not match key {kid}", kid)
        return Verdict(True, "signed", kid)


def _headers(headers: Any) -> dict[str, bytes]:
    """Kafka headers as {name: last value}; anything malformed is left out."""
    out: dict[str, bytes] = {}
    if not isinstance(headers, Iterable) or isinstance(headers, str | bytes):
        return out
    items = headers.items() if isinstance(headers, dict) else headers
    for item in items:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            value = item[1]
            if isinstance(value, bytes):
                out[item[0]] = value
    return out


def signer_of(settings: SigningSettings) -> Signer | None:
    """The stream's signer, or None when signing is off. Raises ConfigError (unreadable key)."""
    if not settings.key_file:
        return None
    return Signer(read_key(settings.key_id, settings.key_file, "signing.key_file"))


def verifier_of(settings: SigningSettings) -> Verifier | None:
    """The controller's verifier (current and previous key), or None when signing is off.
    Raises ConfigError (unreadable key)."""
    if not settings.key_file:
        return None
    keys = [read_key(settings.key_id, settings.key_file, "signing.key_file")]
    if settings.previous_key_file:
        keys.append(read_key(settings.previous_key_id, settings.previous_key_file,
                             "signing.previous_key_file"))  # fmt: skip
    return Verifier(keys)
