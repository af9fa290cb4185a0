"""The API's request guard under attack, on a real uvicorn server, on both databases.

What orchestrator/http/guards.py checks before any route sees a request: a
body over ``ORCHESTRATOR_API_MAX_REQUEST_BYTES`` refused before it is read
(a declared length and a chunked stream), the token before the body is read
or parsed, and, while no token is set, a ``Host`` that names this machine
(DNS rebinding).  The requests are written on raw sockets where what matters
is what the server did *not* wait for.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.guards import host_name, is_local_name
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, list_groups
from orchestrator.store.message_log import get_messages_after
from tests.live_server import serve

JID = "guard@local"
TOKEN = "guard-token-5d1e"
LIMIT = 8192


@contextmanager
def _server(db: Database, settings: Settings, **changes: object) -> Iterator[str]:
    if JID not in {g.chat_jid for g in list_groups(db)}:
        add_group(db, chat_jid=JID, name="Guard", folder="guard", requires_trigger=True)
    # No extra Host names unless a test gives some (the fixture's "testserver" is TestClient's).
    app = create_app(Orchestrator(settings.replace(**{"api_max_request_bytes": LIMIT, "api_allowed_hosts": "",
                                                      **changes})))
    with serve(app) as base:
        yield base


def _raw(base: str, head: str, body: bytes = b"", *, wait_s: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` (request line and headers, CRLF-joined, no final blank line) and ``body``
    on a fresh connection; the status, headers and body of the answer, read within ``wait_s``
    (a server that waits for a body never sent fails here with a timeout)."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=wait_s) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed without answering: {data!r}"
            data += chunk
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(lines[0].split()[1]), headers, rest


def _message(content: str = "hi") -> bytes:
    return json.dumps({"chat_jid": JID, "sender": "u1", "content": content}).encode()


def test_a_declared_length_over_the_cap_is_refused_before_the_body_is_read(db: Database, settings: Settings) -> None:
    with _server(db, settings) as base:
        host = urlsplit(base).netloc
        # Ten megabytes announced, none sent: the answer comes at once.
        status, headers, body = _raw(base, f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\n"
                                           f"Content-Type: application/json\r\nContent-Length: {10 * 2**20}")
        assert status == 413 and headers["connection"] == "close"
        assert str(LIMIT) in json.loads(body)["detail"]
        # The same on a route with no body at all, and on the signed webhook.
        # Not a number (\xb2 is "²", a digit to str.isdigit): refused, never a 500.
        for length in ("12x", "\xb2", "-1"):
            status, _, _ = _raw(base, f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\nContent-Length: {length}")
            assert status == 400, length
        for path in ("/api/info", "/webhooks/inbound", "/health"):
            status, _, _ = _raw(base, f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {LIMIT + 1}")
            assert status == 413, path
        # At the cap it is read and stored.
        padded = _message("x" * (LIMIT - len(_message("")) - 10))
        ok = httpx.post(f"{base}/api/messages", content=padded, headers={"content-type": "application/json"})
        assert ok.status_code == 201, ok.text
    assert len(get_messages_after(JID, 0, db=db)) == 1


def _chunked(payload: bytes, size: int = 1000) -> bytes:
    parts = [payload[i:i + size] for i in range(0, len(payload), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_a_chunked_body_is_cut_off_at_the_cap(db: Database, settings: Settings) -> None:
    with _server(db, settings) as base:
        host = urlsplit(base).netloc
        head = f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n" \
               "Transfer-Encoding: chunked"
        # Past the cap (with no end in sight: only the first chunks are ever sent): 413.
        big = _message("y" * (LIMIT * 4))
        status, headers, _ = _raw(base, head, _chunked(big)[: LIMIT + 4096])
        assert status == 413 and headers["connection"] == "close"
        assert get_messages_after(JID, 0, db=db) == []
        # Under it, the route reads the body it was handed, whole.
        status, _, body = _raw(base, head, _chunked(_message("chunked and small")))
        assert status == 201, body
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "chunked and small"


def test_the_token_is_checked_before_the_body_is_read_or_parsed(db: Database, settings: Settings) -> None:
    with _server(db, settings, api_token=TOKEN) as base:
        host = urlsplit(base).netloc
        # A body announced and never sent: without the token, the answer does not wait for it.
        status, headers, _ = _raw(base, f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\nContent-Length: 4000")
        assert status == 401 and headers["www-authenticate"] == "Bearer"
        # Not parsed: garbage is a 401, not the parser's 400; with the token it is the 400.
        garbage = {"content-type": "application/json"}
        assert httpx.post(f"{base}/api/messages", content=b"{not json", headers=garbage).status_code == 401
        wrong = httpx.post(f"{base}/api/messages", content=b"{not json",
                           headers={**garbage, "authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json() == {"detail": "missing or wrong bearer token"}
        right = httpx.post(f"{base}/api/messages", content=b"{not json",
                           headers={**garbage, "authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 400
        assert httpx.get(f"{base}/metrics").status_code == 401
        # What needs no token still answers without one.
        assert httpx.get(f"{base}/health").status_code == 200


def test_without_a_token_only_this_machines_names_are_served(db: Database, settings: Settings) -> None:
    """DNS rebinding: a page on evil.example, its name re-pointed at 127.0.0.1, is same-origin
    with the API in the victim's browser; the browser sends ``Host: evil.example:PORT``."""
    with _server(db, settings) as base:
        port = urlsplit(base).port
        for evil in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"localhost.:{port}",
                     f"[::ffff:7f00:1]x:{port}", ""):
            status, _, body = _raw(base, f"POST /api/messages HTTP/1.1\r\nHost: {evil}\r\n"
                                         f"Content-Type: application/json\r\nContent-Length: {len(_message())}",
                                   _message())
            assert status == 403, (evil, body)
            assert "Host" in json.loads(body)["detail"]
            status, _, _ = _raw(base, f"GET /api/groups HTTP/1.1\r\nHost: {evil}")
            assert status == 403, evil
        assert get_messages_after(JID, 0, db=db) == []
        for name in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}", "127.0.0.2"):
            status, _, body = _raw(base, f"GET /api/groups HTTP/1.1\r\nHost: {name}")
            assert status == 200, (name, body)
    with _server(db, settings, api_allowed_hosts="orchestrator.lan") as base:
        port = urlsplit(base).port
        assert _raw(base, f"GET /api/groups HTTP/1.1\r\nHost: orchestrator.lan:{port}")[0] == 200
        assert _raw(base, f"GET /api/groups HTTP/1.1\r\nHost: evil.example:{port}")[0] == 403


def test_with_a_token_any_host_is_served(db: Database, settings: Settings) -> None:
    # The token is what a rebinding page cannot have; a fleet's API is reached by any name.
    with _server(db, settings, api_token=TOKEN) as base:
        status, _, _ = _raw(base, f"GET /api/groups HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer {TOKEN}")
        assert status == 200


@pytest.mark.parametrize(("header", "name", "local"), [
    ("127.0.0.1:8000", "127.0.0.1", True), ("localhost", "localhost", True), ("[::1]:80", "::1", True),
    ("Localhost:1", "localhost", True), ("10.0.0.1:80", "10.0.0.1", False), ("evil.example:80", "evil.example", False),
    ("localhost:x", "localhost:x", False), ("[::1", "::1", True), ("", "", False),
])
def test_host_names(header: str, name: str, local: bool) -> None:
    assert host_name(header) == name
    assert is_local_name(host_name(header)) is local
