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
# What this API's clients send with a change while no token is set (orchestrator/http/guards.py).
CLIENT = {"x-orchestrator-client": "tests"}
CLIENT_LINE = "X-Orchestrator-Client: tests"


@contextmanager
def _server(db: Database, settings: Settings, **changes: object) -> Iterator[str]:
    if JID not in {g.chat_jid for g in list_groups(db)}:
        add_group(db, chat_jid=JID, name="Guard", folder="guard", requires_trigger=True)
    # No extra Host names unless a test gives some (the fixture's "testserver" is TestClient's).
    app = create_app(
        Orchestrator(settings.replace(**{"api_max_request_bytes": LIMIT, "api_allowed_hosts": "", **changes}))
    )
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
        status, headers, body = _raw(
            base,
            f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\n{CLIENT_LINE}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {10 * 2**20}",
        )
        assert status == 413 and headers["connection"] == "close"
        assert str(LIMIT) in json.loads(body)["detail"]
        # The same on a route with no body at all, and on the signed webhook.
        # Not a number (\xb2 is "²", a digit to str.isdigit): refused, never a 500.
        for length in ("12x", "\xb2", "-1"):
            status, _, _ = _raw(
                base, f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\n{CLIENT_LINE}\r\nContent-Length: {length}"
            )
            assert status == 400, length
        for path in ("/api/info", "/webhooks/inbound", "/health"):
            status, _, _ = _raw(
                base, f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{CLIENT_LINE}\r\nContent-Length: {LIMIT + 1}"
            )
            assert status == 413, path
        # At the cap it is read and stored.
        padded = _message("x" * (LIMIT - len(_message("")) - 10))
        ok = httpx.post(f"{base}/api/messages", content=padded, headers={"content-type": "application/json", **CLIENT})
        assert ok.status_code == 201, ok.text
    assert len(get_messages_after(JID, 0, db=db)) == 1


def _chunked(payload: bytes, size: int = 1000) -> bytes:
    parts = [payload[i : i + size] for i in range(0, len(payload), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_a_chunked_body_is_cut_off_at_the_cap(db: Database, settings: Settings) -> None:
    with _server(db, settings) as base:
        host = urlsplit(base).netloc
        head = (
            f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\n{CLIENT_LINE}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked"
        )
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
        wrong = httpx.post(
            f"{base}/api/messages", content=b"{not json", headers={**garbage, "authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401 and wrong.json() == {"detail": "missing or wrong bearer token"}
        right = httpx.post(
            f"{base}/api/messages", content=b"{not json", headers={**garbage, "authorization": f"Bearer {TOKEN}"}
        )
        assert right.status_code == 400
        assert httpx.get(f"{base}/metrics").status_code == 401
        # What needs no token still answers without one.
        assert httpx.get(f"{base}/health").status_code == 200


def test_without_a_token_only_this_machines_names_are_served(db: Database, settings: Settings) -> None:
    """DNS rebinding: a page on evil.example, its name re-pointed at 127.0.0.1, is same-origin
    with the API in the victim's browser; the browser sends ``Host: evil.example:PORT``."""
    with _server(db, settings) as base:
        port = urlsplit(base).port
        for evil in (
            f"evil.example:{port}",
            "evil.example",
            f"127.0.0.1.evil.example:{port}",
            f"localhost.:{port}",
            f"[::ffff:7f00:1]x:{port}",
            "",
        ):
            status, _, body = _raw(
                base,
                f"POST /api/messages HTTP/1.1\r\nHost: {evil}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(_message())}",
                _message(),
            )
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


@pytest.mark.parametrize(
    ("header", "name", "local"),
    [
        ("127.0.0.1:8000", "127.0.0.1", True),
        ("localhost", "localhost", True),
        ("[::1]:80", "::1", True),
        ("Localhost:1", "localhost", True),
        ("10.0.0.1:80", "10.0.0.1", False),
        ("evil.example:80", "evil.example", False),
        ("localhost:x", "localhost:x", False),
        ("[::1", "::1", True),
        ("", "", False),
    ],
)
def test_host_names(header: str, name: str, local: bool) -> None:
    assert host_name(header) == name
    assert is_local_name(host_name(header)) is local


# -- cross-site requests (no token: loopback) -------------------------------------------------


def _post_json(base: str, path: str, body: bytes | None = None, **headers: str) -> httpx.Response:
    sent = {"content-type": "application/json", **headers} if body is not None else headers
    return httpx.post(f"{base}{path}", content=body or b"", headers=sent)


def test_without_a_token_another_sites_page_cannot_change_anything(db: Database, settings: Settings) -> None:
    """A page the operator visits posts to the loopback API: an HTML form (no custom header
    possible), or a fetch with a body of no JSON type (no CORS preflight; FastAPI before 0.132
    read such a body as JSON).  Refused before any route runs, as is a change that lacks the
    client header; this API's own clients (the CLI, the page: same origin) get through."""
    with _server(db, settings) as base:
        port = urlsplit(base).port
        evil = {"origin": "https://evil.example", **CLIENT}
        # A foreign Origin, with or without the header, with or without a JSON type.
        for headers in (
            evil,
            {"origin": "https://evil.example"},
            {"origin": "null", **CLIENT},
            {"origin": f"http://localhost:{port}", **CLIENT},  # another origin of this machine
            {"origin": f"http://127.0.0.1:{port + 1}", **CLIENT},
        ):
            r = _post_json(base, "/api/messages", _message(), **headers)
            assert r.status_code == 403, (headers, r.text)
            assert "Origin" in r.json()["detail"] or "X-Orchestrator-Client" in r.json()["detail"], r.text
        r = httpx.post(f"{base}/api/messages", content=_message(), headers=evil)  # no Content-Type at all
        assert r.status_code == 403 and "Origin: https://evil.example" in r.json()["detail"], r.text
        r = httpx.post(f"{base}/api/messages", content=_message(), headers={"content-type": "text/plain", **evil})
        assert r.status_code == 403, r.text
        # What the browser says of the page that sent it.
        for site in ("cross-site", "same-site", "Cross-Site"):
            r = _post_json(base, "/api/messages", _message(), **{"sec-fetch-site": site, **CLIENT})
            assert r.status_code == 403 and "Sec-Fetch-Site" in r.json()["detail"], (site, r.text)
        # No Origin, no Sec-Fetch-Site: a form can't, but curl can: the header is still needed.
        r = _post_json(base, "/api/messages", _message())
        assert r.status_code == 403 and "missing header X-Orchestrator-Client" in r.json()["detail"], r.text
        host = urlsplit(base).netloc
        for blank in ("", " \t"):
            status, _, body = _raw(
                base,
                f"POST /api/messages HTTP/1.1\r\nHost: {host}\r\nX-Orchestrator-Client:{blank}"
                f"\r\nContent-Type: application/json\r\nContent-Length: {len(_message())}",
                _message(),
            )
            assert status == 403, (blank, body)
        assert get_messages_after(JID, 0, db=db) == []
        # This API's clients: the header, from no page or from the API's own.
        assert _post_json(base, "/api/messages", _message("from the cli"), **CLIENT).status_code == 201
        own = {"origin": base, "sec-fetch-site": "same-origin", **CLIENT}
        assert _post_json(base, "/api/messages", _message("from the page"), **own).status_code == 201
        assert (
            _post_json(
                base, "/api/messages", _message("a bookmark"), **{"sec-fetch-site": "none", **CLIENT}
            ).status_code
            == 201
        )
        # Reading needs none of it (a page of another site cannot read the answer anyway).
        assert httpx.get(f"{base}/api/groups", headers={"origin": "https://evil.example"}).status_code == 200
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["from the cli", "from the page", "a bookmark"]


def test_regenerate_truncate_and_other_bodiless_changes_are_guarded_too(db: Database, settings: Settings) -> None:
    with _server(db, settings) as base:
        assert _post_json(base, "/api/messages", _message("q"), **CLIENT).status_code == 201
        [q] = get_messages_after(JID, 0, db=db)
        for action in ("regenerate", "truncate"):
            path = f"/api/chats/{JID}/messages/{q.id}/{action}"
            for headers in (
                {},
                {"origin": "https://evil.example", **CLIENT},
                {"sec-fetch-site": "cross-site", **CLIENT},
            ):
                r = httpx.post(f"{base}{path}", headers=headers)
                assert r.status_code == 403, (action, headers, r.text)
            # With the header the route runs (a person's message cannot be regenerated: its 409).
            r = httpx.post(f"{base}{path}", headers=CLIENT)
            assert r.status_code == (409 if action == "regenerate" else 200), (action, r.text)
        r = httpx.patch(f"{base}/api/groups/{JID}", json={"name": "renamed"})
        assert r.status_code == 403
        assert httpx.patch(f"{base}/api/groups/{JID}", json={"name": "renamed"}, headers=CLIENT).status_code == 200
        assert (
            httpx.request("DELETE", f"{base}/api/groups/{JID}", headers={"origin": "https://evil.example"}).status_code
            == 403
        )


def test_a_token_or_a_signature_stands_in_for_the_client_header(db: Database, settings: Settings) -> None:
    from orchestrator.channels.webhook import INBOUND_PATH, inbound_headers

    secret = "inbound-secret-for-guards"
    with _server(db, settings, webhook_inbound_secret=secret) as base:
        # The signed webhook's sender is another system, not a page: its signature is its proof.
        raw = _message("signed")
        r = _post_json(base, INBOUND_PATH, raw, **inbound_headers(secret, raw))
        assert r.status_code == 201, r.text
        unsigned = _post_json(base, INBOUND_PATH, raw, origin="https://evil.example")
        assert unsigned.status_code == 401, unsigned.text  # its own refusal, not the guard's
        assert _post_json(base, "/slack/events", b"{}", origin="https://evil.example").status_code != 403
    with _server(db, settings, api_token=TOKEN) as base:
        # With a token set, the token is what a page of another site cannot have.
        r = _post_json(base, "/api/messages", _message("with a token"), authorization=f"Bearer {TOKEN}")
        assert r.status_code == 201, r.text
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["signed", "with a token"]


def test_a_body_of_no_json_type_is_never_read_as_json(db: Database, settings: Settings) -> None:
    """FastAPI before 0.132 parsed a body without a Content-Type as JSON: the pin excludes it
    (a fetch of another site sends such a body without a preflight)."""
    import tomllib
    from importlib.metadata import version
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    [pin] = [Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "fastapi"]
    assert not pin.specifier.contains("0.131.0") and pin.specifier.contains(version("fastapi"))
    with _server(db, settings) as base:
        r = httpx.post(f"{base}/api/messages", content=_message(), headers=CLIENT)
        assert r.status_code == 400, r.text
        r = httpx.post(f"{base}/api/messages", content=_message(), headers={"content-type": "text/plain", **CLIENT})
        assert r.status_code == 400, r.text
    assert get_messages_after(JID, 0, db=db) == []
