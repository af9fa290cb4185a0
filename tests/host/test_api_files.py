"""Files over the HTTP API (orchestrator/http/routes/files.py), on both databases: the upload
(multipart, streamed into the file store, all or nothing, its own body limit), the download
(an attachment whatever the bytes, nosniff, inline only for raster images) and the listing,
and the attacks of issue 31 against them."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient

from agent_runner.protocol import MAX_FILES_PER_MESSAGE
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.http.routes.files import UPLOAD_ALLOWANCE_BYTES, content_disposition, upload_limit
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.file_names import MAX_NAME_BYTES
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group, is_registered
from tests.live_server import serve

JID = "files@local"
OTHER = "other@local"
TOKEN = "files-token-1c9e"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
CLIENT = {CLIENT_HEADER: "tests"}


def _app(db: Database, settings: Settings, **changes: object) -> object:
    for jid, folder in ((JID, "files"), (OTHER, "other")):
        if not is_registered(db, jid):
            add_group(db, chat_jid=jid, name=folder, folder=folder, requires_trigger=False)
    return create_app(Orchestrator(settings.replace(**{"api_allowed_hosts": "testserver", **changes})))


@pytest.fixture
def client(db: Database, settings: Settings) -> Iterator[TestClient]:
    with TestClient(_app(db, settings), headers=CLIENT) as c:  # type: ignore[arg-type]
        yield c


def _upload(client: TestClient, *files: tuple[str, bytes], chat: str = JID) -> httpx.Response:
    return client.post(f"/api/chats/{chat}/files", files=[("file", (name, data)) for name, data in files])


def _left_behind(settings: Settings) -> list[Path]:
    """Every file under the file store's folder, its temporary folder included."""
    root = settings.files_dir
    return sorted(p for p in root.rglob("*") if not p.is_dir()) if root.exists() else []


def _rows(db: Database) -> int:
    return int(db.read_fixed("SELECT COUNT(*) FROM files")[0][0])


# --- upload, list, download --------------------------------------------------------------------


def test_files_are_uploaded_listed_and_downloaded(client: TestClient, db: Database) -> None:
    r = _upload(client, ("notes.txt", b"first line\n"), ("photo.png", PNG))
    assert r.status_code == 201, r.text
    notes, photo = r.json()
    assert set(notes) == {"id", "name", "mime", "size", "sha256", "created_at"}
    assert (notes["name"], notes["mime"], notes["size"]) == ("notes.txt", "text/plain", 11)
    assert (photo["name"], photo["mime"], photo["size"]) == ("photo.png", "image/png", len(PNG))
    # The listing: the chat's files, oldest first; another chat's list does not show them.
    later = _upload(client, ("later.txt", b"later")).json()[0]
    assert [f["id"] for f in client.get(f"/api/chats/{JID}/files").json()] == [notes["id"], photo["id"], later["id"]]
    assert client.get(f"/api/chats/{OTHER}/files").json() == []
    # The bytes, with the headers that keep a browser from running them.
    got = client.get(f"/api/files/{notes['id']}")
    assert got.status_code == 200 and got.content == b"first line\n"
    assert got.headers["content-type"] == "text/plain; charset=utf-8"
    assert got.headers["content-disposition"] == "attachment; filename*=UTF-8''notes.txt"
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-security-policy"] == "default-src 'none'; sandbox"
    assert got.headers["cache-control"] == "private"
    assert got.headers["content-length"] == "11"
    image = client.get(f"/api/files/{photo['id']}")
    assert image.headers["content-type"] == "image/png" and image.content == PNG
    assert image.headers["content-disposition"].startswith("attachment;")
    # A raster image asked inline is shown in place.
    shown = client.get(f"/api/files/{photo['id']}", params={"inline": "true"})
    assert shown.headers["content-disposition"] == "inline; filename*=UTF-8''photo.png"
    assert shown.headers["x-content-type-options"] == "nosniff"
    # No such file: 404.
    missing = client.get("/api/files/no-such-file")
    assert missing.status_code == 404 and "no-such-file" in missing.json()["detail"]
    assert _rows(db) == 3


def test_the_same_bytes_are_stored_once(client: TestClient, settings: Settings) -> None:
    a = _upload(client, ("a.txt", b"same bytes")).json()[0]
    b = _upload(client, ("b.txt", b"same bytes"), chat=OTHER).json()[0]
    assert a["id"] != b["id"] and a["sha256"] == b["sha256"]
    assert len([p for p in _left_behind(settings) if p.parent.name != "tmp"]) == 1


def test_the_name_in_the_header_is_percent_encoded() -> None:
    # RFC 5987: no quote, semicolon, space or byte past ASCII reaches the header as it is.
    assert content_disposition('a "b"; c.txt') == "attachment; filename*=UTF-8''a%20%22b%22%3B%20c.txt"
    assert content_disposition("résumé.pdf") == "attachment; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf"
    assert content_disposition("x.png", inline=True) == "inline; filename*=UTF-8''x.png"


def test_every_api_route_of_files_takes_the_token(db: Database, settings: Settings) -> None:
    with TestClient(_app(db, settings, api_token=TOKEN)) as c:  # type: ignore[arg-type]
        for method, path in (
            ("GET", "/api/files/x"),
            ("GET", f"/api/chats/{JID}/files"),
            ("POST", f"/api/chats/{JID}/files"),
        ):
            r = c.request(method, path)
            assert r.status_code == 401, (method, path)
        ok = c.post(
            f"/api/chats/{JID}/files",
            files=[("file", ("t.txt", b"t"))],
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert ok.status_code == 201, ok.text
        fid = ok.json()[0]["id"]
        assert c.get(f"/api/files/{fid}").status_code == 401
        assert c.get(f"/api/files/{fid}", headers={"Authorization": f"Bearer {TOKEN}"}).content == b"t"


# --- what an upload refuses, keeping nothing -------------------------------------------------


def test_an_unregistered_chat_is_a_404_and_nothing_is_stored(
    client: TestClient, db: Database, settings: Settings
) -> None:
    r = _upload(client, ("a.txt", b"for nobody"), chat="nobody@local")
    assert r.status_code == 404
    assert "nobody@local" in r.json()["detail"]
    assert _rows(db) == 0 and _left_behind(settings) == []


def test_a_file_over_the_per_file_limit_is_a_413_and_nothing_is_kept(db: Database, settings: Settings) -> None:
    with TestClient(_app(db, settings, file_max_bytes=1000), headers=CLIENT) as c:  # type: ignore[arg-type]
        # The first file fits; the second does not: neither is kept.
        r = _upload(c, ("fits.txt", b"a" * 1000), ("big.bin", b"b" * 1001))
        assert r.status_code == 413, r.text
        detail = r.json()["detail"]
        assert "1000 bytes" in detail and "ORCHESTRATOR_FILE_MAX_BYTES" in detail
        assert _rows(db) == 0
        assert _left_behind(settings) == []  # no content, nothing in files/tmp
        assert c.get(f"/api/chats/{JID}/files").json() == []


def test_a_file_past_the_groups_limit_is_a_413_and_nothing_of_the_request_is_kept(
    db: Database, settings: Settings
) -> None:
    with TestClient(_app(db, settings, group_files_max_bytes=100), headers=CLIENT) as c:  # type: ignore[arg-type]
        kept = _upload(c, ("old.txt", b"o" * 40))
        assert kept.status_code == 201
        before = _left_behind(settings)
        # 40 + 30 fits, 40 + 30 + 31 does not: the request's first file goes too.
        r = _upload(c, ("new.txt", b"n" * 30), ("more.txt", b"m" * 31))
        assert r.status_code == 413, r.text
        assert "ORCHESTRATOR_GROUP_FILES_MAX_BYTES" in r.json()["detail"] and "100 bytes" in r.json()["detail"]
        assert [f["name"] for f in c.get(f"/api/chats/{JID}/files").json()] == ["old.txt"]
        assert _left_behind(settings) == before
        # What another group stored first costs this one nothing: the same bytes are taken.
        other = _upload(c, ("o.txt", b"x" * 90), chat=OTHER)
        assert other.status_code == 201
        same = _upload(c, ("same.txt", b"x" * 90))
        assert same.status_code == 201, same.text


def test_discarding_keeps_the_bytes_another_chat_refers_to(db: Database, settings: Settings) -> None:
    store = FileStore.from_settings(db, settings)
    mine = store.store_bytes(JID, b"shared", "a.txt")
    theirs = store.store_bytes(OTHER, b"shared", "b.txt")
    assert theirs.owner_jid == JID  # counted against the chat that stored it first
    store.discard([mine])
    assert store.read_bytes(store.get(theirs.id)) == b"shared"
    assert store.get(theirs.id).owner_jid == OTHER  # now the only one that refers to it
    assert store.group_bytes(JID) == 0 and store.group_bytes(OTHER) == 6
    store.discard([store.get(theirs.id)])
    assert _rows(db) == 0 and _left_behind(settings) == []


@pytest.mark.parametrize(
    ("files", "field"),
    [
        ([("other", ("a.txt", b"a"))], "file"),  # a part not named "file"
        ([("file", ("a.txt", b"a")), ("note", ("b.txt", b"b"))], "file"),  # ... after one that is
        ([("file", (f"{i}.txt", b"%d" % i)) for i in range(MAX_FILES_PER_MESSAGE + 1)], "file"),
    ],
)
def test_a_malformed_upload_is_a_400_and_nothing_is_kept(
    client: TestClient, db: Database, settings: Settings, files: list[tuple[str, tuple[str, bytes]]], field: str
) -> None:
    r = client.post(f"/api/chats/{JID}/files", files=files)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field
    assert _rows(db) == 0 and _left_behind(settings) == []


def test_a_body_that_is_no_multipart_upload_is_a_400(client: TestClient, db: Database) -> None:
    for headers, body in (
        ({"content-type": "application/json"}, b'{"file": "x"}'),
        ({"content-type": "multipart/form-data"}, b"no boundary"),
        ({"content-type": "multipart/form-data; boundary=XX"}, b"--XX\r\nbroken"),
        ({"content-type": "multipart/form-data; boundary=XX"}, b"--XX--\r\n"),  # no file at all
        ({"content-type": "multipart/form-data; boundary=XX"}, b"--XX\r\nContent-Type: text/plain\r\n\r\nx\r\n--XX--"),
        ({"content-type": "multipart/form-data; boundary=XX"}, b"--XX\r\nX-Pad: " + b"p" * 9000 + b"\r\n\r\nx"),
    ):
        r = client.post(f"/api/chats/{JID}/files", content=body, headers=headers)
        assert r.status_code == 400, (headers, body[:40], r.text)
        assert r.json()["field"] in ("body", "file")
    assert _rows(db) == 0


# --- names: the sender's is a hint ------------------------------------------------------------


def _raw_part(name: bytes, data: bytes, boundary: bytes = b"B0UNDARY") -> bytes:
    return (
        b"--" + boundary + b"\r\n"
        b'Content-Disposition: form-data; name="file"; filename="' + name + b'"\r\n'
        b"Content-Type: text/html\r\n\r\n" + data + b"\r\n"
    )


def test_hostile_file_names_are_stored_safe(client: TestClient) -> None:
    long_name = ("n" * 296 + ".txt").encode()
    names = [
        b"../../etc/passwd",
        b"..\\..\\boot.ini",
        b"a\x00b.txt",
        b".bashrc",
        b"..",
        long_name,
        "é\u202e.txt".encode(),
    ]
    body = b"".join(_raw_part(n, b"data %d" % i) for i, n in enumerate(names)) + b"--B0UNDARY--\r\n"
    r = client.post(
        f"/api/chats/{JID}/files", content=body, headers={"content-type": "multipart/form-data; boundary=B0UNDARY"}
    )
    assert r.status_code == 201, r.text
    stored = [f["name"] for f in r.json()]
    assert stored[:5] == ["passwd", "boot.ini", "ab.txt", "bashrc", "file"]
    assert stored[5].endswith(".txt") and len(stored[5].encode()) <= MAX_NAME_BYTES
    assert stored[6] == "é.txt"  # the bidi override is gone
    for name in stored:
        assert "/" not in name and "\\" not in name and "\x00" not in name and not name.startswith(".")
    # Served under the safe name too, and what the sender called text/html is text/plain.
    got = client.get(f"/api/files/{r.json()[0]['id']}")
    assert got.headers["content-disposition"] == "attachment; filename*=UTF-8''passwd"
    assert got.headers["content-type"] == "text/plain; charset=utf-8"


@pytest.mark.parametrize(
    "data",
    [
        b"<!DOCTYPE html><html><script>alert(document.cookie)</script></html>",
        b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><script>alert(2)</script></svg>',
    ],
)
def test_html_and_svg_are_served_as_text_attachments(client: TestClient, data: bytes) -> None:
    for name in ("page.html", "image.svg"):
        fid = _upload(client, (name, data)).json()[0]["id"]
        for params in ({}, {"inline": "true"}):
            got = client.get(f"/api/files/{fid}", params=params)
            assert got.headers["content-type"] == "text/plain; charset=utf-8"
            assert got.headers["content-disposition"].startswith("attachment;")
            assert got.headers["x-content-type-options"] == "nosniff"
            assert got.headers["content-security-policy"] == "default-src 'none'; sandbox"
            assert got.content == data


def test_inline_on_a_file_that_is_no_raster_image_stays_an_attachment(client: TestClient) -> None:
    for name, data in (("notes.txt", b"plain text"), ("doc.pdf", b"%PDF-1.7 ..."), ("blob", b"\x00\x01\x02")):
        fid = _upload(client, (name, data)).json()[0]["id"]
        got = client.get(f"/api/files/{fid}", params={"inline": "true"})
        assert got.headers["content-disposition"] == f"attachment; filename*=UTF-8''{name}", name


# --- the upload's own body limit, on a real server ---------------------------------------------

API_LIMIT = 8192


def _raw(base: str, head: bytes, body: bytes, *, read_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` and ``body`` on a fresh connection (no more); the answer."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=read_s) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"the server closed without answering: {data!r}"
            data += chunk
        raw_head, _, rest = data.partition(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(rest) < int(headers.get("content-length", "0")):
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
    return int(lines[0].split()[1]), headers, rest


def test_the_upload_has_its_own_body_limit_and_other_routes_keep_theirs(db: Database, settings: Settings) -> None:
    limited = settings.replace(api_max_request_bytes=API_LIMIT, file_max_bytes=50_000)
    with serve(_app(db, limited)) as base:
        # Past the API's limit, within the upload's: taken.
        data = bytes(range(256)) * 100  # 25,600 bytes
        r = httpx.post(f"{base}/api/chats/{JID}/files", files=[("file", ("big.bin", data))], headers=CLIENT)
        assert r.status_code == 201, r.text
        assert r.json()[0]["size"] == len(data)
        # The messages route still stops at the API's limit.
        r = httpx.post(
            f"{base}/api/messages",
            json={"chat_jid": JID, "sender": "u", "content": "x" * (API_LIMIT * 2)},
            headers=CLIENT,
        )
        assert r.status_code == 413 and "ORCHESTRATOR_API_MAX_REQUEST_BYTES" in r.json()["detail"]
        # A declared length past the upload's limit: refused before the body is read.
        host = urlsplit(base).netloc.encode()
        over = upload_limit(limited) + 1
        status, headers, body = _raw(
            base,
            b"POST /api/chats/" + JID.encode() + b"/files HTTP/1.1\r\nHost: " + host + b"\r\nX-Orchestrator-Client: t"
            b"\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: " + str(over).encode(),
            b"",
        )
        assert status == 413 and headers["connection"] == "close"
        assert str(upload_limit(limited)) in json.loads(body)["detail"]
        assert upload_limit(limited) == 50_000 * MAX_FILES_PER_MESSAGE + UPLOAD_ALLOWANCE_BYTES


def test_a_file_over_the_limit_is_refused_as_it_streams_in(db: Database, settings: Settings) -> None:
    # The 413 comes while most of the body is still unsent: the parts are read as they arrive,
    # not spooled whole first (Starlette's request.form() would wait for the end of the body).
    with serve(_app(db, settings.replace(file_max_bytes=10_000))) as base:
        host = urlsplit(base).netloc.encode()
        declared = 10 * 10_000
        head = (
            b"POST /api/chats/" + JID.encode() + b"/files HTTP/1.1\r\nHost: " + host + b"\r\nX-Orchestrator-Client: t"
            b"\r\nContent-Type: multipart/form-data; boundary=B0UNDARY\r\nContent-Length: " + str(declared).encode()
        )
        first = _raw_part(b"big.bin", b"z" * 20_000)[:-2]  # the part never ends
        status, _, body = _raw(base, head, first)
        assert status == 413
        assert "ORCHESTRATOR_FILE_MAX_BYTES" in json.loads(body)["detail"]
    assert _rows(db) == 0 and _left_behind(settings) == []


def test_a_chunked_upload_is_counted_against_the_upload_limit(db: Database, settings: Settings) -> None:
    limited = settings.replace(api_max_request_bytes=API_LIMIT, file_max_bytes=4096)
    limit = upload_limit(limited)
    with serve(_app(db, limited)) as base:
        host = urlsplit(base).netloc.encode()
        head = (
            b"POST /api/chats/" + JID.encode() + b"/files HTTP/1.1\r\nHost: " + host + b"\r\nX-Orchestrator-Client: t"
            b"\r\nContent-Type: multipart/form-data; boundary=B0UNDARY\r\nTransfer-Encoding: chunked"
        )
        # Within the upload's limit (past the API's): the files are taken, streamed.
        ok = b"".join(_raw_part(b"%d.txt" % i, b"%d" % i * 4000) for i in range(3)) + b"--B0UNDARY--\r\n"
        status, _, body = _raw(base, head, _chunked(ok))
        assert status == 201, body
        assert len(json.loads(body)) == 3
        # Line breaks before the first boundary with no end (the parser skips them): counted,
        # and cut off past the limit.
        endless = b"\r\n" * ((limit + 50_000) // 2)
        status, _, body = _raw(base, head, _chunked(endless, 32_768)[: limit + 40_000])
        assert status == 413, body
        assert str(limit) in json.loads(body)["detail"]
    assert _rows(db) == 3


def _chunked(payload: bytes, size: int = 1000) -> bytes:
    parts = [payload[i : i + size] for i in range(0, len(payload), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_the_document_states_the_file_routes(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    upload = doc["paths"]["/api/chats/{chat_jid}/files"]["post"]
    form = upload["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["file"] and form["properties"]["file"]["items"]["format"] == "binary"
    assert form["properties"]["file"]["maxItems"] == MAX_FILES_PER_MESSAGE
    # Its own 413 (the per-file and per-group limits, its own body limit), not the API's shared one.
    assert "ORCHESTRATOR_FILE_MAX_BYTES" in upload["responses"]["413"]["description"]
    assert "ORCHESTRATOR_GROUP_FILES_MAX_BYTES" in upload["responses"]["413"]["description"]
    assert {"201", "400", "404", "413"} <= set(upload["responses"])
    download = doc["paths"]["/api/files/{file_id}"]["get"]["responses"]["200"]
    assert {"text/plain", "image/png", "application/octet-stream"} <= set(download["content"])
    assert "text/html" not in download["content"] and "image/svg+xml" not in download["content"]
    assert {"Content-Disposition", "X-Content-Type-Options"} <= set(download["headers"])
    assert "get" in doc["paths"]["/api/chats/{chat_jid}/files"]


def test_file_too_large_is_a_413_in_the_one_table() -> None:
    from orchestrator.core.errors import FileTooLarge
    from orchestrator.http.errors import status_of

    assert status_of(FileTooLarge("the file is larger than 5 bytes", 5, "file_max_bytes")) == 413
