from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from peerwatch.cli import main
from peerwatch.errors import ConfigError
from peerwatch.kafka_config import aiokafka_kwargs, consumer_config, producer_config
from peerwatch.settings import (
    KafkaSettings,
    Secret,
    Settings,
    catalogue,
    env_name,
    load_settings,
    with_overrides,
)
from peerwatch.settings_doc import MARK_BEGIN, MARK_END, reference, to_toml


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
    cfg.write_text("[detectr]\nz_threshold = 3.0\n")
    with pytest.raises(ConfigError, match=r"detectr: unknown setting"):
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
    )
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


TREE_TOML = """
topic_prefix = "t."
[kafka]
security_protocol = "SASL_SSL"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "agent"
librdkafka_extra = { "socket.keepalive.enable" = "true" }
[stream]
lateness_s = 7
counters_path = "/tmp/counters.json"
[detector]
mad_floor_clk_rel = 0.008
confirm_features = ["clk", "thr"]
hard_xids = [79, 48]
persistence_mode = "cusum"
[policy]
drain_after_confirmed_s = 300
alert_on_suspect = false
[drain]
enforce = true
partition_sizes = { gpu = 64 }
[export]
protocol = "http"
[agent]
interval_s = 0.5
"""
SECRET_ENV = {"PEERWATCH_KAFKA_SASL_PASSWORD": "hunter2"}


def test_every_detector_and_policy_number_comes_from_the_file(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text(TREE_TOML)
    s = load_settings(cfg, env=SECRET_ENV)
    assert s.detector.mad_floor_clk_rel == 0.008 and s.detector.persistence_mode == "cusum"
    assert s.detector.confirm_features == ("clk", "thr") and s.detector.hard_xids == {48, 79}
    assert s.policy.drain_after_confirmed_s == 300 and s.policy.alert_on_suspect is False
    assert s.stream.lateness_s == 7.0 and isinstance(s.stream.lateness_s, float)
    assert s.drain.enforce is True and s.drain.partition_sizes == {"gpu": 64}
    assert (s.export.protocol, s.agent.interval_s, s.topic_prefix) == ("http", 0.5, "t.")


def test_printed_tree_reads_back_unchanged_and_omits_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text(TREE_TOML)
    env = {**SECRET_ENV, "PEERWATCH_DETECTOR_Z_THRESHOLD": "4", "PEERWATCH_DRAIN_SLURM_BIN": "/x"}
    first = load_settings(cfg, env=env)
    printed = to_toml(first)
    assert "hunter2" not in printed and "PEERWATCH_KAFKA_SASL_PASSWORD" in printed
    again = tmp_path / "printed.toml"
    again.write_text(printed)
    assert load_settings(again, env=SECRET_ENV) == first
    assert to_toml(load_settings(again, env=SECRET_ENV)) == printed
    # The defaults too (every optional value unset, every table printed).
    again.write_text(to_toml(Settings()))
    assert load_settings(again, env={}) == Settings()


def test_env_beats_the_file_for_every_table(tmp_path: Path) -> None:
    cfg = tmp_path / "pw.toml"
    cfg.write_text(TREE_TOML)
    env = {
        **SECRET_ENV,
        "PEERWATCH_DETECTOR_MAD_FLOOR_CLK_REL": "0.02",
        "PEERWATCH_DETECTOR_HARD_XIDS": "79,95",
        "PEERWATCH_POLICY_ALERT_ON_SUSPECT": "true",
        "PEERWATCH_STREAM_LATENESS_S": "3",
        "PEERWATCH_DRAIN_PARTITION_SIZES": "gpu=8",
        "PEERWATCH_AGENT_INTERVAL_S": "2",
        "PEERWATCH_TOPIC_PREFIX": "env.",
    }
    s = load_settings(cfg, env=env)
    assert s.detector.mad_floor_clk_rel == 0.02 and s.detector.hard_xids == {79, 95}
    assert s.policy.alert_on_suspect is True and s.stream.lateness_s == 3.0
    assert s.drain.partition_sizes == {"gpu": 8} and s.agent.interval_s == 2.0
    assert s.topic_prefix == "env."
    # The derived name wins over the documented short alias.
    both = {"PEERWATCH_KAFKA_BOOTSTRAP": "a:1", "PEERWATCH_KAFKA_BOOTSTRAP_SERVERS": "b:2"}
    assert load_settings(env=both).kafka.bootstrap_servers == "b:2"


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"PEERWATCH_DETECTOR_MAD_FLOOR_CLK_REL": "0"}, "detector.mad_floor_clk_rel"),
        ({"PEERWATCH_DETECTOR_MIN_PEERS": "2.5"}, "detector.min_peers"),
        ({"PEERWATCH_POLICY_ALERT_ON_SUSPECT": "maybe"}, "policy.alert_on_suspect"),
        ({"PEERWATCH_STREAM_LATENESS_S": "-1"}, "stream.lateness_s"),
        ({"PEERWATCH_EXPORT_PROTOCOL": "udp"}, "export.protocol"),
        ({"PEERWATCH_AGENT_INTERVAL_S": "0"}, "agent.interval_s"),
        ({"PEERWATCH_AGENT_ENERGY_INTERVAL_S": "-10"}, "agent.energy_interval_s"),
    ],
)
def test_bad_values_of_every_table_name_the_field(env: dict[str, str], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(env=env)
    assert exc.value.field == field


def test_cli_overrides_win_and_are_validated() -> None:
    s = with_overrides(load_settings(env={}), {"detector.window_s": 60, "stream.app_id": None})
    assert s.detector.window_s == 60 and s.stream.app_id == Settings().stream.app_id
    with pytest.raises(ConfigError, match=r"detector\.window_s"):
        with_overrides(s, {"detector.window_s": 0})


def test_config_command_prints_the_tree(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    for var in [v for v in os.environ if v.startswith("PEERWATCH_")]:
        monkeypatch.delenv(var)
    cfg = tmp_path / "pw.toml"
    cfg.write_text("[detector]\nz_threshold = 4.5\n")
    assert main(["--config", str(cfg), "config"]) == 0
    out = capsys.readouterr().out
    assert "z_threshold = 4.5" in out
    assert tomllib.loads(out)["detector"]["z_threshold"] == 4.5


def test_docs_list_every_setting() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    begin, end = doc.index(MARK_BEGIN) + len(MARK_BEGIN), doc.index(MARK_END)
    # Regenerate with: peerwatch config --reference
    assert doc[begin:end].strip() == reference().strip()
    for table, name, _ in catalogue():
        assert f"`{table + '.' if table else ''}{name}`" in doc
        assert f"`{env_name(table, name)}`" in doc


def test_config_says_where_each_value_came_from(tmp_path: Path) -> None:
    from peerwatch.settings import setting_sources

    cfg = tmp_path / "c.toml"
    cfg.write_text('topic_prefix = "t."\n[detector]\nwindow_s = 10\n[kafka]\nclient_id = "x"\n')
    env = {"PEERWATCH_KAFKA_BOOTSTRAP": "h:1", "PEERWATCH_KAFKA_CLIENT_ID": "from-env"}
    sources = setting_sources(cfg, env)
    assert sources == {
        "topic_prefix": f"file {cfg}", "detector.window_s": f"file {cfg}",
        "kafka.client_id": "env PEERWATCH_KAFKA_CLIENT_ID",  # the environment wins over the file
        "kafka.bootstrap_servers": "env PEERWATCH_KAFKA_BOOTSTRAP",
    }  # fmt: skip
    text = to_toml(load_settings(cfg, env), sources)
    assert f"window_s = 10  # [file {cfg}]" in text
    assert 'bootstrap_servers = "h:1"  # [env PEERWATCH_KAFKA_BOOTSTRAP]' in text
    assert "lateness_s = " in text and "  # [default] " in text
