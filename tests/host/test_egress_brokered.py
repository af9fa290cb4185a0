"""Brokered credentials (orchestrator/sandbox/egress_credentials.py, egress_ca.py, egress/):
curl through the runner's relay to a local HTTPS server (its certificate from a test CA the
proxy trusts by ``ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE``): the server sees the secret, set by
the proxy over whatever the client sent; methods and paths outside the credential's are
refused inside the ended TLS; other hosts are tunnelled untouched; the CA is private, limited
to the brokered hosts by name constraints, and the secret is masked like every secret."""

from __future__ import annotations

import datetime
import http.server
import json
import ssl
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent_runner.relay import UnixRelay
from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.sandbox.egress import egress_proxy
from orchestrator.sandbox.egress_ca import CA_DIR, CA_KEY, ensure_ca, sandbox_bundle
from orchestrator.sandbox.egress_policy import parse_network_option

SECRET = "Bearer ghp_brokered_canary_4f1d"
API, PLAIN = "api.internal.test", "plain.internal.test"


def _cert(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    signer: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
    names: tuple[str, ...] = (API, PLAIN),
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
    return builder.sign(signer, hashes.SHA256())


def tls_for(folder: Path, names: tuple[str, ...] = (API, PLAIN)) -> tuple[Path, ssl.SSLContext]:
    """A test CA (its certificate in ``folder``/test-ca.pem, its key kept nowhere) and a TLS
    server context with its leaf certificate for ``names``."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test upstream CA")])
    ca = _cert("test upstream CA", ca_key, ca_name, ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = _cert(names[0], key, ca_name, ca_key, ca=False, names=names)
    ca_file, chain = folder / "test-ca.pem", folder / "server.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + leaf.public_bytes(serialization.Encoding.PEM)
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain)
    return ca_file, context


def recording_handler(seen: list[dict[str, str]]) -> type[http.server.BaseHTTPRequestHandler]:
    """A handler that answers 200 to GET and POST and keeps each request's path and headers."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
            body = b"secret area\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[tuple[int, Path, list[dict[str, str]]]]:
    """An HTTPS server for both names on a loopback port (a test CA's certificate); its port,
    the test CA's file, and the headers of each request it got."""
    ca_file, context = tls_for(tmp_path)
    seen: list[dict[str, str]] = []
    Handler = recording_handler(seen)  # noqa: N806 - a class

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server.server_address[1], ca_file, seen
    server.shutdown()
    server.server_close()


def settings_for(settings: Settings, port: int, ca_file: Path) -> Settings:
    credentials = [
        {"name": "github", "hosts": [API], "value": SECRET, "methods": ["GET"], "path_prefixes": ["/repos/acme/"]}
    ]
    return settings.replace(
        egress_credentials=json.dumps(credentials),
        egress_upstream_ca_file=str(ca_file),
        egress_resolve=f"{API}:{port}:127.0.0.1,{PLAIN}:{port}:127.0.0.1",
    )


def curl(relay: UnixRelay, cacert: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "--max-time", "10", "--proxy", relay.base_url, "--cacert", str(cacert), *args],
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_the_proxy_adds_the_secret_and_holds_it_to_its_methods_and_paths(
    tmp_path: Path, settings: Settings, upstream: tuple[int, Path, list[dict[str, str]]]
) -> None:
    port, test_ca, seen = upstream
    s = settings_for(settings, port, test_ca)
    s.ensure_dirs()
    policy = parse_network_option(f"allowlist:{PLAIN},credential:github")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with egress_proxy(s, run_dir / "egress.sock", policy) as proxy, UnixRelay(str(proxy.socket_path)) as relay:
        assert proxy.ca is not None
        bundle = sandbox_bundle(proxy.ca, run_dir / "egress-ca.pem")
        ok = curl(
            relay, bundle, "-H", "Authorization: Bearer forged-by-the-sandbox", f"https://{API}:{port}/repos/acme/x?q=1"
        )
        assert ok.returncode == 0 and ok.stdout == "secret area\n", ok.stderr
        elsewhere = curl(relay, bundle, "-i", f"https://{API}:{port}/orgs/other")
        posted = curl(relay, bundle, "-i", "-X", "POST", "-d", "x", f"https://{API}:{port}/repos/acme/x")
        # Another allowed host is tunnelled: its own certificate (the test CA's), no secret.
        plain = curl(relay, test_ca, f"https://{PLAIN}:{port}/")
    assert seen[0]["authorization"] == SECRET and seen[0]["path"] == "/repos/acme/x?q=1"
    # curl -i shows the tunnel's 200, then the answer from inside it.
    assert "HTTP/1.1 403" in elsewhere.stdout and "for paths under /repos/acme/ only" in elsewhere.stdout
    assert "HTTP/1.1 403" in posted.stdout and "for GET only, not POST" in posted.stdout
    assert plain.returncode == 0 and plain.stdout == "secret area\n", plain.stderr
    assert len(seen) == 2 and "authorization" not in seen[1]
    logged = [(d.method, d.host, d.path, d.allowed) for d in proxy.decisions]
    assert ("GET", API, "/repos/acme/x", True) in logged  # the path without its query
    assert ("GET", API, "/orgs/other", False) in logged and ("POST", API, "/repos/acme/x", False) in logged
    assert all(SECRET not in d.reason for d in proxy.decisions)


def test_a_tunnelled_host_of_the_operators_ca_is_trusted_by_the_sandbox_bundle(
    tmp_path: Path, settings: Settings, upstream: tuple[int, Path, list[dict[str, str]]]
) -> None:
    """``ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE`` (an on-premise host's CA) is in the sandbox's
    bundle with no credential at all: curl verifies a tunnelled host's certificate with it,
    and not without it."""
    port, test_ca, seen = upstream
    s = settings.replace(egress_upstream_ca_file=str(test_ca), egress_resolve=f"{PLAIN}:{port}:127.0.0.1")
    s.ensure_dirs()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with egress_proxy(s, run_dir / "egress.sock", parse_network_option(f"allowlist:{PLAIN}")) as proxy:
        assert proxy.ca is None and proxy.sandbox_trust == test_ca.read_bytes()
        bundle = sandbox_bundle(proxy.ca, run_dir / "egress-ca.pem", also=proxy.sandbox_trust)
        system_only = sandbox_bundle(None, run_dir / "system.pem")
        with UnixRelay(str(proxy.socket_path)) as relay:
            trusted = curl(relay, bundle, f"https://{PLAIN}:{port}/")
            untrusted = curl(relay, system_only, f"https://{PLAIN}:{port}/")
    assert trusted.returncode == 0 and trusted.stdout == "secret area\n", trusted.stderr
    assert untrusted.returncode != 0 and "certificate" in untrusted.stderr  # verified, not waved through
    assert len(seen) == 1 and "authorization" not in seen[0]
    assert [(d.method, d.host, d.path, d.allowed) for d in proxy.decisions] == [("CONNECT", PLAIN, None, True)] * 2


def test_a_key_beside_the_operators_ca_never_reaches_the_sandbox(tmp_path: Path, settings: Settings) -> None:
    """A CA file that also holds a private key (an operator's mistake, or a combined PEM): only
    its certificates go into the sandbox's bundle; a file with no certificate is refused."""
    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "on-premise CA")])
    cert_pem = _cert("on-premise CA", key, name, key, ca=True).public_bytes(serialization.Encoding.PEM)
    combined = tmp_path / "combined.pem"
    combined.write_bytes(key_pem + cert_pem)
    s = settings.replace(egress_upstream_ca_file=str(combined))
    s.ensure_dirs()
    proxy = egress_proxy(s, tmp_path / "egress.sock", parse_network_option("allowlist:example.org"))
    assert proxy.sandbox_trust == cert_pem
    bundle = sandbox_bundle(proxy.ca, tmp_path / "egress-ca.pem", also=proxy.sandbox_trust).read_bytes()
    assert cert_pem in bundle and b"PRIVATE KEY" not in bundle
    only_key = tmp_path / "key.pem"
    only_key.write_bytes(key_pem)
    for path in (only_key, tmp_path / "missing.pem"):
        with pytest.raises(ConfigError, match="ORCHESTRATOR_EGRESS_UPSTREAM_CA_FILE"):
            egress_proxy(settings.replace(egress_upstream_ca_file=str(path)), tmp_path / "e.sock", proxy.policy)


def test_the_ca_is_private_and_good_for_the_brokered_hosts_only(tmp_path: Path) -> None:
    ca = ensure_ca(tmp_path, [API])
    folder = tmp_path / CA_DIR
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE((folder / CA_KEY).stat().st_mode) == 0o600
    assert ensure_ca(tmp_path, [API]).cert == ca.cert  # kept while it covers them
    assert ensure_ca(tmp_path, [API, "other.internal.test"]).cert != ca.cert  # made anew for a new host
    ca = ensure_ca(tmp_path, [API])
    trust = ssl.create_default_context(cafile=None, cadata=ca.cert_pem.decode())
    for name, ok in ((API, True), ("evil.internal.test", False)):
        server_ctx = ca.server_context(name)
        a, b = __import__("socket").socketpair()
        result: list[BaseException | None] = []

        def serve() -> None:
            try:
                with server_ctx.wrap_socket(a, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError) as exc:
                result.append(exc)

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with trust.wrap_socket(b, server_hostname=name) as tls:
                tls.sendall(b"x")
            client_ok = True
        except ssl.SSLCertVerificationError:
            client_ok = False
        thread.join(5)
        a.close()
        assert client_ok is ok, name  # OpenSSL holds the CA to its name constraints


def test_the_secret_is_masked_like_every_secret(settings: Settings) -> None:
    s = settings.replace(egress_credentials=json.dumps([{"name": "gh", "hosts": [API], "value": SECRET}]))
    assert SECRET in s.secrets()
    broken = settings.replace(egress_credentials='[{"name": "Bad Name", "hosts": [], "value": "' + SECRET + '"}]')
    assert SECRET in broken.secrets()
    from orchestrator.core.errors import SettingsError
    from orchestrator.sandbox.egress_credentials import parse_credentials

    with pytest.raises(SettingsError) as err:
        parse_credentials(broken.egress.credentials)
    assert SECRET not in str(err.value)
