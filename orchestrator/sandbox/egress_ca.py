"""The installation's egress CA: the certificates the egress proxy ends TLS with, for the
brokered hosts only (``sandbox/egress_credentials.py``).

The CA lives in ``<data dir>/egress-ca`` (0700; its key 0600), a folder no container ever
mounts (the groups', sessions' and runs' folders are its siblings; on a fleet's shared
storage it is as private as the database file).  Its certificate is limited by X.509 name
constraints to the brokered hosts it was made for: a sandbox that trusts it trusts it for
those names and no other; a credential for a host outside them makes a new CA
(``ensure_ca``), as ``orchestrator egress rotate-ca`` does on demand.  The proxy mints a
short-lived leaf certificate per host and per run; only the CA's certificate, never a key,
reaches a sandbox (a bundle with the system's CAs, in the run's host-only folder).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orchestrator.core.errors import ConfigError

CA_DIR = "egress-ca"
CA_CERT, CA_KEY = "ca.crt", "ca.key"
CA_DAYS = 365
LEAF_HOURS = 24
# Where a system keeps its CA bundle, for the sandbox's bundle (the system's CAs and ours).
SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


@dataclass(frozen=True)
class InstallationCA:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    folder: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def covers(self, hosts: Iterable[str]) -> bool:
        """Whether the CA's name constraints permit every one of ``hosts``."""
        try:
            constraints = self.cert.extensions.get_extension_for_class(x509.NameConstraints).value
        except x509.ExtensionNotFound:
            return False
        permitted = {n.value for n in constraints.permitted_subtrees or [] if isinstance(n, x509.DNSName)}
        return all(h in permitted for h in hosts)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a fresh leaf certificate for ``host``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=LEAF_HOURS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # load_cert_chain reads files: the leaf's key goes to a private file of the CA's folder
        # (never a mounted one) for the moment it is read, and is removed.
        fd, path = tempfile.mkstemp(dir=self.folder, prefix=".leaf-", suffix=".pem")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(
                    key.private_bytes(
                        serialization.Encoding.PEM,
                        serialization.PrivateFormat.PKCS8,
                        serialization.NoEncryption(),
                    )
                )
                out.write(leaf.public_bytes(serialization.Encoding.PEM))
            context.load_cert_chain(path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return context


def _private_folder(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def _new_ca(folder: Path, hosts: list[str], label: str) -> InstallationCA:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"orchestrator egress CA {label}")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        # Only the brokered hosts: trusted for them, for no other name.
        .add_extension(
            x509.NameConstraints(permitted_subtrees=[x509.DNSName(h) for h in hosts], excluded_subtrees=None),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_path = folder / CA_KEY
    tmp = folder / f".{CA_KEY}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    os.replace(tmp, key_path)
    (folder / CA_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return InstallationCA(cert, key, folder)


def ensure_ca(data_dir: Path, hosts: Iterable[str], *, label: str = "", rotate: bool = False) -> InstallationCA:
    """The installation's CA, made (or made anew) when missing, expiring within a week, not
    covering ``hosts``, or ``rotate``."""
    folder = _private_folder(data_dir / CA_DIR)
    wanted = sorted(set(hosts))
    if not rotate and (folder / CA_CERT).is_file() and (folder / CA_KEY).is_file():
        cert = x509.load_pem_x509_certificate((folder / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((folder / CA_KEY).read_bytes(), password=None)
        soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=7)
        if isinstance(key, ec.EllipticCurvePrivateKey) and cert.not_valid_after_utc > soon:
            ca = InstallationCA(cert, key, folder)
            if ca.covers(wanted):
                return ca
    return _new_ca(folder, wanted or ["invalid"], label)


def certificates_of(path: str) -> bytes:
    """The certificates of the PEM file at ``path`` (``ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE``),
    as PEM, and nothing else of it: a private key kept in the same file never goes further.
    :class:`ConfigError` for a file that cannot be read or holds no certificate."""
    try:
        certs = x509.load_pem_x509_certificates(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE={path}: no PEM certificate read ({exc})") from exc
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def sandbox_bundle(ca: InstallationCA | None, dest: Path, *, also: bytes = b"") -> Path:
    """The CA bundle a sandbox trusts: the system's CAs, the installation's egress CA (for
    the brokered hosts, when there are some) and ``also`` (PEM certificates: the operator's
    CA for a host reached through a tunnel, :func:`certificates_of`), certificates only,
    written to ``dest`` (a host-only folder's file)."""
    system = b""
    for path in (ssl.get_default_verify_paths().cafile, *SYSTEM_BUNDLES):
        if path and os.path.isfile(path):
            system = Path(path).read_bytes()
            break
    ours = (ca.cert_pem if ca is not None else b"") + also
    dest.write_bytes(system.rstrip(b"\n") + b"\n" + ours)
    os.chmod(dest, 0o644)
    return dest
