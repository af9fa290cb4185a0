"""Webhooks: signed messages in (401 and nothing stored when the signature is
wrong), signed messages out through the deliveries table (retried, once)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from orchestrator.channels.webhook import (
    DELIVERY_HEADER,
    INBOUND_PATH,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    TIMESTAMPED_SIGNATURE_HEADER,
    WebhookChannel,
    inbound_headers,
    sign,
    verify,
    verify_delivery,
)
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.render import RenderedMessage
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group
from orchestrator.store.hosts import database_now
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.tables import DeliveryRow
from tests.conftest import wait_until
from tests.host.asked import stored_question

JID = "hooks@local"
SECRET = "s3cret-shared"
INBOUND_SECRET = "s3cret-inbound"  # the inbound webhooks' own (tests/host/test_inbound_webhook.py: the attacks)


@pytest.fixture
def hooked(db: Database, settings: Settings) -> tuple[Database, Settings]:
    add_group(db, chat_jid=JID, name="Hooks", folder="hooks", requires_trigger=True)
    return db, settings.replace(
        **{
            "webhook_secret": SECRET,
            "webhook_inbound_secret": INBOUND_SECRET,
            "delivery_retry_base_s": 0.05,
            "delivery_retry_max_s": 0.1,
        }
    )


def _post(client: TestClient, body: bytes, secret: str | None, signed: bytes | None = None) -> object:
    """POST ``body`` signed (over ``signed``, default the body) with ``secret``; None: unsigned."""
    headers = {"content-type": "application/json"}
    if secret is not None:
        headers.update(inbound_headers(secret, body if signed is None else signed))
    return client.post(INBOUND_PATH, content=body, headers=headers)


def test_sign_and_verify() -> None:
    body = b'{"a": 1}'
    assert sign("k", body) == "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert verify("k", body, sign("k", body))
    assert not verify("k", body + b" ", sign("k", body))
    assert not verify("other", body, sign("k", body))
    assert not verify("", body, sign("", body))  # no secret: nothing verifies
    assert not verify("k", body, None)


def test_inbound_needs_a_valid_signature(hooked: tuple[Database, Settings]) -> None:
    db, settings = hooked
    body = json.dumps({"chat_jid": JID, "sender": "ci-bot", "content": "build 42 is green"}).encode()
    with TestClient(create_app(Orchestrator(settings))) as client:
        assert _post(client, body, None).status_code == 401
        assert _post(client, body, "wrong").status_code == 401
        assert _post(client, body, SECRET).status_code == 401  # the outbound secret signs nothing we take
        assert _post(client, body + b" ", INBOUND_SECRET, signed=body).status_code == 401  # changed after signing
        assert get_messages_after(JID, 0, db=db) == []

        ok = _post(client, body, INBOUND_SECRET)
        assert ok.status_code == 201, ok.text
        [stored] = get_messages_after(JID, 0, db=db)
        # The sender in the webhook's own namespace (never "operator" nor another channel's).
        assert stored.content == "build 42 is green" and stored.sender == "webhook:ci-bot"
        assert stored.metadata == {"origin_channel": "webhook"}

        bad = json.dumps(
            {
                "chat_jid": JID,
                "sender": "x",
                "content": "y",
                "metadata": {"message_type": "TODO", "payload": {"todos": []}},
            }
        ).encode()
        r = _post(client, bad, INBOUND_SECRET)
        assert r.status_code == 400 and r.json()["field"] == "metadata.payload.todos"
        garbage = b"{not json"
        assert _post(client, garbage, INBOUND_SECRET).status_code == 400
        missing = json.dumps({"chat_jid": JID, "content": "no sender"}).encode()
        r = _post(client, missing, INBOUND_SECRET)
        assert r.status_code == 400 and r.json()["field"] == "sender"
        assert len(get_messages_after(JID, 0, db=db)) == 1


def test_inbound_takes_registered_chats_only_as_the_api_does(hooked: tuple[Database, Settings]) -> None:
    """An inbound webhook for a chat that is no registered group is a 404 and stores nothing, as
    POST /api/messages answers; with registration not required, unregistered chats are taken
    within ingest's bounds (a new chat past the cap: a 404 too)."""
    db, settings = hooked

    def body(chat: str, text: str = "hello") -> bytes:
        return json.dumps({"chat_jid": chat, "sender": "ci-bot", "content": text}).encode()

    with TestClient(create_app(Orchestrator(settings))) as client:
        r = _post(client, body("stranger@x"), INBOUND_SECRET)
        assert r.status_code == 404 and "no registered group" in r.json()["detail"], r.text
        assert get_messages_after("stranger@x", 0, db=db) == []
        assert _post(client, body(JID), INBOUND_SECRET).status_code == 201
    open_settings = settings.replace(
        **{"api_require_registered_chat": False, "unregistered_chats": 1, "unregistered_chat_messages": 2}
    )
    with TestClient(create_app(Orchestrator(open_settings))) as client:
        for n in range(3):
            assert _post(client, body("stranger@x", f"m{n}"), INBOUND_SECRET).status_code == 201
        r = _post(client, body("another@x"), INBOUND_SECRET)
        assert r.status_code == 404 and "ORCHESTRATOR_UNREGISTERED_CHATS" in r.json()["detail"], r.text
    assert [m.content for m in get_messages_after("stranger@x", 0, db=db)] == ["m1", "m2"]
    assert get_messages_after("another@x", 0, db=db) == []


def test_inbound_is_off_without_a_secret(db: Database, settings: Settings) -> None:
    body = b"{}"
    with TestClient(create_app(Orchestrator(settings))) as client:
        assert _post(client, body, "").status_code == 404


class _Receiver:
    """A loopback endpoint that fails its first ``fail`` requests."""

    def __init__(self, fail: int) -> None:
        self.fail = fail
        self.calls = 0
        self.received: list[tuple[bytes, str | None]] = []
        # (timestamp, timestamped signature) of each accepted request.
        self.stamped: list[tuple[str | None, str | None]] = []
        self.delivery_ids: list[str | None] = []  # of every request, failed or not
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.calls += 1
                receiver.delivery_ids.append(self.headers.get(DELIVERY_HEADER))
                status = 500 if receiver.calls <= receiver.fail else 204
                if status == 204:
                    receiver.received.append((body, self.headers.get(SIGNATURE_HEADER)))
                    receiver.stamped.append(
                        (self.headers.get(TIMESTAMP_HEADER), self.headers.get(TIMESTAMPED_SIGNATURE_HEADER))
                    )
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> _Receiver:
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver() -> Iterator[_Receiver]:
    with _Receiver(fail=2) as r:
        yield r


def test_outbound_webhook_is_signed_retried_and_sent_once(
    hooked: tuple[Database, Settings], receiver: _Receiver
) -> None:
    db, settings = hooked
    attach_channel(db, JID, "webhook", address=receiver.url)
    msg = ingest(
        db, settings, IncomingMessage(chat_jid=JID, sender="ann", sender_name="Ann", content="hello hook"), signal=None
    ).message
    channel = WebhookChannel(settings)
    deliverer = Deliverer(db, settings, ChannelRegistry([channel]))

    def sent() -> bool:
        deliverer.deliver_due()
        return len(receiver.received) == 1

    wait_until(sent, 10, "the webhook to accept the message")
    for _ in range(3):
        deliverer.deliver_due()
    assert receiver.calls == 3 and len(receiver.received) == 1  # two failures, one success, never again
    body, signature = receiver.received[0]
    assert verify(SECRET, body, signature)
    # The signature over the send's time: a receiver checking it within its window takes this
    # delivery now, and refuses the same bytes replayed past the window, or with the time or
    # the body changed.
    [(stamp, stamped)] = receiver.stamped
    assert stamp is not None and abs(time.time() - int(stamp)) < 60
    assert verify_delivery(SECRET, body, stamp, stamped, now=time.time())
    assert not verify_delivery(SECRET, body, stamp, stamped, now=time.time() + 301)
    assert not verify_delivery(SECRET, body, str(int(stamp) + 1), stamped, now=time.time())
    assert not verify_delivery(SECRET, body + b" ", stamp, stamped, now=time.time())
    assert not verify_delivery("other", body, stamp, stamped, now=time.time())
    assert not verify_delivery(SECRET, body, stamp, signature, now=time.time())  # the body-only one is not it
    doc = json.loads(body)
    assert doc["event"] == "message" and doc["message"]["seq"] == msg.seq
    assert doc["message"]["text"] == "Ann: hello hook"
    [row] = list_deliveries(db, message_seq=msg.seq)
    assert (row.channel, row.state, row.attempts) == ("webhook", "sent", 3)
    assert "answered 500" in (row.last_error or "")
    # One delivery id on every attempt, in the header and the body: what a receiver deduplicates by.
    assert receiver.delivery_ids == [f"{settings.install_id}-{row.id}"] * 3
    assert doc["message"]["delivery_id"] == receiver.delivery_ids[0]
    assert row.sent_ids == [receiver.delivery_ids[0]]  # what its changes name it by
    channel.disconnect()


def test_a_file_message_names_its_files_by_id(hooked: tuple[Database, Settings]) -> None:
    """A FILE message's payload names each file (id, name, type, size) in ``message.files``,
    the store's word on each, and carries no bytes; a message without files has no ``files``."""
    db, settings = hooked
    store = FileStore.from_settings(db, settings)
    chart = store.store_bytes(JID, b"\x89PNG\r\n\x1a\n" + bytes(100), "chart.png")
    notes = store.store_bytes(JID, b"secret notes\n", "notes.txt")
    with _Receiver(fail=0) as receiver:
        attach_channel(db, JID, "webhook", address=receiver.url)
        meta = file_envelope([chart, notes])
        meta["payload"]["files"][0]["name"] = "evil.exe"  # what a sender says of it: the store's name wins
        ingest(db, settings, IncomingMessage(chat_jid=JID, sender="ann", content="see", metadata=meta), signal=None)
        ingest(db, settings, IncomingMessage(chat_jid=JID, sender="ann", content="no files"), signal=None)
        channel = WebhookChannel(settings)
        try:
            assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 2
        finally:
            channel.disconnect()
    with_files, without = (json.loads(body)["message"] for body, _ in receiver.received)
    assert with_files["files"] == [
        {"id": chart.id, "name": "chart.png", "mime": "image/png", "size": 108},
        {"id": notes.id, "name": "notes.txt", "mime": "text/plain", "size": 13},
    ]
    assert with_files["content"] == "see" and b"secret notes" not in receiver.received[0][0]
    assert "files" not in without and without["content"] == "no files"


def test_a_question_carries_its_options(hooked: tuple[Database, Settings]) -> None:
    """A question's payload holds it (id, words, options, how it is answered) in
    ``message.question``; another message has none."""
    db, settings = hooked
    with _Receiver(fail=0) as receiver:
        attach_channel(db, JID, "webhook", address=receiver.url)
        asked, _ = stored_question(db, JID, "Which colour?", ["red", "blue"], multiple=True)
        ingest(db, settings, IncomingMessage(chat_jid=JID, sender="ann", content="hello"), signal=None)
        channel = WebhookChannel(settings)
        try:
            assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 2
        finally:
            channel.disconnect()
    question, reply = (json.loads(body)["message"] for body, _ in receiver.received)
    assert question["question"] == {
        "id": asked.id,
        "question": "Which colour?",
        "options": ["red", "blue"],
        "multiple": True,
        "allow_other": False,
    }
    assert "1. red" in question["content"] and "question" not in reply


def test_a_webhook_send_cut_short_by_a_dead_deliverer_is_sent_again_with_its_id(
    hooked: tuple[Database, Settings],
) -> None:
    """At least once, deduplicable: the deliverer POSTed, then died before it could record
    the send.  Once its claim is past, the sweep puts the delivery back (the webhook's
    receivers deduplicate by the delivery id) and it goes out again with the same id.
    A channel without ids (the recording one here) gives such a send up instead."""
    from fakes.channel import RecordingChannel
    from orchestrator.run.sweeper import sweep

    class Dies(BaseException):
        """The deliverer's process ending right after the POST (not an error it could record)."""

    class DiesAfterPosting(WebhookChannel):
        def send(self, address: str, rendered: RenderedMessage) -> list[str]:
            super().send(address, rendered)
            raise Dies

    db, settings = hooked
    with _Receiver(fail=0) as receiver:
        attach_channel(db, JID, "webhook", address=receiver.url)
        attach_channel(db, JID, "rec")
        msg = ingest(
            db, settings, IncomingMessage(chat_jid=JID, sender="ann", content="once, really"), signal=None
        ).message

        class RecDies(RecordingChannel):
            def send(self, address: str, rendered: RenderedMessage) -> None:
                super().send(address, rendered)
                raise Dies

        dying = DiesAfterPosting(settings)
        with pytest.raises(Dies):
            Deliverer(db, settings, ChannelRegistry([dying])).deliver_due()
        with pytest.raises(Dies):
            Deliverer(db, settings, ChannelRegistry([RecDies("rec")])).deliver_due()
        assert {d.channel: d.state for d in list_deliveries(db, message_seq=msg.seq)} == {
            "webhook": "sending",
            "rec": "sending",
        }
        with db.write() as session:  # their claims ran out (the database's clock)
            session.execute(update(DeliveryRow).values(claimed_until=database_now(db) - timedelta(seconds=1)))
        live = WebhookChannel(settings)
        registry = ChannelRegistry([live, RecordingChannel("rec")])
        assert registry.resent_after_crash() == ["webhook"]
        report = sweep(db, signal=None, resend_channels=registry.resent_after_crash())
        assert report.abandoned_deliveries == 2
        Deliverer(db, settings, registry).deliver_due()
        rows = {d.channel: d for d in list_deliveries(db, message_seq=msg.seq)}
        assert (rows["webhook"].state, rows["webhook"].attempts) == ("sent", 2)
        assert rows["rec"].state == "failed" and "never sent twice" in (rows["rec"].last_error or "")
        assert receiver.delivery_ids == [f"{settings.install_id}-{rows['webhook'].id}"] * 2
        assert [json.loads(body)["message"]["seq"] for body, _ in receiver.received] == [msg.seq] * 2
        live.disconnect()
        dying.disconnect()


def test_a_webhook_address_must_be_a_url(settings: Settings) -> None:
    channel = WebhookChannel(settings)
    assert channel.owns("https://example.com/x") and not channel.owns("team@g.us")
    channel.disconnect()
