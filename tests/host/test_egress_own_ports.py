"""The installation's own ports stay shut to a sandbox whichever way a name reaches this host
(orchestrator/sandbox/egress/, issue 44): not only through an ``ORCHESTRATOR_EGRESS_RESOLVE``
entry, but through the resolver too, when an allowed name resolves to loopback, 0.0.0.0 or an
address of one of the host's interfaces (a host whose public address is its own).  The real
proxy on a unix socket, real servers on this machine; the resolver and the address policy are
the test's (``allowed`` stands in for "the host's own address is public")."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.sandbox.egress import EgressProxy, Limits
from orchestrator.sandbox.egress_policy import parse_network_option
from tests.host.test_addresses import interface_address

NAME, FAR = "www.example.test", "far.example.test"
POLICY = parse_network_option(f"allowlist:{NAME},{FAR}")


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"reached the service\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def services() -> Iterator[tuple[int, int]]:
    """Two web servers on every IPv4 address of this machine: the port of one that stands for
    the installation's own service (the database, the API), and the port of an ordinary one."""
    servers = [http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Hello) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield servers[0].server_address[1], servers[1].server_address[1]
    for server in servers:
        server.shutdown()
        server.server_close()


def _local_addresses() -> list[str]:
    found = ["127.0.0.1", "127.0.0.2", "0.0.0.0", "::ffff:127.0.0.1"]
    interface = interface_address()
    return [*found, interface] if interface else found


def ask(sock_path: Path, request: bytes) -> bytes:
    """The proxy's answer to ``request``: all it sends until it closes, or what came within a
    few seconds (a tunnel it opened stays open)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(3)
        s.connect(str(sock_path))
        s.sendall(request)
        out = b""
        with contextlib.suppress(TimeoutError):
            while chunk := s.recv(65536):
                out += chunk
        return out


@pytest.mark.parametrize("address", _local_addresses())
def test_a_name_resolving_to_this_host_reaches_no_own_port(
    tmp_path: Path, services: tuple[int, int], address: str
) -> None:
    own, other = services
    asked: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return [address] if host == NAME else ["198.51.100.7"]  # far: no address of this host

    proxy = EgressProxy(
        tmp_path / "egress.sock",
        POLICY,
        limits=Limits(connect_s=0.5),
        forbidden_ports=frozenset({own}),
        resolver=resolver,
        allowed=lambda a: True,
    )
    with proxy:
        plain = ask(proxy.socket_path, f"GET http://{NAME}:{own}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        tunnel = ask(proxy.socket_path, f"CONNECT {NAME}:{own} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        fine = ask(proxy.socket_path, f"GET http://{NAME}:{other}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        # A remote service's port may have the same number as one of ours: not refused for it.
        ask(proxy.socket_path, f"GET http://{FAR}:{own}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    for refused in (plain, tunnel):
        assert refused.startswith(b"HTTP/1.1 403"), refused
        assert b"resolves to this host" in refused and b"one of this installation's own services" in refused
        assert b"reached the service" not in refused
    assert b" 200 " in fine.split(b"\r\n")[0] and fine.endswith(b"reached the service\n"), fine
    assert asked == [NAME] * 3 + [FAR]
    reasons = [d.reason for d in proxy.decisions]
    assert [d.allowed for d in proxy.decisions] == [False, False, True, True], reasons
    assert "own services" not in reasons[3]
