"""URL context under attack: DNS rebinding, redirects inward, slow servers, slow resolvers.

Two real servers on loopback stand for the internet and the host's network:
``127.0.0.1`` is "public" (the address policy the tests hand the fetcher puts
it on the public side of the line) and ``127.0.0.2``, on the same port, is
"internal" (private, like every other loopback address).  A resolver the test
controls answers names: the attack is a name that resolves to the public
address when it is checked and to the internal one the next time it is asked.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.core.settings import Settings
from orchestrator.model.context import UrlItem
from orchestrator.run.expand import expand_content, expand_url
from orchestrator.run.url_fetch import ContextUnavailable, UrlBudget, checked_addresses, fetch_url, is_public

PUBLIC, INTERNAL = "127.0.0.1", "127.0.0.2"


def only_public_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """The tests' line between "public" and private: 127.0.0.1 is the internet here."""
    return str(address) == PUBLIC


@dataclass
class Site:
    """A loopback HTTP server that records the Host header of every request it gets."""

    name: str
    hosts: list[str] = field(default_factory=list)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                site.hosts.append(self.headers.get("host", ""))
                if self.path.startswith("/redirect-to/"):
                    self.send_response(302)
                    self.send_header("location", "http://" + self.path.removeprefix("/redirect-to/"))
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if self.path == "/trickle":  # a byte at a time, for ever (well inside the read timeout)
                    self.send_response(200)
                    self.send_header("content-type", "text/plain")
                    self.end_headers()
                    try:
                        for _ in range(600):
                            self.wfile.write(b".")
                            self.wfile.flush()
                            time.sleep(0.1)
                    except OSError:
                        pass
                    return
                body = f"the {site.name} page".encode()
                self.send_response(200)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@dataclass
class Net:
    port: int
    public: Site
    internal: Site


@pytest.fixture
def net() -> Iterator[Net]:
    public, internal = Site("public"), Site("internal")
    a = ThreadingHTTPServer((PUBLIC, 0), public.handler())
    a.daemon_threads = True
    port = a.server_address[1]
    b = ThreadingHTTPServer((INTERNAL, port), internal.handler())
    b.daemon_threads = True
    for server in (a, b):
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield Net(port, public, internal)
    for server in (a, b):
        server.shutdown()
        server.server_close()


class Resolver:
    """Answers from a script per name: each call takes the next answer (the last one repeats)."""

    def __init__(self, **answers: list[list[str]]) -> None:
        self.answers = {name.replace("_", "."): list(script) for name, script in answers.items()}
        self.calls: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        try:
            ipaddress.ip_address(host)
            return [host]  # an address resolves to itself
        except ValueError:
            pass
        script = self.answers[host]
        return script.pop(0) if len(script) > 1 else script[0]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings.load(
        data_dir=tmp_path / "d",
        env_file=None,
        context_url_timeout_s=5.0,
        context_url_fetch_deadline_s=1.0,
        context_url_run_deadline_s=1.6,
    )


def test_the_connection_goes_to_the_checked_address_not_a_second_answer(net: Net, settings: Settings) -> None:
    # Checked: public.  Asked again (as a second getaddrinfo would): internal.
    resolver = Resolver(rebind_test=[[PUBLIC], [INTERNAL]])
    text = fetch_url(
        f"http://rebind.test:{net.port}/page", settings.context, resolver=resolver, allowed=only_public_loopback
    )
    assert text == "the public page"
    assert resolver.calls == ["rebind.test"]  # resolved once
    assert net.internal.hosts == []  # the second answer was never connected to
    assert net.public.hosts == [f"rebind.test:{net.port}"]  # the name still in the Host header
    # The next fetch resolves afresh, gets the internal answer, and refuses it.
    with pytest.raises(ContextUnavailable, match="non-public address"):
        fetch_url(
            f"http://rebind.test:{net.port}/page", settings.context, resolver=resolver, allowed=only_public_loopback
        )
    assert net.internal.hosts == []


def test_one_private_address_in_the_answer_refuses_the_name(net: Net, settings: Settings) -> None:
    for answer in ([PUBLIC, INTERNAL], [INTERNAL, PUBLIC], ["::ffff:127.0.0.2"], ["not-an-address"]):
        resolver = Resolver(mixed_test=[answer])
        with pytest.raises(ContextUnavailable, match="non-public address|not an address"):
            fetch_url(
                f"http://mixed.test:{net.port}/page", settings.context, resolver=resolver, allowed=only_public_loopback
            )
    assert net.public.hosts == [] and net.internal.hosts == []


@pytest.mark.parametrize("where", ["internal.test:{port}/secret", "127.0.0.2:{port}/secret", "[::1]:{port}/secret"])
def test_a_redirect_inward_is_checked_like_the_url(net: Net, settings: Settings, where: str) -> None:
    resolver = Resolver(site_test=[[PUBLIC]], internal_test=[[INTERNAL]])
    with pytest.raises(ContextUnavailable, match="non-public address"):
        fetch_url(
            f"http://site.test:{net.port}/redirect-to/{where.format(port=net.port)}",
            settings.context,
            resolver=resolver,
            allowed=only_public_loopback,
        )
    assert net.public.hosts == [f"site.test:{net.port}"] and net.internal.hosts == []
    # A redirect to a public name is followed, resolved and pinned the same way.
    resolver = Resolver(site_test=[[PUBLIC]], other_test=[[PUBLIC], [INTERNAL]])
    text = fetch_url(
        f"http://site.test:{net.port}/redirect-to/other.test:{net.port}/x",
        settings.context,
        resolver=resolver,
        allowed=only_public_loopback,
    )
    assert text == "the public page" and net.internal.hosts == []
    assert resolver.calls == ["site.test", "other.test"]


def test_a_trickling_server_is_cut_at_the_fetch_deadline(net: Net, settings: Settings) -> None:
    started = time.monotonic()
    with pytest.raises(ContextUnavailable, match=r"FETCH_DEADLINE.*took longer than 1 s"):
        fetch_url(
            f"http://{PUBLIC}:{net.port}/trickle", settings.context, resolver=Resolver(), allowed=only_public_loopback
        )
    took = time.monotonic() - started
    assert took < 1.5, took  # not the 60 s the server would take, nor a read timeout more


def test_the_runs_urls_share_one_deadline(net: Net, settings: Settings, tmp_path: Path) -> None:
    """Three trickling URLs in one run's input: the first stops at the fetch deadline (1 s), the
    second at the run's (1.6 s), the third at once, and the run's input is ready in time."""
    loopback = settings.replace(context_url_allow_private=True)  # the system resolver, loopback allowed
    meta = {"context": [{"type": "url", "url": f"http://{PUBLIC}:{net.port}/trickle"} for _ in range(3)]}
    started = time.monotonic()
    text = expand_content("read these", meta, tmp_path, loopback, UrlBudget(loopback.context))
    took = time.monotonic() - started
    assert took < 2.1, took
    assert text.count("FETCH_DEADLINE") == 1 and text.count("RUN_DEADLINE") == 2, text
    assert text.count("not fetched: ") == 1, text  # the third, met after the run's deadline
    assert text.count("<url_context_error>") == 3


class Blocking:
    """A resolver (or getaddrinfo) that records each call and then hangs until released: a thread
    that called it is still alive when the test looks."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()

    def __call__(self, host: str, port: object, *args: object, **kwargs: object) -> list[str]:
        self.calls.append(host)
        self.release.wait(10)
        return []


def _new_resolver_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.name == "url-resolve"]


def test_nothing_is_started_once_the_runs_deadline_has_passed(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL met after the run's deadline is not fetched at all: no resolver thread (left to finish
    on its own, one per URL), no DNS question, no connection (issue 29)."""
    short = settings.replace(context_url_run_deadline_s=0.05)
    budget = UrlBudget(short.context)
    time.sleep(0.1)  # the run's deadline is gone
    before = set(threading.enumerate())
    resolver, getaddrinfo = Blocking(), Blocking()
    try:
        with pytest.raises(ContextUnavailable, match=r"not fetched: .* had passed \(ORCHESTRATOR_CONTEXT_URL_RUN_DEA"):
            fetch_url(
                "http://late.test/", short.context, budget=budget, resolver=resolver, allowed=only_public_loopback
            )
        assert _new_resolver_threads(before) == [] and resolver.calls == []
        # Through the expansion and the system resolver, the machine's getaddrinfo is never asked.
        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        meta = {"context": [{"type": "url", "url": f"http://late{i}.test/"} for i in range(3)]}
        text = expand_content("read these", meta, tmp_path, short, budget)
        assert text.count("<url_context_error>") == 3 and text.count("not fetched: ") == 3, text
        assert _new_resolver_threads(before) == [] and getaddrinfo.calls == []
    finally:
        resolver.release.set()
        getaddrinfo.release.set()


def test_a_slow_resolver_is_cut_at_the_deadline(settings: Settings) -> None:
    def slow(host: str, port: int) -> list[str]:
        time.sleep(3)
        return [PUBLIC]

    started = time.monotonic()
    with pytest.raises(ContextUnavailable, match="took longer than 1 s"):
        fetch_url("http://slow.test/", settings.context, resolver=slow, allowed=only_public_loopback)
    assert time.monotonic() - started < 1.5


ADDRESSES = [
    # (address, public?, what it is)
    ("1.1.1.1", True, "public IPv4"),
    ("2606:4700:4700::1111", True, "public IPv6"),
    ("127.0.0.1", False, "loopback"),
    ("10.0.0.1", False, "private"),
    ("169.254.169.254", False, "link-local (cloud metadata)"),
    ("100.64.0.1", False, "shared (CGNAT)"),
    ("0.0.0.0", False, "unspecified"),
    ("::1", False, "IPv6 loopback"),
    ("::", False, "IPv6 unspecified"),
    ("fd00::1", False, "unique local"),
    ("fe80::1", False, "IPv6 link-local"),
    # IPv4-mapped (::ffff:0:0/96): the IPv4 address itself to the socket layer.
    ("::ffff:127.0.0.1", False, "mapped loopback"),
    ("::ffff:10.1.2.3", False, "mapped private"),
    ("::ffff:1.1.1.1", True, "mapped public"),
    # IPv4-compatible (::/96, deprecated) and IPv4-translated (::ffff:0:0:0/96, SIIT).
    ("::127.0.0.1", False, "compatible loopback"),
    ("::10.0.0.1", False, "compatible private"),
    ("::169.254.169.254", False, "compatible link-local"),
    ("::0.0.0.2", False, "compatible, 0.0.0.0/8"),
    ("::1.1.1.1", True, "compatible public"),
    ("::ffff:0:127.0.0.1", False, "translated loopback"),
    ("::ffff:0:1.1.1.1", True, "translated public"),
    # NAT64, the well-known prefix (64:ff9b::/96): a translator on the host's network sends it on to the IPv4.
    ("64:ff9b::127.0.0.1", False, "NAT64 loopback"),
    ("64:ff9b::10.0.0.1", False, "NAT64 private"),
    ("64:ff9b::192.168.1.1", False, "NAT64 private"),
    ("64:ff9b::169.254.169.254", False, "NAT64 link-local"),
    ("64:ff9b::1.1.1.1", True, "NAT64 public"),
    # NAT64, the local-use prefix (64:ff9b:1::/48): the operator chooses where in it the IPv4 sits
    # (RFC 6052's /48, /56, /64 or /96 forms), so every one of those places must hold a public address.
    ("64:ff9b:1::10.0.0.1", False, "local NAT64, private at /96"),
    ("64:ff9b:1:a00:0:100:808:808", False, "local NAT64, 10.0.0.1 at /48 (8.8.8.8 at /96)"),
    ("64:ff9b:1::8.8.8.8", False, "local NAT64, 0.0.0.0 at /48"),
    ("64:ff9b:1:808:8:808:808:808", True, "local NAT64, 8.8.8.8 at every place"),
    # 6to4 (2002::/16): the IPv4 address of the tunnel's end is bits 16-47.
    ("2002:7f00:1::1", False, "6to4 loopback"),
    ("2002:a00:1::1", False, "6to4 private"),
    ("2002:c0a8:101::1", False, "6to4 private"),
    ("2002:a9fe:a9fe::1", False, "6to4 link-local"),
    ("2002:101:101::1", True, "6to4 public"),
    # Teredo (2001::/32): the server's IPv4 address, then the client's, bit-inverted, in the last 32 bits.
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", False, "Teredo, client 127.0.0.1"),
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", False, "Teredo, client 10.0.0.1"),
    ("2001:0:4136:e378:8000:63bf:3f57:fefe", False, "Teredo, client 192.168.1.1"),
    ("2001:0:a00:1:8000:63bf:fefe:fefe", False, "Teredo, server 10.0.0.1"),
    ("2001:0:4136:e378:8000:63bf:fefe:fefe", True, "Teredo, client 1.1.1.1, server public"),
]


@pytest.mark.parametrize(("text", "public", "what"), ADDRESSES, ids=[a[0] for a in ADDRESSES])
def test_the_address_policy(text: str, public: bool, what: str) -> None:
    """An IPv6 address that stands for an IPv4 one (mapped, compatible, translated, NAT64, 6to4,
    Teredo) is judged by the IPv4 address it carries (issue 29): 64:ff9b::10.0.0.1 reaches 10.0.0.1
    through a NAT64 translator on the host's network."""
    assert is_public(ipaddress.ip_address(text)) is public, what


def test_the_system_resolver_is_used_by_default(net: Net, settings: Settings) -> None:
    # localhost, resolved by the machine: refused by default, fetched where private addresses are allowed.
    with pytest.raises(ContextUnavailable, match="non-public"):
        checked_addresses("localhost", net.port, settings.context)
    # Every address of the answer is checked; they are tried in order (::1 first, where nothing listens).
    block = expand_url(
        UrlItem(type="url", url=f"http://localhost:{net.port}/page"), settings.replace(context_url_allow_private=True)
    )
    assert "<content>\nthe public page\n</content>" in block and net.public.hosts[-1] == f"localhost:{net.port}"


@pytest.fixture
def tls_site(tmp_path: Path) -> Iterator[tuple[int, ssl.SSLContext, Site]]:
    """An HTTPS server on 127.0.0.1 whose certificate names ``pinned.test`` only, and a client
    context that trusts that certificate (made by openssl, no CA involved)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=pinned.test",
            "-addext",
            "subjectAltName=DNS:pinned.test",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    site = Site("tls")
    server = ThreadingHTTPServer((PUBLIC, 0), site.handler())
    server.daemon_threads = True
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(cert, key)
    server.socket = served.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    client = ssl.create_default_context(cafile=str(cert))
    yield server.server_address[1], client, site
    server.shutdown()
    server.server_close()


def test_tls_checks_the_name_while_the_connection_goes_to_the_checked_address(
    tls_site: tuple[int, ssl.SSLContext, Site], settings: Settings
) -> None:
    port, client, site = tls_site
    resolver = Resolver(pinned_test=[[PUBLIC], [INTERNAL]], other_test=[[PUBLIC]])
    text = fetch_url(
        f"https://pinned.test:{port}/page",
        settings.context,
        resolver=resolver,
        allowed=only_public_loopback,
        tls=client,
    )
    assert text == "the tls page" and site.hosts == [f"pinned.test:{port}"]
    # The same address under another name: the certificate (checked against the name, sent as
    # SNI) does not match, so nothing is read.
    with pytest.raises(ContextUnavailable, match="CERTIFICATE_VERIFY_FAILED|certificate"):
        fetch_url(
            f"https://other.test:{port}/page",
            settings.context,
            resolver=resolver,
            allowed=only_public_loopback,
            tls=client,
        )
    assert site.hosts == [f"pinned.test:{port}"]
