"""A real single-node Apache Kafka (KRaft) on loopback, from Maven Central jars, without Docker.

The jars are resolved with Maven into a cache outside any repository (``<cache>/kafka/<version>``),
so a machine downloads them once. Data, configuration, the pid file and the broker log live in
``<state>/kafka-<port>``. ``start`` reports ready only when a client can fetch metadata.

Secured mode (``secure=True``, ``peerwatch kafka start --secure``): one SASL_SSL listener
(SCRAM-SHA-512 over TLS, a certificate from the project's own CA, :mod:`peerwatch.local.pki`),
the KRaft controller listener on mutual TLS (SCRAM credentials live in the metadata log, so the
controller listener cannot use them), KRaft's ``StandardAuthorizer`` with
``allow.everyone.if.no.acl.found=false``, and super users ``admin`` and the broker's own
certificate. The admin's SCRAM credential is written into the metadata at format time (through a
Java argument file, never on a command line); the role users of :data:`peerwatch.acls.ROLES` are
created through the admin API once the broker answers. Every password is a random one in
``<home>/credentials/<user>.password`` (mode 0600), the CA and the certificates are in
``<home>/tls``.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from peerwatch.errors import ServiceError
from peerwatch.local.process import ServiceFiles, launch, port_in_use, raise_open_files_limit

if TYPE_CHECKING:
    from peerwatch.settings import KafkaSettings

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.25.3"
# Kafka 4.1 resolves slf4j-api 1.7.x, so the matching log4j binding is log4j-slf4j-impl.
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.peerwatch.local</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version></dependency>
  </dependencies>
</project>
"""
_LOG4J2 = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Logger name="kafka" level="INFO"/>
    <Logger name="org.apache.kafka" level="INFO"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Root level="WARN"><AppenderRef ref="stdout"/></Root>
  </Loggers>
</Configuration>
"""


#: The secured broker's super user (``peerwatch topics acls --apply`` runs as it).
ADMIN_USER = "admin"
#: The broker's certificate name; its principal on the controller listener is ``User:CN=<it>``.
BROKER_CN = "peerwatch-broker"

#: The controller's default port is the broker's + this: 9192 beside 9092, clear of 9093, which
#: is Alertmanager's (``peerwatch alertmanager start``), and of a second broker's ports.
CONTROLLER_PORT_OFFSET = 100


@dataclass(frozen=True)
class LocalKafka(ServiceFiles):
    """A broker on ``127.0.0.1:port`` with its KRaft controller on ``controller_port`` (default:
    the broker's port + :data:`CONTROLLER_PORT_OFFSET`)."""

    name: ClassVar[str] = "kafka"

    cache_dir: Path
    state_dir: Path
    port: int = 9092
    controller_port: int | None = None
    version: str = KAFKA_VERSION
    heap: str = "-Xms512m -Xmx1g"
    #: SASL_SSL + SCRAM-SHA-512 + ACLs instead of PLAINTEXT (see the module doc).
    secure: bool = False
    #: Secured mode: the SCRAM users created besides the admin (default: one per role).
    users: tuple[str, ...] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def tls_dir(self) -> Path:
        return self.home / "tls"

    @property
    def credentials_dir(self) -> Path:
        return self.home / "credentials"

    def password_file(self, user: str) -> Path:
        """The file holding ``user``'s SCRAM password (secured mode; 0600)."""
        return self.credentials_dir / f"{user}.password"

    def role_users(self) -> tuple[str, ...]:
        from peerwatch.acls import default_users

        return self.users if self.users is not None else tuple(default_users().values())

    def client_settings(self, user: str = ADMIN_USER, **kw: Any) -> KafkaSettings:
        """KafkaSettings of a client of this broker; secured: as ``user``, with its password
        file and the local CA. Raises OSError when the user has no password file."""
        from peerwatch.settings import KafkaSettings

        if not self.secure:
            return KafkaSettings(bootstrap_servers=self.bootstrap, **kw)
        return KafkaSettings(
            bootstrap_servers=self.bootstrap, security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512", sasl_username=user,
            sasl_password_file=str(self.password_file(user)),
            ssl_ca_location=str(self.tls_dir / "ca.pem"), **kw,
        )  # fmt: skip

    def _password(self, user: str) -> str:
        """``user``'s password, made (random, 0600 file) the first time it is asked for."""
        path = self.password_file(user)
        if not path.exists():
            from peerwatch.local.pki import write_private

            write_private(path, secrets.token_urlsafe(24).encode())
        return path.read_text().strip()

    @property
    def controller(self) -> int:
        """The KRaft controller's port."""
        if self.controller_port is not None:
            return self.controller_port
        return self.port + CONTROLLER_PORT_OFFSET

    @property
    def libs_dir(self) -> Path:
        return self.cache_dir / "kafka" / self.version / "libs"

    @property
    def home(self) -> Path:
        return self.state_dir / f"kafka-{self.port}"

    # -- download -------------------------------------------------------------------------------
    def fetch(self) -> Path:
        """Resolve the Kafka jars into the cache (once). Raises ServiceError if Maven fails."""
        marker = self.libs_dir / ".complete"
        if marker.exists():
            return self.libs_dir
        mvn = shutil.which("mvn")
        if mvn is None or shutil.which("java") is None:
            raise ServiceError("Kafka needs Java 17+ and Maven on PATH (apt-get install maven)")
        work = self.libs_dir.parent
        work.mkdir(parents=True, exist_ok=True)
        (work / "pom.xml").write_text(_POM.format(kafka=self.version, log4j=LOG4J_VERSION))
        proc = subprocess.run(
            [mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={self.libs_dir}"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise ServiceError(
                f"Maven could not resolve Kafka {self.version}:\n{proc.stdout[-3000:]}"
            )
        marker.write_text(self.version + "\n")
        return self.libs_dir

    # -- lifecycle ------------------------------------------------------------------------------
    def _java(self, *args: str, heap: bool = False) -> list[str]:
        java = shutil.which("java") or "java"
        opts = self.heap.split() if heap else ["-Xmx256m"]
        return [
            java, *opts, f"-Dlog4j2.configurationFile={self.home / 'log4j2.xml'}",
            "-cp", f"{self.libs_dir}/*", *args,
        ]  # fmt: skip

    def _write_config(self) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "log4j2.xml").write_text(_LOG4J2)
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.home / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "12",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Topics are created explicitly from the catalogue; auto-creation hides mistakes.
            "auto.create.topics.enable": "false",
            "log.segment.bytes": str(64 * 1024 * 1024),
            "log.retention.check.interval.ms": "60000",
        }
        if self.secure:
            props.update(self._secure_props())
        path = self.home / "server.properties"
        from peerwatch.local.pki import write_private

        # Secured, it holds the admin's password (inter-broker SASL): the owner's alone.
        write_private(path, "".join(f"{k}={v}\n" for k, v in props.items()).encode())
        return path

    def _secure_props(self) -> dict[str, str]:
        from peerwatch.local.pki import issue, make_ca

        ca = make_ca(self.tls_dir)
        broker = issue(ca, self.tls_dir, BROKER_CN, server=True)
        keystore = self.tls_dir / "broker.keystore.pem"  # Kafka's PEM keystore: key + chain
        if not keystore.exists():
            from peerwatch.local.pki import write_private

            write_private(keystore, broker.key.read_bytes() + broker.cert.read_bytes())
        admin_password = self._password(ADMIN_USER)
        jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{ADMIN_USER}" password="{admin_password}";')  # fmt: skip
        return {
            "listeners": f"SASL_SSL://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(ca.cert),
            # The controller listener accepts the broker's own certificate only.
            "listener.name.controller.ssl.client.auth": "required",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER};User:CN={BROKER_CN}",
        }

    def _format(self, config: Path) -> None:
        if (self.home / "data" / "meta.properties").exists():
            return
        cluster_id = _cluster_id()
        args = [
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={cluster_id}",
            "-c",
            str(config),
        ]
        argfile = self.home / "format.args"
        if self.secure:
            # The admin must exist before the broker starts (it is the inter-broker user); its
            # password goes in a Java argument file (0600, removed after), never in argv.
            scram = f"SCRAM-SHA-512=[name={ADMIN_USER},password={self._password(ADMIN_USER)}]"
            from peerwatch.local.pki import write_private

            java, *rest = self._java(*args, "--add-scram", scram)
            write_private(argfile, "\n".join(_argfile_quote(a) for a in rest).encode())
            argv = [java, f"@{argfile}"]
        else:
            argv = self._java(*args)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        finally:
            argfile.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise ServiceError(f"formatting KRaft storage failed:\n{proc.stdout}\n{proc.stderr}")

    def ready(self, timeout_s: float = 2.0) -> bool:
        """True when a client (secured: the admin) can fetch metadata from the broker."""
        if not self.secure:
            return metadata_ready(self.bootstrap, timeout_s)
        from peerwatch.kafka_config import admin_config

        return metadata_ready(self.bootstrap, timeout_s, admin_config(self.client_settings()))

    def start(self, timeout_s: float = 300.0) -> str:
        """Start the broker (idempotent) and return 'started' or 'running'.

        Raises ServiceError with the log's tail when it does not become ready within ``timeout_s``.
        """
        if self.pid() is not None and self.ready():
            return "running"
        if port_in_use(self.port):
            raise ServiceError(f"127.0.0.1:{self.port} is in use by another process; use --port")
        if port_in_use(self.controller):
            raise ServiceError(f"127.0.0.1:{self.controller} (the KRaft controller) is in use by "
                               "another process; use --controller-port")  # fmt: skip
        self.fetch()
        config = self._write_config()
        self._format(config)
        raise_open_files_limit()  # the broker inherits it
        launch("Kafka", self._java("kafka.Kafka", str(config), heap=True), pid_file=self.pid_file,
               log_file=self.log_file, ready=lambda: self.ready(timeout_s=1.0),
               timeout_s=timeout_s)  # fmt: skip
        if self.secure:
            self.ensure_users()
        return "started"

    def ensure_users(self, timeout_s: float = 30.0) -> None:
        """Secured mode: create (or reset to its file's password) every role user's SCRAM
        credential through the admin API. Raises ServiceError when Kafka refuses or is silent."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialAlteration,
            UserScramCredentialUpsertion,
        )

        from peerwatch.kafka_config import admin_config

        upserts: list[UserScramCredentialAlteration] = [
            UserScramCredentialUpsertion(
                user,
                ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                self._password(user).encode(),
            )
            for user in self.role_users()
        ]
        if not upserts:
            return
        admin = AdminClient(admin_config(self.client_settings()))
        futures = admin.alter_user_scram_credentials(upserts, request_timeout=timeout_s)
        for user, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except Exception as exc:  # KafkaException or a timeout: either way, no user
                raise ServiceError(f"cannot create SCRAM user {user}: {exc}") from exc

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return f"running (pid {pid}, {self.bootstrap})" if self.ready() else f"starting (pid {pid})"


def metadata_ready(
    bootstrap: str, timeout_s: float = 2.0, client: Mapping[str, Any] | None = None
) -> bool:
    """True when a Kafka client (configured with ``client``, e.g. credentials) can fetch cluster
    metadata with a broker in it."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not port_in_use(int(port), host):
        return False  # nothing listens yet: spare librdkafka's connection-refused log lines
    from peerwatch.kafka_config import client_logger

    conf: dict[str, Any] = {
        **(client or {}),
        "bootstrap.servers": bootstrap,
        "socket.connection.setup.timeout.ms": 1000,
        "log_level": 0,
        "logger": client_logger(),
    }
    admin = AdminClient(conf)
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException:
        return False
    return bool(md.brokers)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding (22 characters).
    Never one starting with "-" (one in 64 would): the storage tool's argument parser takes it
    for an option, as Kafka's own ``Uuid.randomUuid`` avoids too."""
    import base64

    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _argfile_quote(arg: str) -> str:
    """One argument of a Java ``@argfile``: double-quoted, backslashes and quotes escaped."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
