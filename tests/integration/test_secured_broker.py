"""Least privilege on a real secured broker (``peerwatch kafka start --secure``).

One broker for the whole module, started here on its own ports (29092, controller 29093: clear of
the shared 9092 and the test broker on 19092), with SASL_SSL + SCRAM-SHA-512, the project's own
CA, StandardAuthorizer with ``allow.everyone.if.no.acl.found=false``, one user per role, and the
ACLs of :mod:`peerwatch.acls` applied through the admin API per test (each test has its own topic
prefix). Every role runs with its own credentials; the drain controller runs against the real
Slurm (run this module under ``flock /tmp/pw-slurm.lock``) and leaves the node resumed.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient

from peerwatch.acls import ROLES, apply_acls, bindings, default_users
from peerwatch.errors import ConfigError, KafkaAuthError
from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.controller import AuditPublisher, DrainController, Topics
from peerwatch.exporters.drain.slurm_ops import ScontrolSlurm
from peerwatch.exporters.drain.state import StateStore
from peerwatch.kafka_config import admin_config, consumer_config, producer_config
from peerwatch.local.kafka import ADMIN_USER, BROKER_CN, LocalKafka
from peerwatch.local.pki import issue, make_ca
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings, Secret, expand
from peerwatch.signing import KEY_ID_HEADER, SIGNATURE_HEADER, Signer, SigningKey, Verifier
from peerwatch.streams.tools.bench_run import WorkerProcess, read_topic, wait_stable
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import (
    ACTIONS,
    DEADLETTER,
    HEALTH,
    NODE_EVENTS,
    RECOMMENDATIONS,
    SAMPLES,
    STRAGGLERS,
    catalogue,
)
from tests.integration.slurm_fixture import SlurmCluster
from tests.integration.test_drain_controller import USABLE, CountingSlurm, _leave_node_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
PORT = int(os.environ.get("PEERWATCH_TEST_SECURE_KAFKA_PORT", "29092"))
REC, ACT = AvroCodec("DrainRecommendation"), AvroCodec("DrainAction")
APP = "peerwatch-stream"
#: Hang guard for the stream worker (start, join, process a minute of one node), not a target.
STREAM_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    kafka = LocalKafka(
        cache_dir=expand(os.environ.get("PEERWATCH_CACHE_DIR", "~/.cache/peerwatch")),
        state_dir=tmp_path_factory.mktemp("secured-kafka"),
        port=PORT, controller_port=PORT + 1, secure=True,
    )  # fmt: skip
    kafka.start(timeout_s=300)
    try:
        yield kafka
    finally:
        kafka.stop()


@dataclass
class Area:
    """One test's topics (a fresh prefix) on the secured broker, with the ACLs applied."""

    broker: LocalKafka
    prefix: str
    key_file: Path

    def role(self, role: str, **kw: Any) -> KafkaSettings:
        """The client settings of ``role`` ("admin" for the super user): its own password file."""
        user = ADMIN_USER if role == "admin" else default_users()[role]
        return self.broker.client_settings(user, client_id=f"pwtest-{role}", **kw)

    def topic(self, spec: Any) -> str:
        return self.prefix + spec.name

    @property
    def drain_group(self) -> str:
        return self.prefix + "drain"

    @property
    def topics(self) -> Topics:
        return Topics(*(self.topic(t) for t in (RECOMMENDATIONS, NODE_EVENTS, ACTIONS, DEADLETTER)))

    def signer(self) -> Signer:
        return Signer(SigningKey("k1", self.key_file.read_bytes().strip()))

    def verifier(self) -> Verifier:
        return Verifier([self.signer().key])


@pytest.fixture
def area(broker: LocalKafka, tmp_path: Path) -> Area:
    prefix = f"s{uuid.uuid4().hex[:8]}."
    key_file = tmp_path / "signing.key"
    key_file.write_text(secrets.token_hex(32) + "\n")
    key_file.chmod(0o600)
    a = Area(broker, prefix, key_file)
    ensure_topics(a.role("admin"), catalogue(prefix))
    pairs = bindings(default_users(), topic_prefix=prefix, app_id=prefix + APP,
                     drain_group=a.drain_group)  # fmt: skip
    apply_acls(AdminClient(admin_config(a.role("admin"))), pairs)
    return a


def produce(settings: KafkaSettings, records: list[tuple[str, bytes, bytes]],
            headers: list[tuple[str, bytes]] | None = None) -> list[Any]:  # fmt: skip
    """Produce and wait; returns the delivery errors (None for each delivered record)."""
    errors: list[Any] = []
    producer = Producer(producer_config(settings, **{"message.timeout.ms": 15000}))
    for topic, key, value in records:
        producer.produce(topic, value, key, headers=headers,
                         on_delivery=lambda err, _msg: errors.append(err))  # fmt: skip
    assert producer.flush(30) == 0
    return errors


def consume(settings: KafkaSettings, group: str, topics: list[str], count: int,
            timeout_s: float = 60.0) -> list[Any]:  # fmt: skip
    """``count`` messages of ``topics`` read in consumer group ``group`` (fails on an error)."""
    consumer = Consumer(consumer_config(settings, group))
    consumer.subscribe(topics)
    got: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append(msg)
    finally:
        consumer.close()
    assert len(got) >= count, (
        f"read {len(got)} of {count} from {topics} as {settings.sasl_username}"
    )
    return got


def run_controller(area: Area, settings: DrainSettings, slurm: ScontrolSlurm, commits: int,
                   verifier: Verifier | None, timeout_s: float = 120.0) -> None:  # fmt: skip
    """A drain controller with the drain role's credentials until it has committed ``commits``
    recommendations (node events it also reads are not counted)."""
    kafka = area.role("drain")
    consumer = Consumer(consumer_config(kafka, settings.group_id))
    done: list[Any] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(consumer, name)

        def commit(self, **kw: Any) -> Any:
            result = consumer.commit(**kw)
            if kw["message"].topic() == area.topic(RECOMMENDATIONS):
                done.append(result)
            return result

    publisher = AuditPublisher(Producer(producer_config(kafka)), area.topics, 30.0)
    ctl = DrainController(Counting(), publisher, slurm, StateStore(Path(settings.state_file)),
                          settings, area.topics, verifier=verifier)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        ctl.run(stop=lambda: len(done) >= commits or time.monotonic() > deadline)
    finally:
        consumer.close()
    assert len(done) >= commits, f"controller committed {len(done)} of {commits}"


def drain_settings(area: Area, tmp: Path, enforce: bool) -> DrainSettings:
    return DrainSettings(
        enforce=enforce, partition_sizes={"gpu": 100}, partition_rate_pct=100.0,
        breaker_pct=100.0, operator_cooldown_s=0, group_id=area.drain_group, cluster_size=100,
        poll_timeout_s=0.5, state_file=str(tmp / "drain-state.json"),
    )  # fmt: skip


def actions(area: Area, count: int) -> list[dict[str, Any]]:
    """The audit trail, read with the exporter's credentials (it may read actions)."""
    msgs = consume(area.role("exporter"), f"peerwatch-export-{uuid.uuid4().hex[:6]}",
                   [area.topic(ACTIONS)], count)  # fmt: skip
    return [ACT.decode(m.value()) for m in msgs]


@pytest.fixture
def idle_node(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    _leave_node_idle(slurm_cluster)
    slurm_cluster.wait_for_node_state(USABLE)
    try:
        yield slurm_cluster
    finally:
        _leave_node_idle(slurm_cluster)


# -- every role with its own credentials, end to end -----------------------------------------


def one_node_scenario(node: str) -> list[tuple[str, str, dict[str, Any]]]:
    """A minute of one 8-GPU node (the Slurm node's name) running one job, with a hard XID on
    GPU 2 after 10 s: the stream recommends draining the node. Stamped in the recent past."""
    now_ms = int(time.time() * 1000) - 90_000
    doc = {
        "fleet": {"nodes": 1, "gpus_per_node": 8, "interval_s": 2.0, "duration_s": 60,
                  "seed": 3, "start_ms": now_ms - now_ms % 10_000, "node_name_pattern": node},
        "jobs": [{"job_id": "4001", "gpus": 8, "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
        "faults": [{"name": "xid", "node": node, "gpu_index": 2, "start_s": 10,
                    "params": {"xid": 79}}],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    return [(r.stream, r.key, r.value) for _, recs in fleet.timed_ticks() for r in recs]


def stream_env(area: Area, tmp: Path) -> dict[str, str]:
    """The stream worker's settings, from the environment: no secret in it, only file paths."""
    s = area.role("stream")
    return {
        "PEERWATCH_KAFKA_SECURITY_PROTOCOL": s.security_protocol,
        "PEERWATCH_KAFKA_SASL_MECHANISM": str(s.sasl_mechanism),
        "PEERWATCH_KAFKA_SASL_USERNAME": str(s.sasl_username),
        "PEERWATCH_KAFKA_SASL_PASSWORD_FILE": str(s.sasl_password_file),
        "PEERWATCH_KAFKA_SSL_CA_LOCATION": str(s.ssl_ca_location),
        "PEERWATCH_KAFKA_CLIENT_ID": "pwtest-stream",
        "PEERWATCH_SIGNING_KEY_ID": "k1",
        "PEERWATCH_SIGNING_KEY_FILE": str(area.key_file),
        "PEERWATCH_STATE_DIR": str(tmp / "state"),
    }


def secrets_of(area: Area) -> list[str]:
    users = [ADMIN_USER, *default_users().values()]
    return [area.broker.password_file(u).read_text().strip() for u in users] + [
        area.key_file.read_text().strip()
    ]


def test_every_role_works_end_to_end_with_its_own_credentials(
    area: Area, idle_node: SlurmCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    node = idle_node.node
    codecs = {s: AvroCodec(str(t.value_schema)) for s, t in STREAM_TOPICS.items()}
    by_role: dict[str, list[tuple[str, bytes, bytes]]] = {"agent": [], "slurm": []}
    for stream, key, value in one_node_scenario(node):
        role = "agent" if stream == "samples" else "slurm"
        by_role[role].append((area.prefix + STREAM_TOPICS[stream].name, key.encode(),
                              codecs[stream].encode(value)))  # fmt: skip
    health = {"event_id": f"hc-{uuid.uuid4().hex[:6]}", "node": node,
              "ts_ms": int(time.time() * 1000) - 80_000, "phase": "PROLOG", "job_id": "4001",
              "status": "OK", "exit_code": 0, "duration_ms": 420,
              "checks": [{"name": "gpu_count", "status": "OK", "message": "8 of 8",
                          "gpu_index": None}]}  # fmt: skip
    # The slurm role first: the job must be known before its samples are attributed.
    assert set(produce(area.role("slurm"), by_role["slurm"])) == {None}
    assert set(produce(area.role("agent"), by_role["agent"])) == {None}
    assert produce(area.role("health"), [(area.topic(HEALTH), node.encode(),
                                          AvroCodec("HealthCheckResult").encode(health))]) == [None]  # fmt: skip

    admin = area.role("admin")
    worker = WorkerProcess(
        area.broker.bootstrap, area.prefix, APP, tmp_path / "worker", name="secured",
        args=["--window-s", "10", "--lateness-s", "5", "--loglevel", "info"],
        env=stream_env(area, tmp_path),
    )  # fmt: skip
    with worker:

        def published() -> list[Any]:
            assert worker.alive(), f"worker died:\n{worker.log_tail()}"
            return read_topic(admin, area.topic(RECOMMENDATIONS))

        recs = wait_stable(published, lambda rs: len(rs) >= 1, STREAM_TIMEOUT_S, settle_s=2)
        assert recs, f"no recommendation; worker log:\n{worker.log_tail()}"
        cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        # The stream signed what it published (one module signs and verifies).
        for r in recs:
            headers = dict(r.headers or [])
            assert headers[KEY_ID_HEADER] == b"k1" and len(headers[SIGNATURE_HEADER]) == 32
            assert area.verifier().verify(r.key, r.value, r.headers).ok
        drains = [REC.decode(r.value) for r in recs]
        assert {d["node"] for d in drains} == {node} and drains[0]["action"] == "DRAIN"

        # The drain controller, with its own credentials, in shadow mode, checking signatures.
        slurm = CountingSlurm(idle_node.bin_dir)
        run_controller(area, drain_settings(area, tmp_path, enforce=False), slurm,
                       commits=len(recs), verifier=area.verifier())  # fmt: skip
        audit = actions(area, len(recs))
        assert audit[0]["decision"] == "SHADOWED", audit
        assert audit[0]["recommendation_id"] == drains[0]["recommendation_id"]
        assert slurm.drains == []

        # The exporters and the archiver read with their own credentials and groups.
        findings = read_topic(admin, area.topic(STRAGGLERS))
        got = consume(area.role("exporter"), "peerwatch-export-test",
                      [area.topic(STRAGGLERS), area.topic(RECOMMENDATIONS)],
                      len(findings) + len(recs))  # fmt: skip
        assert {m.topic() for m in got} == {area.topic(STRAGGLERS), area.topic(RECOMMENDATIONS)}
        assert consume(area.role("archiver"), "peerwatch-archive-test", [area.topic(SAMPLES)], 1)
        log_text = worker.log_path.read_text(errors="replace")

    # Nothing secret in the worker's command line, its log, the broker's log, or what the
    # clients and the drain controller logged here.
    broker_log = area.broker.log_file.read_text(errors="replace")
    assert "drain controller running in SHADOW mode" in caplog.text  # the logs were captured
    for secret in secrets_of(area):
        assert secret not in cmdline
        assert secret not in log_text
        assert secret not in broker_log
        assert secret not in caplog.text


# -- refusals ----------------------------------------------------------------------------------


def test_only_the_stream_principal_may_write_recommendations(area: Area) -> None:
    rec = {"recommendation_id": "forged-1", "node": "gpu00001", "ts_ms": int(time.time() * 1000),
           "action": "DRAIN", "severity": "CRITICAL", "hard": True, "reason": "forged",
           "job_ids": [], "partition": "gpu"}  # fmt: skip
    record = [(area.topic(RECOMMENDATIONS), b"gpu00001", REC.encode(rec))]
    for role in ROLES:
        if role == "stream":
            continue
        [err] = produce(area.role(role), record)
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (role, err)
    assert read_topic(area.role("admin"), area.topic(RECOMMENDATIONS)) == []
    # The agent writes its own topic (a control: the refusal above is the ACL, not the client).
    assert produce(area.role("agent"), [(area.topic(SAMPLES), b"n", b"x")]) == [None]
    assert produce(area.role("stream"), record) == [None]


def _raises_auth_error(settings: KafkaSettings) -> KafkaAuthError:
    """Poll a producer until the auth guard raises; fails if it never does (a silent retry)."""
    producer = Producer(producer_config(settings))
    producer.produce(SAMPLES.name, b"x", b"k")
    with pytest.raises(KafkaAuthError) as info:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            producer.poll(0.2)
    return info.value


def test_wrong_password_or_unknown_user_is_refused_naming_the_cause(
    area: Area, caplog: pytest.LogCaptureFixture
) -> None:
    good = area.role("agent")
    wrong = KafkaSettings(**{**_fields(good), "sasl_password_file": None,
                             "sasl_password": Secret("not-the-password")})  # fmt: skip
    err = _raises_auth_error(wrong)
    assert "refused the credentials of user 'peerwatch-agent'" in str(err)
    assert "invalid credentials" in str(err) and "not-the-password" not in str(err)
    # One attempt, one error: not a reconnect loop logging on and on.
    failures = [r for r in caplog.records if "SASL authentication error" in r.getMessage()]
    assert len(failures) <= 2, [r.getMessage() for r in failures]
    unknown = KafkaSettings(**{**_fields(good), "sasl_username": "nobody"})
    assert "user 'nobody'" in str(_raises_auth_error(unknown))
    # Without credentials a SASL client is not even built: the setting is named.
    with pytest.raises(ConfigError, match=r"kafka\.sasl_username"):
        KafkaSettings(**{**_fields(good), "sasl_username": None})
    # A client that does not speak SASL at all gets nothing through.
    plain = KafkaSettings(bootstrap_servers=good.bootstrap_servers)
    producer = Producer(producer_config(plain, **{"message.timeout.ms": 3000}))
    errors: list[Any] = []
    producer.produce(area.topic(SAMPLES), b"x", b"k", on_delivery=lambda e, _m: errors.append(e))
    producer.flush(20)
    assert errors and errors[0] is not None
    assert read_topic(area.role("admin"), area.topic(SAMPLES)) == []


def _fields(settings: KafkaSettings) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(settings, f.name) for f in fields(settings)}


def test_a_certificate_from_another_ca_is_refused(area: Area, tmp_path: Path) -> None:
    other = make_ca(tmp_path / "other-ca", "not peerwatch's CA")
    # A client that trusts another CA refuses the broker (as it would an impostor).
    err = _raises_auth_error(
        KafkaSettings(**{**_fields(area.role("agent")), "ssl_ca_location": str(other.cert)})
    )
    assert "TLS handshake" in str(err) and "certificate verify failed" in str(err)
    # The controller listener takes mutual TLS: a certificate from another CA is refused there,
    # the broker's own (from the project's CA) is taken.
    intruder = issue(other, tmp_path / "other-ca", BROKER_CN, server=True)
    own = issue(make_ca(area.broker.tls_dir), area.broker.tls_dir, BROKER_CN, server=True)
    assert _controller_handshake(area.broker, intruder.cert, intruder.key) is False
    assert _controller_handshake(area.broker, own.cert, own.key) is True


def _controller_handshake(broker: LocalKafka, cert: Path, key: Path) -> bool:
    """Whether the controller listener keeps a TLS connection made with ``cert``: the server
    refuses a client certificate after the handshake in TLS 1.3, so a read tells."""
    ctx = ssl.create_default_context(cafile=str(broker.tls_dir / "ca.pem"))
    ctx.load_cert_chain(str(cert), str(key))
    with socket.create_connection(("127.0.0.1", broker.controller), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                tls.settimeout(2.0)
                try:
                    return tls.recv(1) != b""  # EOF: closed by the server
                except TimeoutError:
                    return True  # still open, waiting for a Kafka request: accepted
        except (ssl.SSLError, ConnectionResetError):
            return False


def test_secrets_never_appear_in_peerwatch_config(area: Area, tmp_path: Path) -> None:
    password = area.broker.password_file("peerwatch-agent").read_text().strip()
    env = {**os.environ, "PEERWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "PEERWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "PEERWATCH_KAFKA_SASL_USERNAME": "peerwatch-agent",
           "PEERWATCH_KAFKA_SASL_PASSWORD": password,
           "PEERWATCH_SIGNING_KEY_FILE": str(area.key_file)}  # fmt: skip
    cli = Path(sys.executable).with_name("peerwatch")
    out = subprocess.run([str(cli), "config"], env=env,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert "peerwatch-agent" in out.stdout  # the user is shown, its password is not
    assert password not in out.stdout + out.stderr
    assert area.key_file.read_text().strip() not in out.stdout + out.stderr


# -- provenance: a forged recommendation never drains a node ---------------------------------


@pytest.mark.parametrize("enforce", [False, True], ids=["shadow", "enforce"])
def test_forged_recommendation_never_drains_a_node(
    area: Area, idle_node: SlurmCluster, tmp_path: Path, enforce: bool
) -> None:
    node = idle_node.node

    def rec(rid: str) -> bytes:
        return REC.encode({
            "recommendation_id": f"{area.prefix}{rid}", "node": node,
            "ts_ms": int(time.time() * 1000), "action": "DRAIN", "severity": "CRITICAL",
            "hard": True, "reason": f"xid 79 ({rid})", "job_ids": ["5001"], "partition": "gpu",
        })  # fmt: skip

    topic, key = area.topic(RECOMMENDATIONS), node.encode()
    genuine = rec("genuine")
    stolen = area.signer().headers(key, rec("other"))  # a real signature, of another record
    wrong_key = Signer(SigningKey("k1", secrets.token_bytes(32))).headers(key, genuine)
    # Written by the super user: a principal other than the stream's that the ACLs let through.
    admin = area.role("admin")
    assert produce(admin, [(topic, key, rec("unsigned"))]) == [None]
    assert produce(admin, [(topic, key, rec("wrong-key"))], wrong_key) == [None]
    assert produce(admin, [(topic, key, rec("tampered"))], stolen) == [None]
    assert produce(admin, [(topic, key, genuine)], [("peerwatch.sig.kid", b"k9"),
                                                   ("peerwatch.sig", b"\0" * 32)]) == [None]  # fmt: skip
    slurm = CountingSlurm(idle_node.bin_dir)
    settings = drain_settings(area, tmp_path, enforce)
    run_controller(area, settings, slurm, commits=4, verifier=area.verifier())
    audit = actions(area, 4)
    assert [a["decision"] for a in audit] == ["REFUSED"] * 4
    assert {a["refusal"] for a in audit} == {"unverified_source"}
    assert [a["detail"].split(":")[1].strip() for a in audit] == [
        "unsigned", "forged", "forged", "forged"]  # fmt: skip
    assert slurm.drains == []
    facts = {n.name: n for n in slurm.nodes()}[node]
    assert not facts.drained

    # The same content signed by the stream's key and written by the stream is acted on. Its
    # evidence is taken now: the controller saw the node resumed (by the fixture) at its first
    # look, and evidence older than an operator's resume never drains.
    genuine = rec("genuine")
    signed = area.signer().headers(key, genuine)
    assert produce(area.role("stream"), [(topic, key, genuine)], signed) == [None]
    run_controller(area, settings, slurm, commits=1, verifier=area.verifier())
    last = actions(area, 5)[4]
    assert last["decision"] == ("DRAINED" if enforce else "SHADOWED"), (
        last["refusal"],
        last["detail"],
    )
    assert len(slurm.drains) == (1 if enforce else 0)


def test_topics_and_acls_commands_set_up_a_prefix_as_the_admin(broker: LocalKafka) -> None:
    prefix = f"c{uuid.uuid4().hex[:8]}."
    admin = broker.client_settings()
    env = {**os.environ, "PEERWATCH_TOPIC_PREFIX": prefix,
           "PEERWATCH_KAFKA_BOOTSTRAP": broker.bootstrap,
           "PEERWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "PEERWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
           "PEERWATCH_KAFKA_SASL_USERNAME": ADMIN_USER,
           "PEERWATCH_KAFKA_SASL_PASSWORD_FILE": str(admin.sasl_password_file),
           "PEERWATCH_KAFKA_SSL_CA_LOCATION": str(admin.ssl_ca_location)}  # fmt: skip
    cli = str(Path(sys.executable).with_name("peerwatch"))
    for args in (["topics", "create"], ["topics", "acls", "--apply"]):
        out = subprocess.run([cli, *args], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    want = bindings(default_users(), topic_prefix=prefix, app_id=prefix + APP)
    assert f"applied {len(want)} ACL bindings" in out.stdout
    # In force: the agent writes its samples under the prefix and no one else's topic.
    agent = broker.client_settings("peerwatch-agent")
    assert produce(agent, [(prefix + SAMPLES.name, b"n", b"x")]) == [None]
    [err] = produce(agent, [(prefix + RECOMMENDATIONS.name, b"n", b"x")])
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
