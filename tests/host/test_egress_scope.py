"""Issue 44's findings in the egress proxy (orchestrator/sandbox/egress/, request_paths.py,
egress_credentials.py, egress_policy.py, run/questions.py):

1. a brokered credential stays in its path scope: an intercepted request's path is normalised
   once, before the scope is checked, and what goes upstream is exactly that path; every
   spelling that a server could resolve outside ``/repos/acme/`` is refused by the proxy (403
   with the reason) and reaches the upstream not at all, so never with the secret;
2. the sandbox does not choose the rule an Allow adds: a CONNECT target or a URL's host that
   is no host name a rule can name, or whose port is not one, is a 400 before any decision
   or question; an Allow adds only a valid host, through the container config's own
   validation, and never stores a config that does not parse.
"""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import update

from orchestrator.core.errors import BadInput, SettingsError
from orchestrator.core.settings import Settings
from orchestrator.run.questions import answer_question, ask_about_egress
from orchestrator.sandbox.config import parse_container_config
from orchestrator.sandbox.egress import REFUSED_HEADER, EgressProxy, egress_proxy, parse_resolve
from orchestrator.sandbox.egress_ca import sandbox_bundle
from orchestrator.sandbox.egress_credentials import parse_credentials
from orchestrator.sandbox.egress_policy import parse_network_option
from orchestrator.sandbox.request_paths import PathRefused, origin_target, path_under
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group, store_container_config
from orchestrator.store.questions import chat_questions, get_question
from orchestrator.store.tables import QuestionRow
from tests.host.test_egress import raw
from tests.host.test_egress_brokered import API, SECRET, recording_handler, settings_for, tls_for

Seen = list[dict[str, str]]


@pytest.fixture
def broker(tmp_path: Path, settings: Settings) -> Iterator[tuple[Callable[[bytes], bytes], Seen, EgressProxy]]:
    """The real proxy with the ``github`` credential (``/repos/acme/``, GET) for ``API``, whose
    upstream is a loopback HTTPS server recording every request it gets; a function that sends
    one request target through an intercepted CONNECT (as the sandbox would, bytes as given)
    and returns what the sandbox reads back."""
    ca_file, context = tls_for(tmp_path)
    seen: Seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), recording_handler(seen))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    port = server.server_address[1]
    s = settings_for(settings, port, ca_file)
    s.ensure_dirs()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proxy = egress_proxy(s, run_dir / "egress.sock", parse_network_option("allowlist:example.org,credential:github"))
    with proxy:
        assert proxy.ca is not None
        trust = ssl.create_default_context(cafile=str(sandbox_bundle(proxy.ca, run_dir / "egress-ca.pem")))

        def send(target: bytes) -> bytes:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(str(proxy.socket_path))
                sock.sendall(f"CONNECT {API}:{port} HTTP/1.1\r\nHost: {API}:{port}\r\n\r\n".encode())
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    head += sock.recv(1)  # byte by byte: the TLS that follows is not read here
                assert head.startswith(b"HTTP/1.1 200"), head
                with trust.wrap_socket(sock, server_hostname=API) as tls:
                    tls.sendall(
                        b"GET " + target + b" HTTP/1.1\r\nHost: " + API.encode() + b"\r\n"
                        b"Authorization: Bearer forged-by-the-sandbox\r\n\r\n"
                    )
                    out = b""
                    try:
                        while chunk := tls.recv(65536):
                            out += chunk
                    except (ssl.SSLError, ConnectionError):
                        pass
                    return out

        yield send, seen, proxy
    server.shutdown()
    server.server_close()


# Each resolves (for some server: RFC 3986's dot segments, nginx, Tomcat's ";", IIS's double
# decoding or fullwidth folding) outside /repos/acme/, or is no path at all.
ESCAPES: list[tuple[bytes, bytes]] = [
    (b"/repos/acme/../../orgs/other", b"dot segment"),
    (b"/repos/acme/%2e%2e/%2e%2e/orgs/other", b"dot segment"),
    (b"/repos/acme/%2E%2e/%2e%2E/orgs/other", b"dot segment"),
    (b"/repos/acme/.%2e/.%2e/orgs/other", b"dot segment"),
    (b"/repos/acme/%2e./%2e./orgs/other", b"dot segment"),
    (b"/repos/acme/./../../orgs/other", b"dot segment"),
    (b"/repos/acme/..", b"dot segment"),
    (b"/repos/acme/..;/..;/orgs/other", b"dot segment"),
    (b"/repos/acme/%2e%2e;x/%2e%2e;x/orgs/other", b"dot segment"),
    (b"/repos/acme/..%3b/..%3b/orgs/other", b"dot segment"),
    (b"/repos/acme/..%2f..%2forgs/other", b"encoded slash"),
    (b"/repos/acme/..%2F..%2Forgs/other", b"encoded slash"),
    (b"/repos/acme/..%5c..%5corgs/other", b"encoded backslash"),
    (b"/repos/acme/..%5C..%5Corgs/other", b"encoded backslash"),
    (b"/repos/acme/..\\..\\orgs/other", b"backslash"),
    (b"/repos/acme//../../orgs/other", b"empty segment"),
    (b"//repos/acme/../orgs/other", b"empty segment"),
    (b"/repos/acme/x//orgs/other", b"empty segment"),
    (b"/repos/acme/%c0%ae%c0%ae/%c0%ae%c0%ae/orgs/other", b"not UTF-8"),  # overlong "."
    (b"/repos/acme/%e0%80%ae%e0%80%ae/orgs/other", b"not UTF-8"),  # overlong "." in three bytes
    (b"/repos/acme/..%c0%af..%c0%aforgs/other", b"not UTF-8"),  # overlong "/"
    (b"/repos/acme/%252e%252e/%252e%252e/orgs/other", b"doubly percent-encoded"),
    (b"/repos/acme/%252f..", b"doubly percent-encoded"),
    (b"/repos/acme/%ef%bc%8e%ef%bc%8e/%ef%bc%8e%ef%bc%8e/orgs/other", b"dot segment"),  # fullwidth dots
    (b"/repos/acme/%e2%80%a5/orgs/other", b"dot segment"),  # U+2025, NFKC ".."
    (b"/repos/acme/..%ef%bc%8forgs", b"reads as a slash"),  # fullwidth solidus
    (b"/repos/acme/x%00/../../orgs", b"control character"),
    (b"/repos/acme/x%0d%0aX-Injected:%20yes", b"control character"),
    (b"/repos/acme/%zz/../orgs", b"malformed percent-encoding"),
    (b"/repos/acme/%2", b"malformed percent-encoding"),
    (b"/repos/acme/x#/../../orgs/other", b"fragment"),
    (b"/repos/acmeevil/x", b"for paths under /repos/acme/ only"),
    (b"/repos/acme", b"for paths under /repos/acme/ only"),
    (b"/orgs/other?/repos/acme/", b"for paths under /repos/acme/ only"),
    (b"https://" + API.encode() + b"/repos/acme/x", b"names a path"),
    (b"*", b"names a path"),
]


@pytest.mark.parametrize(("target", "why"), ESCAPES, ids=[t.decode() for t, _ in ESCAPES])
def test_a_credential_is_never_sent_outside_its_path_scope(
    broker: tuple[Callable[[bytes], bytes], Seen, EgressProxy], target: bytes, why: bytes
) -> None:
    send, seen, proxy = broker
    reply = send(target)
    assert reply.startswith(b"HTTP/1.1 403"), reply[:300]
    assert REFUSED_HEADER.lower().encode() + b": refused" in reply.lower() and why in reply, reply
    assert seen == []  # nothing reached the upstream: so never with the secret
    (decision,) = proxy.decisions[1:]  # the CONNECT, then the request inside it
    assert not decision.allowed and SECRET not in decision.reason


def test_an_allowed_path_arrives_normalised_with_its_query_as_sent(
    broker: tuple[Callable[[bytes], bytes], Seen, EgressProxy],
) -> None:
    send, seen, proxy = broker
    for target in (
        b"/repos/acme/%7Efoo",
        b"/repos/%61cme/x?q=%2e%2e/../%2f&r=%7E",
        b"/repos/acme/a%3ab%20c",
        b"/repos/acme/x;v=1/",
    ):
        reply = send(target)
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"secret area\n"), reply
    assert [r["path"] for r in seen] == [
        "/repos/acme/~foo",
        "/repos/acme/x?q=%2e%2e/../%2f&r=%7E",  # the path decoded; the query as it was sent
        "/repos/acme/a%3Ab%20c",  # reserved characters stay encoded (their hex in upper case)
        "/repos/acme/x;v=1/",
    ]
    assert all(r["authorization"] == SECRET for r in seen)
    logged = [d.path for d in proxy.decisions if d.method == "GET"]
    assert logged == ["/repos/acme/~foo", "/repos/acme/x", "/repos/acme/a%3Ab%20c", "/repos/acme/x;v=1/"]


def test_the_normal_form_and_whole_segment_prefixes() -> None:
    assert origin_target("/a/%7e%41%2d/b?x=%7e").target == "/a/~A-/b?x=%7e"
    assert origin_target("/a?").target == "/a?" and origin_target("/a").query is None
    assert origin_target("/").path == "/" and origin_target("/a/").path == "/a/"
    for bad in ("/a/..", "/a/.%2E/b", "/a/%2E", "a/b", "/a/%2fb", "/a\\b", "/a b", "/a/%7f"):
        with pytest.raises(PathRefused):
            origin_target(bad)
    # A prefix without a trailing slash holds itself and what is below it, by whole segments.
    assert path_under("/repos/acme", "/repos/acme") and path_under("/repos/acme/x", "/repos/acme")
    assert not path_under("/repos/acmeevil", "/repos/acme") and not path_under("/repos/acme-x/y", "/repos/acme")
    assert path_under("/repos/acme/x", "/repos/acme/") and not path_under("/repos/acme", "/repos/acme/")
    # The setting's prefixes are read in the same normal form; one that is no path is refused.
    (github,) = parse_credentials(
        json.dumps([{"name": "gh", "hosts": [API], "value": "v", "path_prefixes": ["/repos/%7Eacme"]}])
    )
    assert github.path_prefixes == ["/repos/~acme"]
    assert github.refusal("GET", "/repos/~acme/x") is None and github.refusal("GET", "/repos/~acme") is None
    assert github.refusal("GET", "/repos/~acmeevil") is not None
    for prefix in ("/repos/../x/", "/repos/%2f/", "/repos/?q"):
        with pytest.raises(SettingsError, match="path_prefixes"):
            parse_credentials(json.dumps([{"name": "gh", "hosts": [API], "value": "v", "path_prefixes": [prefix]}]))


class _Plain(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args: object) -> None:
        pass


def test_a_plain_requests_path_is_normalised_the_same_way(tmp_path: Path) -> None:
    host = "files.internal.test"
    seen: list[str] = []
    handler = type("Plain", (_Plain,), {"paths": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    port = server.server_address[1]
    folder = tmp_path / "run"
    folder.mkdir()
    resolve = parse_resolve([f"{host}:{port}:127.0.0.1"])
    try:
        with EgressProxy(folder / "egress.sock", parse_network_option(f"allowlist:{host}"), resolve=resolve) as p:
            ok = raw(p.socket_path, f"GET http://{host}:{port}/a/%7Eb?q=%2e HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            dots = raw(p.socket_path, f"GET http://{host}:{port}/a/%2e%2e/b HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    finally:
        server.shutdown()
        server.server_close()
    assert ok.endswith(b"ok\n") and seen == ["/a/~b?q=%2e"]
    assert dots.startswith(b"HTTP/1.1 403") and b"dot segment" in dots


# -- finding 2: the sandbox names no rule ------------------------------------------------------

TEAM = "team@g.us"
BAD_TARGETS = [
    "*.com:443",
    "under_score.example:443",
    "x.test:1:443",
    "*.github.com:443",
    "example.com..:443",
    ".example.com:443",
    "example.com:+443",
    "example.com: 443",
    "example.com:0",
    "example.com:65536",
    "example.com:",
    "example.com:\u0664\u0664\u0663",  # Arabic-Indic digits: int() takes them
    "127.1:443",  # inet_aton's spelling of 127.0.0.1
    "0x7f.1:443",
    "[example.com]:443",
    "exa%6dple.com:443",
]


def test_a_target_that_is_no_host_and_port_is_a_400_before_any_question(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    resolved: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return ["93.184.216.34"]

    with EgressProxy(folder / "egress.sock", parse_network_option("ask:files.internal.test"), resolver=resolver) as p:
        replies = {
            target: raw(p.socket_path, f"CONNECT {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            for target in BAD_TARGETS
        }
        plain = {
            url: raw(p.socket_path, f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            for url in ("http://*.com/", "http://under_score.example/", "http://x.test:1:443/", "http://x.test:99999/")
        }
        assert p.run.to_ask == {}
        # A good name is asked about, normalised (case, the root's dot).
        good = raw(p.socket_path, b"CONNECT Example.COM.:443 HTTP/1.1\r\nHost: x\r\n\r\n")
    for target, reply in {**replies, **plain}.items():
        assert reply.startswith(b"HTTP/1.1 400") and b"egress refused:" in reply, (target, reply[:200])
    assert b"is not a host name" in replies["*.com:443"] and b"is not a host name" in replies["under_score.example:443"]
    assert b"one colon" in replies["x.test:1:443"] and b"is not a port" in replies["example.com:+443"]
    assert resolved == []  # nothing was decided on
    assert good.startswith(b"HTTP/1.1 403") and b"the chat is asked" in good
    assert list(p.run.to_ask) == [("example.com", 443)]


@pytest.fixture
def team(db: Database) -> None:
    add_group(db, chat_jid=TEAM, name="team", folder="team", requires_trigger=False)


def _ask(db: Database, host: str, port: int = 443) -> str | None:
    with db.transaction() as conn:
        asked = ask_about_egress(
            conn, db, chat_jid=TEAM, run_id="run-1", host=host, port=port, asked_at=db.now(), ttl_s=3600
        )
    return None if asked is None else asked[0].metadata["payload"]["question_id"]  # type: ignore[index]


@pytest.mark.usefixtures("team")
def test_no_question_is_stored_for_a_target_that_is_no_host(db: Database) -> None:
    for host, port in (("*.com", 443), ("under_score.example", 443), ("x.test:1", 443), ("ok.example", 0)):
        assert _ask(db, host, port) is None
    assert chat_questions(db, TEAM) == []


def _still_open(db: Database, qid: str) -> bool:
    with db.read() as session:
        found = get_question(session, qid)
    return found is not None and found.state == "open"


def _forge(db: Database, qid: str, subject: dict[str, object]) -> None:
    with db.transaction() as conn:
        conn.execute(update(QuestionRow).where(QuestionRow.id == qid).values(subject=subject))


@pytest.mark.usefixtures("team")
@pytest.mark.parametrize(
    "subject",
    [
        {"host": "*.com", "port": 443},
        {"host": "under_score.example", "port": 443},
        {"host": "x.test:1", "port": 443},
        {"host": "ok.example", "port": "1:443"},
        {"host": "ok.example", "port": 70000},
        {"host": "ok.example", "port": True},
        {"host": None, "port": 443},
    ],
    ids=["wildcard", "underscore", "two-ports", "port-text", "port-range", "port-bool", "no-host"],
)
def test_an_allow_for_a_forged_question_is_refused_and_the_config_still_parses(
    db: Database, subject: dict[str, object]
) -> None:
    store_container_config(db, TEAM, {"egress": {"mode": "ask", "allow": ["pypi.org"]}})
    qid = _ask(db, "example.org")
    assert qid is not None
    _forge(db, qid, subject)
    with pytest.raises(BadInput, match="the group's network policy is unchanged"):
        answer_question(db, TEAM, "allow", via="cli", question_id=qid)
    stored = get_group(db, TEAM).container_config
    assert stored == {"egress": {"mode": "ask", "allow": ["pypi.org"]}}
    assert parse_container_config(stored).egress.allow == ["pypi.org"]
    assert _still_open(db, qid)  # a Refuse may close it
    refused = answer_question(db, TEAM, "refuse", via="cli", question_id=qid)
    assert refused.message.content.endswith("stays refused for this group (by operator via cli).")


@pytest.mark.usefixtures("team")
def test_an_allow_never_stores_a_config_that_does_not_parse(db: Database) -> None:
    """A group's stored config that does not parse (from before the check): an Allow does not
    add to it, and says why."""
    broken = {"egress": {"mode": "ask", "allow": ["under_score.example"]}}
    store_container_config(db, TEAM, broken)
    qid = _ask(db, "example.org")
    with pytest.raises(BadInput, match="container_config.egress.allow"):
        answer_question(db, TEAM, "allow", via="cli", question_id=qid)
    assert get_group(db, TEAM).container_config == broken
    # A good config takes the rule, the port kept unless it is HTTP's or HTTPS's.
    store_container_config(db, TEAM, {"egress": {"mode": "ask"}})
    qid = _ask(db, "files.example", 8443)
    answered = answer_question(db, TEAM, "allow", via="cli", question_id=qid)
    assert answered.message.content.startswith("🌐 files.example:8443 is allowed")
    assert parse_container_config(get_group(db, TEAM).container_config).egress.allow == ["files.example:8443"]
