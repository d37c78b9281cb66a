"""Fixtures for integration tests: real Kafka, real Slurm (and later the real collector).

``kafka_bootstrap`` takes, in order: ``$PEERWATCH_KAFKA_BOOTSTRAP``; a testcontainers broker when a
Docker engine answers; else the project's own broker (``peerwatch kafka start``), on test ports,
started here and stopped at the end. Nothing here skips: a missing service is a failure.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import tempfile
import uuid
from collections.abc import Iterator

import pytest

from peerwatch.local.kafka import LocalKafka, metadata_ready
from peerwatch.settings import KafkaSettings, expand

# Fixture modules are imported here: pytest_plugins is not allowed below the rootdir.
from tests.integration.collector_fixture import otel_collector  # noqa: F401
from tests.integration.prometheus_fixture import prometheus_stack  # noqa: F401
from tests.integration.slurm_fixture import slurm_cluster  # noqa: F401

TEST_KAFKA_PORT = int(os.environ.get("PEERWATCH_TEST_KAFKA_PORT", "19092"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def _docker_answers() -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        # No engine. (Asking the docker client would leak the socket of its failed connect,
        # a ResourceWarning that fails whichever test the garbage collector happens to end.)
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception:  # any failure means "no usable engine"
        return False
    return True


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """A reachable Kafka bootstrap address (real Apache Kafka)."""
    configured = os.environ.get("PEERWATCH_KAFKA_BOOTSTRAP")
    if configured:
        if not metadata_ready(configured, timeout_s=10):
            pytest.fail(f"PEERWATCH_KAFKA_BOOTSTRAP={configured} does not answer")
        yield configured
        return
    if _docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer("confluentinc/cp-kafka:8.0.0").with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    state = pathlib.Path(tempfile.mkdtemp(prefix="peerwatch-test-kafka-"))
    kafka = LocalKafka(
        cache_dir=expand(os.environ.get("PEERWATCH_CACHE_DIR", "~/.cache/peerwatch")),
        state_dir=state,
        port=TEST_KAFKA_PORT,
        controller_port=TEST_KAFKA_PORT + 1,
    )
    kafka.start()
    try:
        yield kafka.bootstrap
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_settings(kafka_bootstrap: str) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=kafka_bootstrap, client_id="peerwatch-tests")


@pytest.fixture
def topic_prefix() -> str:
    """A unique prefix so each test's topics and groups never see another test's records."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    _OUR_PREFIXES.add(prefix)
    return prefix


#: The prefixes :func:`topic_prefix` gave out in this process, and the shape of any such prefix:
#: another pytest process on the same broker (an engineer's run beside CI's) makes topics under
#: prefixes of the same shape, which the cleanup below must leave alone.
_OUR_PREFIXES: set[str] = set()
_PREFIX_SHAPE = re.compile(r"^t[0-9a-f]{10}\.")


def _ours(topic: str) -> bool:
    """Whether this process may delete ``topic``: not under another process's test prefix."""
    shape = _PREFIX_SHAPE.match(topic)
    return shape is None or shape.group(0) in _OUR_PREFIXES


def _topic_names(bootstrap: str) -> set[str] | None:
    from confluent_kafka.admin import AdminClient

    try:
        return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)
    except Exception:  # the broker is a test's subject elsewhere; no cleanup then
        return None


@pytest.fixture(scope="module", autouse=True)
def _drop_the_modules_topics() -> Iterator[None]:
    """Delete, after each module, the topics its tests made on the shared broker. A broker keeps
    an open file per partition: the whole suite's topics (each test makes the catalogue under a
    prefix of its own, about 200 partitions) passed the 20,000 open files this machine allows a
    process, and the broker shut down mid-suite. No session fixture makes topics, so a module's
    topics are its own."""
    bootstrap = os.environ.get("PEERWATCH_KAFKA_BOOTSTRAP")
    before = _topic_names(bootstrap) if bootstrap else None
    yield
    if not bootstrap or before is None:
        return
    after = _topic_names(bootstrap)
    made = sorted(t for t in (after or set()) - before if not t.startswith("__") and _ours(t))
    if made:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_topics(made, operation_timeout=60).values():
            with contextlib.suppress(Exception):
                future.result(60)
