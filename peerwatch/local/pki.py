"""A private certificate authority for the local secured broker (``peerwatch kafka start --secure``).

:func:`make_ca` writes a self-signed CA; :func:`issue` writes a certificate signed by it, for a
server (``127.0.0.1`` and ``localhost`` as subject alternative names, so clients verifying the
host name accept it) or a client. Keys are EC P-256, written unencrypted in PKCS#8 PEM with mode
0600: the files themselves are the secret, readable by the service user only. Nothing here is
meant for a public PKI: it is the project's own small CA for one machine's broker and tests.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Validity of the CA and of the certificates it issues (days).
VALID_DAYS = 825


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by its owner only (created so: never world-readable)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # new folders: the owner's only
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load(files: CertFiles) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{files.key} is not an EC key")
    return cert, key


def make_ca(directory: Path, common_name: str = "peerwatch local CA") -> CertFiles:
    """Write a self-signed CA (``ca.pem``, ``ca.key``) into ``directory``, or keep the one there.
    Raises OSError when the directory cannot be written."""
    files = CertFiles(directory / "ca.pem", directory / "ca.key")
    if files.cert.exists() and files.key.exists():
        return files
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    write_private(files.key, _key_pem(key))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return files


def issue(ca: CertFiles, directory: Path, name: str, *, server: bool) -> CertFiles:
    """Write ``<name>.pem`` (the certificate followed by the CA's: a chain) and ``<name>.key``
    signed by ``ca``; a server certificate names 127.0.0.1 and localhost. Keeps existing files.
    Raises OSError or ValueError (an unreadable CA)."""
    files = CertFiles(directory / f"{name}.pem", directory / f"{name}.key")
    if files.cert.exists() and files.key.exists():
        return files
    ca_cert, ca_key = _load(ca)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # A broker is a client too (of its own controller listener): both usages.
        .add_extension(
            x509.ExtendedKeyUsage([usage, ExtendedKeyUsageOID.CLIENT_AUTH] if server else [usage]),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    write_private(files.key, _key_pem(key))
    files.cert.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + ca_cert.public_bytes(serialization.Encoding.PEM)
    )
    return files
