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


# Issue 39 item 11: hostile config files and values end in a ConfigError naming the field.


def _fails_naming(capsys: pytest.CaptureFixture[str], argv: list[str], what: str) -> str:
    """``peerwatch ... config`` exits 2 with one line naming ``what`` (no traceback)."""
    assert main([*argv, "config"]) == 2
    err = capsys.readouterr().err
    assert what in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"[detector]\nwindow_s = 5\n# caf\xe9 \xff\n", "is not UTF-8 text"),
        (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "nests arrays or tables too deep"),
        (b"x = " + b"{a=" * 5000 + b"1" + b"}" * 5000 + b"\n", "nests arrays or tables too deep"),
        (b"[detector]\nwindow_s = " + b"9" * 4301 + b"\n", "integer string conversion"),
        (b"[detector]\nwindow_s = 5\n" + b"#" * (1 << 20), "is over 1048576 bytes"),
    ],
)
def test_hostile_config_files_name_the_config_and_never_raise_anything_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    content: bytes, says: str,
) -> None:  # fmt: skip
    for var in [v for v in os.environ if v.startswith("PEERWATCH_")]:
        monkeypatch.delenv(var)
    cfg = tmp_path / "pw.toml"
    cfg.write_bytes(content)
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg, env={})
    assert exc.value.field == "PEERWATCH_CONFIG" and says in str(exc.value)
    _fails_naming(capsys, ["--config", str(cfg)], says)


def test_nul_in_the_config_path_or_a_path_setting_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in [v for v in os.environ if v.startswith("PEERWATCH_")]:
        monkeypatch.delenv(var)
    with pytest.raises(ConfigError, match="PEERWATCH_CONFIG: cannot read"):
        load_settings(str(tmp_path / "pw\x00.toml"), env={})
    cfg = tmp_path / "pw.toml"
    cfg.write_text('spool_dir = "/var/\\u0000spool"\n[drain]\nstate_file = "/x\\u0000y"\n')
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg, env={})
    assert exc.value.field == "spool_dir" and "NUL" in str(exc.value)
    cfg.write_text('[drain]\nstate_file = "/x\\u0000y"\n')
    _fails_naming(capsys, ["--config", str(cfg)], "drain.state_file: must not contain a NUL")
    with pytest.raises(ConfigError, match=r"kafka\.librdkafka_extra"):
        load_settings(env={"PEERWATCH_KAFKA_LIBRDKAFKA_EXTRA": "a=" + "b" * 5000})


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("detector.window_s", 2**63 // 1000),  # crashed replay
        ("detector.window_s", 3601),
        ("policy.hard_expiry_s", 2**62),  # made every recommendation unencodable
        ("policy.drain_expiry_s", 366 * 86400),
        ("policy.alert_expiry_s", 10**30),
        ("stream.lateness_s", 1e300),
        ("stream.lateness_s", 10**4000),  # no float holds it: OverflowError before
        ("drain.job_window_s", 10**20),
        ("alertmanager.timeout_s", 1e9),
        ("detector.hard_xids", [79, 10**30]),
        ("drain.partition_sizes", {"gpu": 10**12}),
    ],
)
def test_numbers_have_upper_bounds_and_the_error_names_the_field(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    setting: str, value: object,
) -> None:  # fmt: skip
    with pytest.raises(ConfigError) as exc:
        with_overrides(Settings(), {setting: value})
    assert exc.value.field == setting
    assert "must be between" in str(exc.value) or "must be finite" in str(exc.value)
    for var in [v for v in os.environ if v.startswith("PEERWATCH_")]:
        monkeypatch.delenv(var)
    if isinstance(value, int | float) and not isinstance(value, bool):
        table, name = setting.split(".")
        cfg = tmp_path / "pw.toml"
        cfg.write_text(f"[{table}]\n{name} = {value!r}\n")
        _fails_naming(capsys, ["--config", str(cfg)], f"{setting}: must be")


def _numbers() -> list[tuple[str, str, object]]:
    from peerwatch.settings import TABLES

    out = []
    for table, name, f in catalogue():
        if (
            table
            and isinstance(getattr(TABLES[table](), name), int | float)
            and not isinstance(getattr(TABLES[table](), name), bool)
        ):
            out.append((table, name, f))
    return out


def test_every_number_setting_declares_a_range_its_default_lies_in() -> None:
    from peerwatch.settings_base import range_of

    numbers = _numbers()
    assert len(numbers) > 80
    for table, name, f in numbers:
        bounds = range_of(f)
        assert bounds is not None, f"{table}.{name} has no range"
        low, high = bounds
        assert low <= getattr(getattr(Settings(), table), name) <= high


@pytest.mark.parametrize("where", ["above", "below"])
def test_every_number_setting_refuses_values_outside_its_range(where: str) -> None:
    from peerwatch.settings_base import range_of

    for table, name, f in _numbers():
        low, high = range_of(f) or (0, 0)
        bad = high * 2 + 1 if where == "above" else low - 1
        with pytest.raises(ConfigError) as exc:
            with_overrides(Settings(), {f"{table}.{name}": bad})
        assert exc.value.field == f"{table}.{name}"


def test_a_number_setting_without_a_range_is_a_programming_error() -> None:
    from dataclasses import dataclass

    from peerwatch.settings_base import check_types, setting

    @dataclass(frozen=True)
    class Table:
        n: int = setting(1, "a number with no range")

        def __post_init__(self) -> None:
            check_types(self, "t")

    with pytest.raises(TypeError, match=r"t\.n: a number setting needs"):
        Table()


def test_recommendations_at_the_longest_expiry_still_encode() -> None:
    from peerwatch.schemas.codec import AvroCodec
    from peerwatch.settings_base import range_of
    from peerwatch.streams.core.settings import PolicySettings

    longest = max((range_of(f) or (0, 0))[1] for f in PolicySettings.__dataclass_fields__.values()
                  if f.name.endswith("_expiry_s"))  # fmt: skip
    now_ms = 4_102_444_800_000  # 2100-01-01
    rec = {"recommendation_id": "r", "node": "n1", "ts_ms": now_ms, "action": "DRAIN",
           "severity": "WARNING", "hard": True, "reason": "x", "gpu_indices": [], "job_ids": [],
           "partition": None, "evidence": [], "expires_ms": now_ms + int(longest) * 1000,
           "cause": "HARDWARE"}  # fmt: skip
    codec = AvroCodec("DrainRecommendation")
    assert codec.decode(codec.encode(rec))["expires_ms"] == rec["expires_ms"]


def test_state_retention_has_the_recommendations_retention_as_floor() -> None:
    from peerwatch.topics import RECOMMENDATIONS

    floor_s = RECOMMENDATIONS.retention_ms // 1000
    for bad in (0, floor_s - 1):
        with pytest.raises(ConfigError) as exc:
            load_settings(env={"PEERWATCH_DRAIN_STATE_RETENTION_S": str(bad)})
        assert exc.value.field == "drain.state_retention_s"
    ok = load_settings(env={"PEERWATCH_DRAIN_STATE_RETENTION_S": str(floor_s)})
    assert ok.drain.state_retention_s == floor_s == 30 * 86400


SASL_ENV = {
    "PEERWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "PEERWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "PEERWATCH_KAFKA_SASL_USERNAME": "agent",
}


def test_secrets_come_from_systemd_credentials(tmp_path: Path) -> None:
    # LoadCredential=peerwatch:/etc/peerwatch/credentials puts its kafka.sasl_password here.
    (tmp_path / "peerwatch_kafka.sasl_password").write_text("hunter2\n")
    (tmp_path / "peerwatch_kafka.ssl_key_password").write_text("k3y")
    s = load_settings(env={**SASL_ENV, "CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert s.kafka.sasl_password == Secret("hunter2")  # the file's newline is not the password's
    assert s.kafka.ssl_key_password == Secret("k3y")
    assert producer_config(s.kafka)["sasl.password"] == "hunter2"


def test_an_environment_secret_beats_the_credential(tmp_path: Path) -> None:
    (tmp_path / "peerwatch_kafka.sasl_password").write_text("from-file")
    env = {**SASL_ENV, "CREDENTIALS_DIRECTORY": str(tmp_path),
           "PEERWATCH_KAFKA_SASL_PASSWORD": "from-env"}  # fmt: skip
    assert load_settings(env=env).kafka.sasl_password == Secret("from-env")


def test_only_secrets_are_read_from_credentials(tmp_path: Path) -> None:
    (tmp_path / "peerwatch_kafka.bootstrap_servers").write_text("elsewhere:9092")
    s = load_settings(env={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert s.kafka.bootstrap_servers == "127.0.0.1:9092" and s.kafka.sasl_password is None


def test_an_unreadable_credential_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "peerwatch_kafka.sasl_password").mkdir()  # a folder: reading it fails
    with pytest.raises(
        ConfigError, match=r"kafka\.sasl_password: cannot read the credential .*peerwatch_kafka"
    ):
        load_settings(env={**SASL_ENV, "CREDENTIALS_DIRECTORY": str(tmp_path)})


def test_an_empty_credential_counts_as_unset(tmp_path: Path) -> None:
    # An empty file (a placeholder left by an installer) is not an empty password.
    (tmp_path / "peerwatch_kafka.sasl_password").write_text("")
    assert load_settings(env={"CREDENTIALS_DIRECTORY": str(tmp_path)}).kafka.sasl_password is None


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
