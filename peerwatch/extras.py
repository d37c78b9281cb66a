"""Which pip extra provides which optional module: one table for the install docs and the CLI.

peerwatch installs per role (docs/operations.md, "Install"): the base (Kafka client and Avro) is
what every node needs; the rest comes with an extra. A command of a role that is not installed
fails with :class:`MissingExtraError` naming the extra to install, never with a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

from peerwatch.errors import PeerwatchError

#: Top-level module -> the extra that installs it (pyproject.toml ``optional-dependencies``).
EXTRA_OF_MODULE: dict[str, str] = {
    "pynvml": "agent",
    "numpy": "stream",
    "numba": "stream",
    "llvmlite": "stream",
    "faust": "stream",
    "mode": "stream",
    "aiokafka": "stream",
    "zstandard": "archive",
    "opentelemetry": "telemetry",
    "httpx": "export",
    "cryptography": "local",
    "grpc": "telemetry",
    # confluent_kafka.schema_registry's own dependencies (confluent-kafka[schemaregistry])
    "authlib": "registry",
    "attrs": "registry",
    "cachetools": "registry",
}


class MissingExtraError(PeerwatchError):
    """A module of an extra that is not installed; ``extra`` names it."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f"needs the Python module {module!r}, which the {extra!r} extra installs: "
            f"pip install 'peerwatch[{extra}]'"
        )
        self.module = module
        self.extra = extra


def missing_extra(exc: ModuleNotFoundError) -> MissingExtraError | None:
    """The :class:`MissingExtraError` for ``exc`` when its module belongs to an extra, else None
    (a module peerwatch itself lacks is a bug and must stay a traceback)."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    return MissingExtraError(top, extra) if extra else None
