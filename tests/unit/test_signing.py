"""Provenance of drain recommendations: the HMAC module both sides use, key rotation, hostile
headers, and the drain controller refusing (and auditing) what is not signed before deciding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from peerwatch.errors import ConfigError
from peerwatch.exporters.drain.controller import AuditPublisher, DrainController
from peerwatch.settings import load_settings
from peerwatch.signing import (
    KEY_ID_HEADER,
    SIGNATURE_HEADER,
    Signer,
    SigningKey,
    SigningSettings,
    Verifier,
    signer_of,
    verifier_of,
)
from tests.unit.test_drain_controller import TOPICS, FakeConsumer, Msg, Rig, rec_msg

OLD, NEW = SigningKey("2026-11", b"o" * 32), SigningKey("2026-12", b"n" * 32)


def test_a_signed_record_verifies_and_any_change_is_forged() -> None:
    headers = Signer(NEW).headers(b"node1", b"value")
    assert dict(headers)[KEY_ID_HEADER] == b"2026-12" and len(dict(headers)[SIGNATURE_HEADER]) == 32
    verifier = Verifier([NEW])
    assert verifier.verify(b"node1", b"value", headers).ok
    assert verifier.verify(b"node2", b"value", headers).reason.startswith("forged")
    assert verifier.verify(b"node1", b"valuf", headers).reason.startswith("forged")
    # The key's length is part of the MAC: moving bytes between key and value is a change too.
    assert not verifier.verify(b"node", b"1value", headers).ok
    assert verifier.verify(b"node1", b"value", None).reason == "unsigned: no signature headers"
    other = Signer(SigningKey("2026-12", b"x" * 32)).headers(b"node1", b"value")
    assert verifier.verify(b"node1", b"value", other).reason == (
        "forged: signature does not match key 2026-12"
    )


def test_rotation_accepts_current_and_previous_then_only_current() -> None:
    old_signed = Signer(OLD).headers(b"n", b"v")
    new_signed = Signer(NEW).headers(b"n", b"v")
    during = Verifier([NEW, OLD])
    assert during.verify(b"n", b"v", old_signed).ok and during.verify(b"n", b"v", new_signed).ok
    after = Verifier([NEW])
    assert after.verify(b"n", b"v", new_signed).ok
    assert after.verify(b"n", b"v", old_signed).reason == "forged: unknown key id 2026-11"


@pytest.mark.parametrize(
    "headers",
    [
        "garbage", b"garbage", 42, [("x",)], [(1, b"a")], [(KEY_ID_HEADER, None)],
        [(KEY_ID_HEADER, b"2026-12"), (SIGNATURE_HEADER, "text")],
        [(KEY_ID_HEADER, b"k" * 1000), (SIGNATURE_HEADER, b"s")],
        [(KEY_ID_HEADER, b"\xff\xfe"), (SIGNATURE_HEADER, b"")],
        {KEY_ID_HEADER: b"2026-12"},
    ],
)  # fmt: skip
def test_hostile_headers_are_refused_never_raise(headers: Any) -> None:
    verdict = Verifier([NEW]).verify(b"n", b"v", headers)
    assert not verdict.ok and verdict.reason.startswith(("unsigned", "forged"))


def test_keys_are_never_printed_and_short_keys_refused(tmp_path: Path) -> None:
    assert "n" * 32 not in repr(NEW) and "'2026-12'" in repr(NEW)
    with pytest.raises(ValueError, match="at least 32"):
        SigningKey("k", b"short")
    short = tmp_path / "short.key"
    short.write_text("tooshort\n")
    with pytest.raises(ConfigError, match=r"signing\.key_file: key 'current' is 8 bytes"):
        signer_of(SigningSettings(key_file=str(short)))
    with pytest.raises(ConfigError, match=r"signing\.previous_key_file: cannot read"):
        verifier_of(SigningSettings(key_file=str(_key(tmp_path, "cur")),
                                    previous_key_file=str(tmp_path / "missing")))  # fmt: skip
    with pytest.raises(ConfigError, match=r"signing\.previous_key_file: needs key_file"):
        SigningSettings(previous_key_file="x")
    with pytest.raises(ConfigError, match=r"signing\.previous_key_id: must differ"):
        SigningSettings(key_file="a", previous_key_file="b", key_id="k", previous_key_id="k")
    assert signer_of(SigningSettings()) is None and verifier_of(SigningSettings()) is None


def _key(tmp: Path, name: str, secret: bytes = b"s" * 40) -> Path:
    path = tmp / f"{name}.key"
    path.write_bytes(secret + b"\n")
    return path


def test_signing_settings_from_the_environment_sign_and_verify(tmp_path: Path) -> None:
    env = {"PEERWATCH_SIGNING_KEY_ID": "k2", "PEERWATCH_SIGNING_KEY_FILE": str(_key(tmp_path, "k2")),
           "PEERWATCH_SIGNING_PREVIOUS_KEY_FILE": str(_key(tmp_path, "k1", b"p" * 40))}  # fmt: skip
    settings = load_settings(env=env).signing
    signer, verifier = signer_of(settings), verifier_of(settings)
    assert signer is not None and verifier is not None
    assert sorted(verifier.keys) == ["k2", "previous"]
    assert verifier.verify(b"n", b"v", signer.headers(b"n", b"v")).ok
    previous = Signer(SigningKey("previous", b"p" * 40)).headers(b"n", b"v")
    assert verifier.verify(b"n", b"v", previous).ok


# -- the controller's check, before deciding ---------------------------------------------------


@dataclass
class SignedMsg(Msg):
    _headers: Any = None

    def headers(self) -> Any:
        return self._headers


def _signed(msg: Msg, signer: Signer | None, headers: Any = None) -> SignedMsg:
    if signer is not None:
        headers = signer.headers(msg.key(), msg.value() or b"")
    return SignedMsg(msg._topic, msg._value, msg._key, msg._offset, headers)


def _run(rig: Rig, messages: list[Any], verifier: Verifier | None) -> FakeConsumer:
    consumer = FakeConsumer(messages, rig.log)
    ctl = DrainController(consumer, AuditPublisher(rig.producer, TOPICS, 1.0), rig.slurm,
                          rig.store, rig.settings, TOPICS, clock=rig.clock,
                          sleep=lambda s: None, verifier=verifier)  # fmt: skip
    total, checks = len(messages), iter(range(100))
    ctl.run(stop=lambda: len(consumer.commits) == total or next(checks, None) is None)
    assert ctl.stats.unverified == sum(1 for a in rig.producer.actions()
                                       if a["refusal"] == "unverified_source")  # fmt: skip
    return consumer


def test_controller_refuses_and_audits_unsigned_and_forged_records_before_deciding(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)  # enforcing
    verifier = Verifier([NEW])
    forged = Signer(SigningKey("2026-12", b"f" * 32))
    messages = [
        _signed(rec_msg("r1", 0), None),  # unsigned
        _signed(rec_msg("r1", 1), forged),  # same id, wrong key
        _signed(rec_msg("r1", 2), None, Signer(NEW).headers(b"n1", b"other bytes")),  # replayed sig
        _signed(rec_msg("r1", 3), Signer(NEW)),  # genuine: drained
    ]
    consumer = _run(rig, messages, verifier)
    assert consumer.commits == [0, 1, 2, 3]
    actions = rig.producer.actions()
    assert [(a["decision"], a["refusal"]) for a in actions] == [
        ("REFUSED", "unverified_source"), ("REFUSED", "unverified_source"),
        ("REFUSED", "unverified_source"), ("DRAINED", None),
    ]  # fmt: skip
    assert actions[0]["detail"] == "unverified_source: unsigned: no signature headers"
    assert actions[1]["detail"].startswith("unverified_source: forged: signature does not match")
    # Refused records leave no trace in the state: the genuine r1 is not taken for a duplicate.
    assert rig.slurm.drains == [("n1", "peerwatch: sm clock low")]
    assert len({a["action_id"] for a in actions}) == 4


def test_without_a_key_the_controller_decides_as_before(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    _run(rig, [rec_msg("r1", 0)], None)
    assert [a["decision"] for a in rig.producer.actions()] == ["DRAINED"]
