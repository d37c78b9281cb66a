"""The secured local broker's parts without a broker: the CA and certificates, the server
properties, the storage format's argument vector (no password in it), the client auth guard and
the SASL password file."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from peerwatch.errors import ConfigError, KafkaAuthError
from peerwatch.kafka_config import AuthGuard, consumer_config
from peerwatch.local import kafka
from peerwatch.local.pki import issue, make_ca
from peerwatch.settings import KafkaSettings, Secret, load_settings
from peerwatch.settings_doc import to_toml


def test_ca_issues_a_server_certificate_for_loopback_with_private_keys(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    server = issue(ca, tmp_path, "peerwatch-broker", server=True)
    chain = x509.load_pem_x509_certificates(server.cert.read_bytes())
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    chain[0].verify_directly_issued_by(ca_cert)
    assert chain[1] == ca_cert  # the chain is sent whole
    san = chain[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    for key in (ca.key, server.key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    other = make_ca(tmp_path / "other")
    with pytest.raises(InvalidSignature):
        chain[0].verify_directly_issued_by(x509.load_pem_x509_certificate(other.cert.read_bytes()))
    before = ca.cert.read_bytes()
    assert make_ca(tmp_path) == ca and ca.cert.read_bytes() == before  # kept, not remade


def test_secure_properties_and_format_keep_the_password_off_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = kafka.LocalKafka(cache_dir=tmp_path, state_dir=tmp_path, port=29092, secure=True)
    config = broker._write_config()
    props = dict(line.split("=", 1) for line in config.read_text().splitlines())
    assert (
        props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["listeners"].startswith("SASL_SSL://127.0.0.1:29092,")
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["super.users"] == "User:admin;User:CN=peerwatch-broker"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600  # it holds the admin's password
    password = broker.password_file("admin").read_text()
    seen: dict[str, Any] = {}

    def fake_run(argv: list[str], **_kw: Any) -> Any:
        seen["argv"] = argv
        seen["argfile"] = Path(argv[-1][1:]).read_text()
        return type("P", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(kafka.subprocess, "run", fake_run)
    broker._format(config)
    assert password not in " ".join(seen["argv"]) and seen["argv"][-1].startswith("@")
    assert f'"SCRAM-SHA-512=[name=admin,password={password}]"' in seen["argfile"]
    assert not Path(seen["argv"][-1][1:]).exists()  # removed after the format


def test_argfile_quoting() -> None:
    assert kafka._argfile_quote('a "b" c\\d') == '"a \\"b\\" c\\\\d"'


class Err:
    def __init__(self, name: str, text: str) -> None:
        self._name, self._text = name, text

    def name(self) -> str:
        return self._name

    def str(self) -> str:
        return self._text


def test_auth_guard_stops_on_refusals_and_leaves_transient_errors_to_retries() -> None:
    guard = AuthGuard("peerwatch-agent", "SCRAM-SHA-512")
    with pytest.raises(KafkaAuthError, match=r"user 'peerwatch-agent' .*invalid credentials"):
        guard(Err("_AUTHENTICATION", "SASL authentication error: Authentication failed during "
                  "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"))  # fmt: skip
    with pytest.raises(KafkaAuthError, match=r"TLS handshake .*ssl_ca_location"):
        guard(Err("_SSL", "SSL handshake failed: certificate verify failed"))
    guard(Err("_AUTHENTICATION", "SASL authentication error: SaslAuthenticateRequest failed: "
              "Local: Broker transport failure"))  # fmt: skip
    guard(Err("_ALL_BROKERS_DOWN", "1/1 brokers are down"))
    guard(Err("_TRANSPORT", "authentication failed"))  # not an auth error code
    assert isinstance(consumer_config(KafkaSettings(), "g")["error_cb"], AuthGuard)
    import pickle

    assert pickle.loads(pickle.dumps(guard)).user == "peerwatch-agent"


def test_password_file_is_read_when_a_client_is_made_and_never_printed(tmp_path: Path) -> None:
    secret = tmp_path / "kafka-password"
    secret.write_text("s3cret-from-file\n")
    env = {"PEERWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "PEERWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "PEERWATCH_KAFKA_SASL_USERNAME": "peerwatch-agent",
           "PEERWATCH_KAFKA_SASL_PASSWORD_FILE": str(secret)}  # fmt: skip
    settings = load_settings(env=env)
    assert consumer_config(settings.kafka, "g")["sasl.password"] == "s3cret-from-file"
    assert "s3cret" not in to_toml(settings) and "s3cret" not in repr(settings)
    # The file wins over a password given too.
    both = KafkaSettings(**{**_kw(settings.kafka), "sasl_password": Secret("other")})
    assert both.password() == "s3cret-from-file"
    missing = KafkaSettings(**{**_kw(settings.kafka), "sasl_password_file": str(tmp_path / "no")})
    with pytest.raises(ConfigError, match=r"kafka\.sasl_password_file: cannot read"):
        consumer_config(missing, "g")
    (tmp_path / "empty").write_text("\n")
    empty = KafkaSettings(**{**_kw(settings.kafka), "sasl_password_file": str(tmp_path / "empty")})
    with pytest.raises(ConfigError, match="is empty"):
        empty.password()


def _kw(settings: KafkaSettings) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(settings, f.name) for f in fields(settings)}
