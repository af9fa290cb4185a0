"""Context blocks: validated when stored, expanded fresh when a run is assembled."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.settings import Settings
from orchestrator.model.context import FileItem, SelectionItem, UrlItem, parse_context
from orchestrator.run import expand
from orchestrator.run.expand import expand_content, expand_file, expand_selection, expand_url
from orchestrator.store.db import Database
from orchestrator.store.message_log import get_messages_after, store_message_direct

PAGES: dict[str, tuple[int, str, bytes]] = {
    "/notes.txt": (200, "text/plain; charset=utf-8", "plain notes ✓".encode()),
    "/page.html": (
        200,
        "text/html",
        b"<html><head><style>p{}</style><script>evil()</script></head>"
        b"<body><h1>Title</h1><p>Body text</p></body></html>",
    ),
    "/missing": (404, "text/plain", b"nope"),
    "/image.png": (200, "image/png", b"\x89PNG..."),
    "/big.txt": (200, "text/plain", b"x" * 5000),
    # Pages that break the turning of bytes into text: a marked section html.parser (3.11) stops at
    # with an AssertionError, charsets that name codecs which are no text encodings (rot13: a
    # LookupError) or take no "replace" (idna: a UnicodeError).
    "/marked.html": (200, "text/html", b"<html><body><p>before</p><![ ]><p>after</p></body></html>"),
    "/rot13.txt": (200, "text/plain; charset=rot13", b"uryyb"),
    "/idna.txt": (200, "text/plain; charset=idna", b"hello"),
}


REDIRECTS = {
    "/redirect": "/notes.txt",
    "/to-ftp": "ftp://example.invalid/x",
    "/to-bad-ipv6": "http://[::1",  # urljoin's ValueError
    "/to-bad-idna": "http://xn--/",  # idna's IDNAError, out of httpx.URL
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's naming
        if self.path in REDIRECTS:
            self.send_response(302)
            self.send_header("Location", REDIRECTS[self.path])
            self.end_headers()
            return
        status, kind, body = PAGES.get(self.path, (404, "text/plain", b""))
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def loopback_ok(tmp_path: Path) -> Settings:
    return Settings.load(
        data_dir=tmp_path / "d", context_url_allow_private=True, context_url_max_bytes=1000, env_file=None
    )


@pytest.mark.parametrize(
    ("items", "field", "problem"),
    [
        ("notes.md", "metadata.context", "must be a list"),
        ([{"type": "pdf", "path": "x"}], "metadata.context[0].type", "must be one of file, url, selection"),
        ([{"path": "x"}], "metadata.context[0].type", "is required"),
        ([{"type": "file"}], "metadata.context[0].path", "Field required"),
        ([{"type": "file", "path": ""}], "metadata.context[0].path", "at least 1 character"),
        ([{"type": "file", "path": "a", "mode": "rw"}], "metadata.context[0].mode", "Extra inputs"),
        (
            [{"type": "file", "path": "a"}, {"type": "url", "url": "file:///etc/passwd"}],
            "metadata.context[1].url",
            "http:// or https://",
        ),
        ([{"type": "selection", "text": "t", "start_line": 0}], "metadata.context[0].start_line", "greater than"),
        ([{"type": "file", "path": str(i)} for i in range(21)], "metadata.context", "at most 20"),
    ],
)
def test_bad_context_items_name_the_field(items: object, field: str, problem: str) -> None:
    with pytest.raises(InvalidMessageMetadata) as err:
        parse_context({"context": items})
    assert err.value.field == field
    assert problem in str(err.value)


def test_a_message_with_bad_context_is_not_stored(db: Database) -> None:
    with pytest.raises(InvalidMessageMetadata, match=r"metadata\.context\[0\]\.url"):
        store_message_direct(
            db=db,
            id="m1",
            chat_jid="c@l",
            sender="u",
            content="see",
            timestamp="2026-11-26T10:00:00+00:00",
            metadata={"context": [{"type": "url", "url": "not a url"}]},
        )
    assert get_messages_after("c@l", 0, db=db) == []


def test_file_block_reads_the_group_workspace_now(tmp_path: Path, loopback_ok: Settings) -> None:
    (tmp_path / "notes").mkdir()
    note = tmp_path / "notes" / "plan.md"
    note.write_text("step 1\nstep 2\n")
    block = expand_file(FileItem(type="file", path="notes/plan.md"), tmp_path, loopback_ok)
    assert block.startswith("<file_context>\n<path>notes/plan.md</path>\n<mtime>")
    assert block.endswith("<content>\nstep 1\nstep 2\n\n</content>\n</file_context>")
    note.write_text("changed")
    assert "<content>\nchanged\n</content>" in expand_file(
        FileItem(type="file", path="notes/plan.md"), tmp_path, loopback_ok
    )


def test_unreadable_files_become_error_blocks(tmp_path: Path, loopback_ok: Settings) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("TOPSECRET")
    os.symlink(outside, tmp_path / "link.txt")
    (tmp_path / "bin.dat").write_bytes(b"\x00\x01\x02")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "ok.txt").write_text("fine")
    os.symlink(tmp_path / "dir", tmp_path / "dirlink")  # a symlink inside, to inside: still refused
    os.symlink(tmp_path.parent, tmp_path / "up")
    os.mkfifo(tmp_path / "fifo")  # opening it blocking would hang the worker forever
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.sock"))
    cases = {
        "missing.md": "no such file",
        "../x.md": "'..' is not allowed",
        "dir/../../x.md": "'..' is not allowed",
        str(outside): "absolute paths are not allowed",
        "link.txt": "a symlink (never followed)",
        "dirlink/ok.txt": "a path component is not a folder (or is a symlink)",
        f"up/{tmp_path.name}-outside.txt": "a path component is not a folder (or is a symlink)",
        "bin.dat": "binary file",
        "dir": "is a directory",
        "fifo": "is not a regular file (FIFO, socket or device)",
        "s.sock": "a socket or device, not a regular file",
    }
    for path, why in cases.items():
        block = expand_file(FileItem(type="file", path=path), tmp_path, loopback_ok)
        assert block.startswith("<file_context_error>"), path
        assert f"<error>[Error: {why}" in block, (path, block)
        assert "TOPSECRET" not in block
    sock.close()
    assert "<content>\nfine\n</content>" in expand_file(
        FileItem(type="file", path="./dir//ok.txt"), tmp_path, loopback_ok
    )


def test_large_files_are_cut(tmp_path: Path) -> None:
    small = Settings.load(data_dir=tmp_path / "d", context_file_max_bytes=10, env_file=None)
    (tmp_path / "big.txt").write_text("0123456789ABCDEF")
    block = expand_file(FileItem(type="file", path="big.txt"), tmp_path, small)
    assert "<content>\n0123456789\n[... truncated at 10 bytes]\n</content>" in block


def test_url_blocks_fetch_text_and_html(web: str, loopback_ok: Settings) -> None:
    block = expand_url(UrlItem(type="url", url=f"{web}/notes.txt"), loopback_ok)
    assert block == f"<url_content>\n<url>{web}/notes.txt</url>\n<content>\nplain notes ✓\n</content>\n</url_content>"
    html = expand_url(UrlItem(type="url", url=f"{web}/page.html"), loopback_ok)
    assert "<content>\nTitle\nBody text\n</content>" in html and "evil" not in html
    redirected = expand_url(UrlItem(type="url", url=f"{web}/redirect"), loopback_ok)
    assert "plain notes ✓" in redirected
    big = expand_url(UrlItem(type="url", url=f"{web}/big.txt"), loopback_ok)
    assert "x" * 1000 + "\n[... truncated at 1000 bytes]" in big and "x" * 1001 not in big


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/missing", "HTTP 404"),
        ("/image.png", "not a text document (image/png)"),
        ("/to-ftp", "redirected away from http"),
        ("/to-bad-ipv6", "redirected to no URL: Invalid IPv6 URL"),
        ("/to-bad-idna", "not a URL: Malformed A-label"),
    ],
)
def test_url_failures_become_error_blocks(web: str, loopback_ok: Settings, path: str, why: str) -> None:
    block = expand_url(UrlItem(type="url", url=f"{web}{path}"), loopback_ok)
    assert block.startswith("<url_context_error>") and f"[Error: {why}" in block


def _html_parser_chokes_on_a_marked_section() -> bool:
    try:
        HTMLParser().feed("<![ ]>")
    except AssertionError:
        return True
    return False  # a later parser (HTML5's rules: a bogus comment) reads it


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/rot13.txt", "LookupError"),
        ("/idna.txt", "UnicodeError"),
        pytest.param(
            "/marked.html",
            "AssertionError",
            marks=pytest.mark.skipif(
                not _html_parser_chokes_on_a_marked_section(), reason="this Python's html.parser reads <![ ]>"
            ),
        ),
    ],
)
def test_a_page_that_cannot_be_turned_into_text_is_an_error_block(
    web: str, tmp_path: Path, loopback_ok: Settings, path: str, why: str
) -> None:
    """History is expanded again for every run: an exception out of one page would fail every later
    run of the group, until the message left the window (issue 29)."""
    block = expand_url(UrlItem(type="url", url=f"{web}{path}"), loopback_ok)
    assert block.startswith("<url_context_error>") and "[Error: cannot turn the page into text" in block, block
    assert why in block
    meta = {"context": [{"type": "url", "url": f"{web}{path}"}, {"type": "url", "url": f"{web}/notes.txt"}]}
    text = expand_content("read these", meta, tmp_path, loopback_ok)
    assert text.split("\n\n")[1] == block and "plain notes ✓" in text  # the message's other blocks unharmed


def test_a_url_the_store_accepts_but_idna_refuses_is_an_error_block(loopback_ok: Settings) -> None:
    # http://xn--/ passes the item's check (urlsplit) and made httpx.URL raise idna's IDNAError.
    parse_context({"context": [{"type": "url", "url": "http://xn--/"}]})
    block = expand_url(UrlItem(type="url", url="http://xn--/"), loopback_ok)
    assert block.startswith("<url_context_error>") and "[Error: not a URL: " in block, block


def test_an_unforeseen_failure_is_an_error_block_and_logged(
    loopback_ok: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The expansion's last line: whatever fetching raises, the run goes on (and the log has the traceback)."""

    def broken(*args: object, **kwargs: object) -> str:
        raise KeyError("a bug in the fetcher")

    monkeypatch.setattr(expand, "fetch_url", broken)
    with caplog.at_level(logging.ERROR, logger="orchestrator.run.expand"):
        block = expand_url(UrlItem(type="url", url="http://example.test/"), loopback_ok)
    assert block.startswith("<url_context_error>") and "[Error: cannot read the URL (KeyError)]" in block, block
    assert "a bug in the fetcher" not in block  # the details go to the log, not to the model
    assert any(r.exc_info and "example.test" in r.getMessage() for r in caplog.records)


def test_private_addresses_are_refused_by_default(web: str, tmp_path: Path) -> None:
    default = Settings.load(data_dir=tmp_path / "d", env_file=None)
    block = expand_url(UrlItem(type="url", url=f"{web}/notes.txt"), default)
    assert "non-public address; refused" in block and "plain notes" not in block


def test_selection_block() -> None:
    item = SelectionItem(
        type="selection", text="def f():\n    return 1", title="a.py", path="src/a.py", start_line=3, end_line=4
    )
    assert expand_selection(item) == (
        "<selected_text>\n<title>a.py</title>\n<path>src/a.py</path>\n<start_line>3</start_line>\n"
        "<end_line>4</end_line>\n<content>\ndef f():\n    return 1\n</content>\n</selected_text>"
    )


def test_expanded_content_is_the_typed_text_then_the_blocks(tmp_path: Path, web: str, loopback_ok: Settings) -> None:
    (tmp_path / "a.txt").write_text("A")
    meta = {
        "context": [
            {"type": "file", "path": "a.txt"},
            {"type": "url", "url": f"{web}/notes.txt"},
            {"type": "selection", "text": "picked"},
        ]
    }
    text = expand_content("summarise these", meta, tmp_path, loopback_ok)
    parts = text.split("\n\n")
    assert parts[0] == "summarise these"
    assert [p.split("\n")[0] for p in parts[1:]] == ["<file_context>", "<url_content>", "<selected_text>"]
    assert expand_content("plain", None, tmp_path, loopback_ok) == "plain"
    # legacy rows stored before validation: the run goes on and says what was wrong
    broken = expand_content("x", {"context": "oops"}, tmp_path, loopback_ok)
    assert broken.startswith("x\n\n<context_error>") and "metadata.context" in broken
