"""The egress proxy (orchestrator/sandbox/egress/) with real clients: curl through the
runner's own loopback relay (agent_runner/relay.py), and raw requests on its socket for the
attacks: what the policy allows is fetched, everything else refused with its reason; IP
literals, private addresses, the installation's own ports, smuggled lengths, upgrades,
methods, the run's bytes and connections."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_runner.relay import UnixRelay
from orchestrator.sandbox.egress import REFUSED_HEADER, EgressProxy, Limits, parse_resolve
from orchestrator.sandbox.egress_policy import EgressPolicy, host_refusal, parse_network_option

HOST = "files.internal.test"


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def files(tmp_path: Path) -> Iterator[int]:
    """A web server on a loopback port serving hello.txt and big.bin; its port."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "hello.txt").write_text("hello from the files host\n")
    (root / "big.bin").write_bytes(b"x" * 300_000)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: _Files(*a, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def proxy(tmp_path: Path, port: int, policy: EgressPolicy, **kwargs: object) -> EgressProxy:
    folder = tmp_path / "run"
    folder.mkdir(exist_ok=True)
    resolve = parse_resolve([f"{HOST}:{port}:127.0.0.1"])
    return EgressProxy(folder / "egress.sock", policy, resolve=resolve, **kwargs)  # type: ignore[arg-type]


def curl(relay: UnixRelay, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "-sS", "-i", "--max-time", "10", "--proxy", relay.base_url, *args],
        capture_output=True,
        text=True,
        timeout=20,
    )


def raw(sock_path: Path, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(sock_path))
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed before the whole request was read: its answer is waiting
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


ALLOW = parse_network_option(f"allowlist:{HOST}")


def test_curl_fetches_what_the_allowlist_names_and_is_refused_the_rest(tmp_path: Path, files: int) -> None:
    with proxy(tmp_path, files, ALLOW) as p, UnixRelay(str(p.socket_path)) as relay:
        ok = curl(relay, f"http://{HOST}:{files}/hello.txt")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.startswith("HTTP/1.0 200") and ok.stdout.endswith("hello from the files host\n")
        other = curl(relay, f"http://other.internal.test:{files}/")
        assert other.stdout.startswith("HTTP/1.1 403") and f"{REFUSED_HEADER}: refused" in other.stdout
        assert f"egress refused: other.internal.test:{files} is not on this group's allowlist" in other.stdout
        # HTTPS goes through CONNECT: the tunnel is refused for a host off the list (curl says so).
        tls = curl(relay, "https://example.com/")
        assert tls.returncode != 0 and "403" in tls.stderr
    decisions = [(d.method, d.host, d.allowed) for d in p.decisions]
    assert decisions == [("GET", HOST, True), ("GET", "other.internal.test", False), ("CONNECT", "example.com", False)]
    assert p.decisions[0].received > 25


def test_a_connect_tunnel_to_an_allowed_host_carries_the_bytes(tmp_path: Path, files: int) -> None:
    with proxy(tmp_path, files, ALLOW) as p:
        reply = raw(
            p.socket_path,
            f"CONNECT {HOST}:{files} HTTP/1.1\r\nHost: {HOST}:{files}\r\n\r\n"
            f"GET /hello.txt HTTP/1.0\r\nHost: {HOST}\r\n\r\n".encode(),
        )
    assert reply.startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.0 200")
    assert reply.endswith(b"hello from the files host\n")


@pytest.mark.parametrize(
    ("request_bytes", "status", "why"),
    [
        (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: x\r\n\r\n", 403, b"127.0.0.1 is an IP address"),
        (b"CONNECT [::1]:22 HTTP/1.1\r\nHost: x\r\n\r\n", 403, b"::1 is an IP address"),
        (b"GET http://127.0.0.1:80/ HTTP/1.1\r\nHost: x\r\n\r\n", 403, b"is an IP address"),
        (
            b"POST http://files.internal.test:1/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            400,
            b"malformed request",
        ),
        (
            b"POST http://files.internal.test:1/ HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
            b"malformed request",
        ),
        (b"GET https://files.internal.test/ HTTP/1.1\r\nHost: x\r\n\r\n", 400, b"goes through CONNECT"),
        (b"GET /relative HTTP/1.1\r\nHost: files.internal.test\r\n\r\n", 400, b"names an http:// URL"),
        (b"GET http://user:pw@files.internal.test/ HTTP/1.1\r\nHost: x\r\n\r\n", 400, b"credentials"),
        (
            b"GET http://files.internal.test:1/ HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n",
            400,
            b"malformed request",
        ),
    ],
    ids=[
        "ipv4-literal",
        "ipv6-literal",
        "plain-literal",
        "two-lengths",
        "chunked-and-length",
        "https-plain",
        "origin-form",
        "credentials",
        "huge-header",
    ],
)
def test_attacks_on_the_request_are_refused(tmp_path: Path, request_bytes: bytes, status: int, why: bytes) -> None:
    with proxy(tmp_path, 1, ALLOW) as p:
        reply = raw(p.socket_path, request_bytes)
    assert reply.startswith(b"HTTP/1.1 %d " % status) and why in reply, reply[:300]


def test_names_must_resolve_to_public_addresses_and_the_installations_ports_stay_shut(tmp_path: Path) -> None:
    policy = parse_network_option("allowlist:*.internal.test")
    answers = {"private.internal.test": ["10.1.2.3"], "mapped.internal.test": ["::ffff:127.0.0.1"]}
    with proxy(tmp_path, 1, policy, resolver=lambda host, port: answers[host]) as p:
        for name, why in (("private", b"non-public address (10.1.2.3)"), ("mapped", b"non-public address")):
            reply = raw(p.socket_path, f"CONNECT {name}.internal.test:443 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert reply.startswith(b"HTTP/1.1 403") and why in reply
    own = EgressProxy(
        tmp_path / "run" / "own.sock",
        policy,
        resolve=parse_resolve(["db.internal.test:5432:127.0.0.1"]),
        forbidden_ports=frozenset({5432}),
    )
    with own:
        reply = raw(own.socket_path, b"CONNECT db.internal.test:5432 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403") and b"this installation's own services" in reply


def test_methods_upgrades_and_off(tmp_path: Path, files: int) -> None:
    get_only = EgressPolicy(mode="allowlist", allow=[HOST], methods=["GET"])
    with proxy(tmp_path, files, get_only) as p:
        post = raw(
            p.socket_path, f"POST http://{HOST}:{files}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
        )
        tunnel = raw(p.socket_path, f"CONNECT {HOST}:{files} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        upgrade = raw(
            p.socket_path,
            f"GET http://{HOST}:{files}/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n".encode(),
        )
    assert b"the method POST is not among" in post and b"the method CONNECT is not among" in tunnel
    assert upgrade.startswith(b"HTTP/1.1 403") and b"upgrades are not forwarded" in upgrade
    with proxy(tmp_path, files, EgressPolicy()) as p:
        off = raw(p.socket_path, f"GET http://{HOST}:{files}/hello.txt HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert off.startswith(b"HTTP/1.1 403") and b"network policy is off" in off


def test_a_runs_bytes_and_requests_are_bounded(tmp_path: Path, files: int) -> None:
    small = EgressPolicy(mode="allowlist", allow=[HOST], max_bytes=100_000, max_requests=2)
    with proxy(tmp_path, files, small) as p:
        big = raw(p.socket_path, f"GET http://{HOST}:{files}/big.bin HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert len(big) < 100_000 < 300_000  # cut at the run's budget
        spent = raw(p.socket_path, f"GET http://{HOST}:{files}/hello.txt HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert b"bytes are spent" in spent
        third = raw(p.socket_path, f"GET http://{HOST}:{files}/hello.txt HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert b"2 requests are spent" in third


def test_a_name_is_resolved_once_and_the_checked_address_is_the_one_reached(tmp_path: Path, files: int) -> None:
    # A rebinding resolver: a reachable address first, a private one for any later question.
    answers = iter([["127.0.0.1"], ["10.9.9.9"], ["10.9.9.9"]])
    asked: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        asked.append(host)
        return next(answers)

    policy = parse_network_option("allowlist:rebind.internal.test")
    folder = tmp_path / "run"
    folder.mkdir()
    # Loopback stands in for a public address here (tests reach nothing else).
    with EgressProxy(folder / "egress.sock", policy, resolver=rebinding, allowed=lambda a: str(a) == "127.0.0.1") as p:
        reply = raw(
            p.socket_path, f"GET http://rebind.internal.test:{files}/hello.txt HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
    assert reply.endswith(b"hello from the files host\n") and asked == ["rebind.internal.test"]


def test_idle_connections_past_the_cap_are_closed_at_once(tmp_path: Path, files: int) -> None:
    with proxy(tmp_path, files, ALLOW, limits=Limits(max_connections=64, idle_s=30)) as p:
        held = []
        for _ in range(64):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(p.socket_path))
            held.append(s)
        # 1,000 more idle connections: each closed at once, none holding a task or a slot.
        extras = []
        for _ in range(1000):
            extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # Blocking: a connect waits while the listen backlog is full (a burst outruns accept).
            extra.connect(str(p.socket_path))
            extra.settimeout(5)
            extras.append(extra)
        assert all(extra.recv(1) == b"" for extra in extras)  # closed without a word
        assert p.run.connections == 64
        for s in [*held, *extras]:
            s.close()


def test_rules_and_the_command_lines_spelling() -> None:
    policy = parse_network_option("allowlist:*.github.com,example.com:8443,preset:package-indexes")
    assert host_refusal(policy, "api.github.com", 443) is None
    assert host_refusal(policy, "github.com", 443) is not None  # *. is below the name, not the name
    assert host_refusal(policy, "example.com", 8443) is None and host_refusal(policy, "example.com", 443) is not None
    assert host_refusal(policy, "PyPI.org.", 443) is None  # a preset's, any case, a trailing dot
    assert parse_network_option("off") == EgressPolicy()
    for bad in ("allowlist:", "allowlist:10.0.0.1", "allowlist:exa mple.com", "open", "allowlist:preset:nope"):
        with pytest.raises(ValueError):
            parse_network_option(bad)
