"""Signed, expiring links to stored files (orchestrator/core/file_links.py): an outbound
webhook names a FILE message's files with them; `GET /files/{id}?chat=&expires=&sig=` serves
the file without the API token while the link is good, and refuses another id, another chat,
a later time, a changed signature or a link past its time (the key, the bound on a link's
life and the chat check: tests/host/test_envelope_scope.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient

from orchestrator.channels.webhook import _payload
from orchestrator.core.file_links import file_link, link_key, link_refusal, signature
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.render import RenderedMessage
from orchestrator.root import Orchestrator
from orchestrator.store.db import Database
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group

JID = "links@local"
SECRET = "webhook-secret-4f1"
TOKEN = "api-token-77a"


@pytest.fixture
def linked(settings: Settings) -> Settings:
    return settings.replace(
        public_base_url="https://orch.example.com/", webhook_secret=SECRET, api_token=TOKEN, file_link_ttl_s=600
    )


@pytest.fixture
def stored(db: Database, linked: Settings) -> StoredFile:
    add_group(db, chat_jid=JID, name="links", folder="links")
    return FileStore.from_settings(db, linked).store_bytes(JID, b"<svg onload=alert(1)>", "pic.svg")


@pytest.fixture
def client(db: Database, linked: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(Orchestrator(linked.replace(api_allowed_hosts="testserver")))) as c:
        yield c


def path_of(link: str) -> str:
    parts = urlsplit(link)
    return f"{parts.path}?{parts.query}"


def test_a_link_names_one_file_until_its_time(linked: Settings) -> None:
    now = 1_800_000_000.0
    link = file_link(linked, JID, "abc", now)
    assert link is not None
    parts = urlsplit(link)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "orch.example.com", "/files/abc")
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    expires, sig = int(query["expires"]), query["sig"]
    assert query["chat"] == JID and expires == int(now) + 600
    assert link_refusal(linked, JID, "abc", expires, sig, now) is None
    assert link_refusal(linked, JID, "abd", expires, sig, now) == "the link's signature does not match"
    assert link_refusal(linked, "other@local", "abc", expires, sig, now) == "the link's signature does not match"
    assert link_refusal(linked, JID, "abc", expires + 1, sig, now) == "the link's signature does not match"
    assert link_refusal(linked, JID, "abc", expires, "0" * 64, now) == "the link's signature does not match"
    assert link_refusal(linked, JID, "abc", expires, sig, expires + 1) == "the link has expired"
    # Another key, another signature: a link of one installation is nothing to another.
    assert signature(b"other" * 8, JID, "abc", expires) != sig == signature(link_key(linked), JID, "abc", expires)


def test_no_links_without_a_public_address(settings: Settings) -> None:
    # The webhook secret has nothing to do with links any more (they have a key of their own).
    assert file_link(settings.replace(webhook_secret=SECRET), JID, "abc", time.time()) is None
    assert file_link(settings.replace(public_base_url="https://x.example"), JID, "abc", time.time()) is not None
    off = link_refusal(settings, JID, "abc", 2**40, "00", time.time())
    assert off == "file links are off (no ORCHESTRATOR_PUBLIC_BASE_URL)"


def test_a_good_link_serves_the_file_without_the_token(
    client: TestClient, stored: StoredFile, linked: Settings
) -> None:
    link = file_link(linked, JID, stored.id, time.time())
    assert link is not None
    got = client.get(path_of(link))
    assert got.status_code == 200, got.text
    assert got.content == b"<svg onload=alert(1)>"
    # Never shown in place: sniffed as text, an attachment, nosniff.
    assert got.headers["content-type"] == "text/plain; charset=utf-8"
    assert got.headers["content-disposition"].startswith("attachment;")
    assert got.headers["x-content-type-options"] == "nosniff"
    # The API itself still wants its token.
    assert client.get(f"/api/files/{stored.id}").status_code == 401


def test_a_forged_or_old_link_is_refused(client: TestClient, stored: StoredFile, linked: Settings) -> None:
    past = file_link(linked, JID, stored.id, time.time() - 3600)
    assert past is not None
    assert client.get(path_of(past)).json() == {"detail": "the link has expired"}
    good = file_link(linked, JID, stored.id, time.time())
    assert good is not None
    query = {k: v[0] for k, v in parse_qs(urlsplit(good).query).items()}
    later = client.get(f"/files/{stored.id}?chat={JID}&expires={int(query['expires']) + 999}&sig={query['sig']}")
    assert later.status_code == 403
    other = client.get(f"/files/another?chat={JID}&expires={query['expires']}&sig={query['sig']}")
    assert other.status_code == 403
    missing = file_link(linked, JID, "no-such-file", time.time())
    assert missing is not None
    assert client.get(path_of(missing)).status_code == 404


def test_a_webhook_names_files_with_links(stored: StoredFile, linked: Settings, settings: Settings) -> None:
    rendered = RenderedMessage(
        text="Andy: here",
        chat_jid=JID,
        seq=1,
        id="m1",
        message_type="assistant",
        structured_type="FILE",
        sender="bot",
        sender_name="Andy",
        content="here",
        metadata=file_envelope([stored]),
    )
    now = time.time()
    linked_files, plain_files = _payload(rendered, linked, now)["files"], _payload(rendered, settings, now)["files"]
    assert isinstance(linked_files, list) and isinstance(plain_files, list)
    (with_link,), (without,) = linked_files, plain_files
    assert with_link["id"] == stored.id and with_link["url"] == file_link(linked, JID, stored.id, now)
    assert without == {"id": stored.id, "name": "pic.svg", "mime": "text/plain", "size": stored.size}
