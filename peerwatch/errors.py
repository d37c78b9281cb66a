"""The documented exception hierarchy. Library errors are translated into these at the boundary.

PeerwatchError
├── ConfigError            a setting is invalid; ``field`` names it
├── CodecError             a record could not be encoded or decoded
│   ├── UnknownSchemaError     the writer-schema fingerprint (or registry id) is not known
│   ├── CorruptRecordError     the bytes are not a valid record (bad magic, truncated, garbage)
│   └── EncodeError            a value does not fit the schema
├── TopicError             a topic does not exist or does not match the catalogue
└── ServiceError           a local service (Kafka, Slurm, collector) could not be started or reached
    ├── KafkaAuthError         Kafka refused this client's credentials or the TLS handshake
    └── SlurmCommandError      a Slurm command could not run, timed out, exited non-zero, or its
                               answer could not be read
"""

from __future__ import annotations


class PeerwatchError(Exception):
    """Base of every error peerwatch raises on purpose."""


class ConfigError(PeerwatchError):
    """A setting is invalid. ``field`` is the dotted name of the setting at fault."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class CodecError(PeerwatchError):
    """A record could not be encoded or decoded."""


class UnknownSchemaError(CodecError):
    """The record names a writer schema (fingerprint or registry id) this codec does not know."""


class CorruptRecordError(CodecError):
    """The bytes are not a valid record: wrong magic, truncated, or not decodable."""


class EncodeError(CodecError):
    """A value does not fit the schema it is encoded with."""


class TopicError(PeerwatchError):
    """A topic does not exist or its configuration differs from the catalogue."""


class ServiceError(PeerwatchError):
    """A local service (Kafka, Slurm, the collector) could not be started, stopped or reached."""


class KafkaAuthError(ServiceError):
    """Kafka refused this client: wrong SASL user or password, or a TLS handshake that failed
    (a broker certificate from another CA). Retrying cannot help; the message names the cause."""


class SlurmCommandError(ServiceError):
    """A Slurm command could not be run, timed out, exited non-zero (stderr in the message), or
    printed something the caller cannot read."""
