from __future__ import annotations

from pathlib import Path

import pytest

from peerwatch.errors import ConfigError
from peerwatch.kafka_config import aiokafka_kwargs, consumer_config, producer_config
from peerwatch.settings import KafkaSettings, Secret, load_settings


def test_defaults_bind_to_loopback() -> None:
    s = load_settings(env={})
    assert s.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert s.kafka.security_protocol == "PLAINTEXT"


def test_env_beats_file_beats_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text(
        'spool_dir = "/file/spool"\n[kafka]\nbootstrap_servers = "file:9092"\nclient_id = "f"\n'
    )
    s = load_settings(cfg, env={"PEERWATCH_KAFKA_BOOTSTRAP": "env:9093"})
    assert s.kafka.bootstrap_servers == "env:9093"
    assert s.kafka.client_id == "f"
    assert s.spool_dir == "/file/spool"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"PEERWATCH_KAFKA_BOOTSTRAP": "no-port"}, "kafka.bootstrap_servers"),
        ({"PEERWATCH_KAFKA_SECURITY_PROTOCOL": "TLS"}, "kafka.security_protocol"),
        ({"PEERWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "kafka.sasl_mechanism"),
        (
            {
                "PEERWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "PEERWATCH_KAFKA_SASL_MECHANISM": "PLAIN",
            },
            "kafka.sasl_username",
        ),
    ],
)
def test_bad_settings_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(env=env)
    assert exc.value.field == field
    assert field in str(exc.value)


def test_unknown_file_key_and_bad_toml_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text("[kafka]\nbootstrap = 'x:1'\n")
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap: unknown setting"):
        load_settings(cfg, env={})
    cfg.write_text("[kafka\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(cfg, env={})


def test_secrets_never_print() -> None:
    s = load_settings(
        env={
            "PEERWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "PEERWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "PEERWATCH_KAFKA_SASL_USERNAME": "agent",
            "PEERWATCH_KAFKA_SASL_PASSWORD": "hunter2",
        }
    )
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.kafka.sasl_password)
    assert isinstance(s.kafka.sasl_password, Secret) and s.kafka.sasl_password.reveal() == "hunter2"


def test_security_settings_reach_every_client() -> None:
    kafka = KafkaSettings(
        bootstrap_servers="k1:9093,k2:9093",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password=Secret("p"),
        librdkafka_extra={"socket.keepalive.enable": "true"},
    ).validate()
    for conf in (producer_config(kafka), consumer_config(kafka, "g")):
        assert conf["security.protocol"] == "SASL_PLAINTEXT"
        assert conf["sasl.mechanism"] == "SCRAM-SHA-256"
        assert (conf["sasl.username"], conf["sasl.password"]) == ("u", "p")
        assert conf["socket.keepalive.enable"] == "true"
    kw = aiokafka_kwargs(kafka)
    assert kw["sasl_plain_username"] == "u" and kw["sasl_plain_password"] == "p"
    assert kw["security_protocol"] == "SASL_PLAINTEXT"


def test_producers_partition_like_faust_and_lose_nothing() -> None:
    conf = producer_config(KafkaSettings())
    assert conf["partitioner"] == "murmur2_random"
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert consumer_config(KafkaSettings(), "g")["enable.auto.commit"] is False
