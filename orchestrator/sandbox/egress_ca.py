"""The installation's egress CA: the certificates the egress proxy ends TLS with, for the
brokered hosts only (``sandbox/egress_credentials.py``).

The CA lives in ``<data dir>/egress-ca`` (0700), a folder no container ever mounts (the
groups', sessions' and runs' folders are its siblings; on a fleet's shared storage it is as
private as the database file).  Its key and its certificate are one file, ``ca.key`` (0600),
replaced whole (a temporary file renamed over it), and made or checked under a lock on the
folder: a worker that starts a run while another makes a new CA reads the old pair or the new
one, never a key with another CA's certificate.  ``ca.crt`` is a copy of the certificate for
people (``orchestrator egress ca``); nothing reads it back.

The certificate is limited by X.509 name constraints to the installation's brokered hosts,
every credential's of ``ORCHESTRATOR_EGRESS_CREDENTIALS`` (not a group's few): one CA for
every group and run, made anew only when that set changes, when it nears its end, or by
``orchestrator egress rotate-ca``.  A sandbox that trusts it trusts it for those names and no
other, and only the host holds its key: a sandbox cannot mint a certificate, not even for
another group's brokered host, and the proxy mints them (short-lived, per host and run) only
for the hosts its group's credentials name.  The constraints stay on the CA, not on the
leaves: on a leaf they would bind nobody who held the key.  Only the CA's certificate, never
a key, reaches a sandbox (a bundle with the system's CAs, in the run's host-only folder).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import ssl
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from orchestrator.core.errors import ConfigError
from orchestrator.sandbox.egress_credentials import BrokeredCredential

CA_DIR = "egress-ca"
# CA_KEY holds the key and the certificate (the pair, replaced as one); CA_CERT is a copy of the
# certificate alone, for people.
CA_CERT, CA_KEY = "ca.crt", "ca.key"
CA_LOCK = ".lock"
CA_DAYS = 365
# A CA this close to its end is made anew (a run's leaves must not outlive it).
CA_RENEW_DAYS = 7
LEAF_HOURS = 24
# The one name a CA made for no brokered host permits (RFC 6761: it resolves nowhere).
NO_HOST = "invalid"
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

    def permitted(self) -> frozenset[str]:
        """The DNS names the CA's name constraints permit (none without constraints)."""
        try:
            constraints = self.cert.extensions.get_extension_for_class(x509.NameConstraints).value
        except x509.ExtensionNotFound:
            return frozenset()
        return frozenset(n.value for n in constraints.permitted_subtrees or [] if isinstance(n, x509.DNSName))

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
                out.write(_key_pem(key))
                out.write(leaf.public_bytes(serialization.Encoding.PEM))
            context.load_cert_chain(path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return context


def credential_hosts(credentials: Iterable[BrokeredCredential]) -> list[str]:
    """Every host the installation's brokered credentials name: what its CA is made for."""
    return sorted({host for credential in credentials for host in credential.hosts})


def ensure_ca(data_dir: Path, hosts: Iterable[str], *, label: str = "", rotate: bool = False) -> InstallationCA:
    """The installation's CA for ``hosts`` (the installation's brokered hosts, all of them:
    :func:`credential_hosts`), made anew when missing, unreadable, expiring within a week,
    made for another set of hosts, or ``rotate``.  Safe when several processes call it at once."""
    folder = _private_folder(data_dir / CA_DIR)
    wanted = frozenset(hosts) or frozenset({NO_HOST})
    with _locked(folder):
        current = None if rotate else _read_pair(folder)
        if current is None or not _fits(current, wanted):
            current = _new_ca(folder, sorted(wanted), label)
            _write_pair(folder, current)
        _publish_cert(folder, current)
        return current


def _fits(ca: InstallationCA, wanted: frozenset[str]) -> bool:
    # Exactly the installation's hosts: a host no credential names any more is no longer one
    # the sandboxes trust the CA for.
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=CA_RENEW_DAYS)
    return ca.cert.not_valid_after_utc > soon and ca.permitted() == wanted


def _private_folder(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The CA's folder to this process alone (an advisory lock the other workers' ensure_ca take too)."""
    fd = os.open(folder / CA_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _read_pair(folder: Path) -> InstallationCA | None:
    """The CA in ``folder``, or None when there is none whole: missing, unreadable, or a key
    without its certificate (the two files of an older version) or with another's."""
    try:
        data = (folder / CA_KEY).read_bytes()
        key = serialization.load_pem_private_key(data, password=None)
        cert = x509.load_pem_x509_certificate(data)
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or _public(cert.public_key()) != _public(key.public_key()):
        return None
    return InstallationCA(cert, key, folder)


def _public(key: object) -> bytes:
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return b""
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _write_pair(folder: Path, ca: InstallationCA) -> None:
    _replace(folder, CA_KEY, _key_pem(ca.key) + ca.cert_pem, 0o600)


def _publish_cert(folder: Path, ca: InstallationCA) -> None:
    path = folder / CA_CERT
    with contextlib.suppress(OSError):
        if path.read_bytes() == ca.cert_pem:
            return
    _replace(folder, CA_CERT, ca.cert_pem, 0o644)


def _replace(folder: Path, name: str, data: bytes, mode: int) -> None:
    """``folder/name`` holding ``data``, at once: a reader sees the old content or the new, whole."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), mode)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, folder / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # The rename itself survives a crash only once the folder is on disk.
    with contextlib.suppress(OSError):  # a file system that cannot sync a folder: the rename stands
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


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
        # Only the installation's brokered hosts: trusted for them, for no other name.
        .add_extension(
            x509.NameConstraints(permitted_subtrees=[x509.DNSName(h) for h in hosts], excluded_subtrees=None),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return InstallationCA(cert, key, folder)


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
