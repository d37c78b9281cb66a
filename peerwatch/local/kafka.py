"""A real single-node Apache Kafka (KRaft) on loopback, from Maven Central jars, without Docker.

The jars are resolved with Maven into a cache outside any repository (``<cache>/kafka/<version>``),
so a machine downloads them once. Data, configuration, the pid file and the broker log live in
``<state>/kafka-<port>``. ``start`` reports ready only when a client can fetch metadata.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from peerwatch.errors import ServiceError
from peerwatch.local.process import ServiceFiles, launch, port_in_use

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

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

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
        path = self.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _format(self, config: Path) -> None:
        if (self.home / "data" / "meta.properties").exists():
            return
        cluster_id = _cluster_id()
        proc = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(config)),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise ServiceError(f"formatting KRaft storage failed:\n{proc.stdout}\n{proc.stderr}")

    def ready(self, timeout_s: float = 2.0) -> bool:
        """True when a client can fetch metadata from the broker."""
        return metadata_ready(self.bootstrap, timeout_s)

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
        launch("Kafka", self._java("kafka.Kafka", str(config), heap=True), pid_file=self.pid_file,
               log_file=self.log_file, ready=lambda: self.ready(timeout_s=1.0),
               timeout_s=timeout_s)  # fmt: skip
        return "started"

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return f"running (pid {pid}, {self.bootstrap})" if self.ready() else f"starting (pid {pid})"


def metadata_ready(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when a Kafka client can fetch cluster metadata with a broker in it."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not port_in_use(int(port), host):
        return False  # nothing listens yet: spare librdkafka's connection-refused log lines
    from peerwatch.kafka_config import client_logger

    conf: dict[str, Any] = {
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
