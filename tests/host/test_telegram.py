"""Telegram on a real database against a fake Bot API on loopback: delivery
through the deliveries table (retried, once, split), long-polled updates
stored in the attached group (mirrored, not echoed, deduplicated), unattached
chats stored (within ingest's bounds) but never waking an agent, files both
ways (documents and photos in, within the limits and only from the configured
API; sendPhoto and sendDocument out, each once), the plugin entry."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from fakes.channel import RecordingChannel
from fakes.telegram_api import FakeTelegramAPI, Upload, utf16_len
from orchestrator.channels.registry import build_registry
from orchestrator.channels.telegram import TelegramChannel, split_text
from orchestrator.channels.telegram_files import upload_method
from orchestrator.channels.telegram_poller import TelegramPoller
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import files_of
from orchestrator.model.render import RenderedMessage, render_text
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries, utc_now
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import FileStore
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import wait_until

JID = "team@chat"
TG_CHAT = -1001234567890


@pytest.fixture
def fake() -> Iterator[FakeTelegramAPI]:
    with FakeTelegramAPI() as api:
        yield api


@pytest.fixture
def tg(db: Database, settings: Settings, fake: FakeTelegramAPI) -> tuple[Database, Settings]:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    return db, settings.replace(
        **{
            "telegram_bot_token": fake.token,
            "telegram_api_base": fake.base,
            "delivery_retry_base_s": 0.05,
            "delivery_retry_max_s": 0.1,
        }
    )


@pytest.fixture
def channel(tg: tuple[Database, Settings]) -> Iterator[TelegramChannel]:
    ch = TelegramChannel(tg[1], db=tg[0])
    yield ch
    ch.disconnect()


def _say(db: Database, settings: Settings, content: str, **kw: object) -> int:
    incoming = IncomingMessage(chat_jid=JID, sender="ann", sender_name="Ann", content=content, **kw)  # type: ignore[arg-type]
    return ingest(db, settings, incoming, signal=None).message.seq


def _deliver_until(deliverer: Deliverer, cond: object, what: str) -> None:
    def step() -> bool:
        deliverer.deliver_due()
        return bool(cond())  # type: ignore[operator]

    wait_until(step, 10, what)


# -- outbound -----------------------------------------------------------------------------


def test_a_delivered_message_reaches_the_telegram_chat(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    registry = ChannelRegistry([channel])
    with pytest.raises(ChannelError, match="cannot reach"):  # the group's jid is no Telegram chat id
        attach_channel(db, JID, "telegram", registry=registry)
    attach_channel(db, JID, "telegram", address=str(TG_CHAT), registry=registry)
    seq = _say(db, settings, "hello telegram")
    report = Deliverer(db, settings, registry).deliver_due()
    assert report.sent == 1
    assert fake.sent() == [(str(TG_CHAT), "Ann: hello telegram")]
    assert [r.method for r in fake.requests] == ["getMe", "sendMessage"]
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.channel, row.address, row.state, row.attempts) == ("telegram", str(TG_CHAT), "sent", 1)


def test_a_send_that_fails_twice_arrives_once(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.fail("sendMessage", 500)
    fake.fail("sendMessage", 429, retry_after=1)
    seq = _say(db, settings, "persist")
    deliverer = Deliverer(db, settings, ChannelRegistry([channel]))
    _deliver_until(deliverer, lambda: len(fake.sent()) == 1, "telegram to accept the message")
    for _ in range(3):
        deliverer.deliver_due()
    assert [r.status for r in fake.calls("sendMessage")] == [500, 429, 200]
    assert fake.sent() == [(str(TG_CHAT), "Ann: persist")]
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("sent", 2)  # flood control (429) used up no attempt
    assert "rate limited (Flood control exceeded. Retry in 1 seconds)" in (row.last_error or "")


def test_flood_control_is_waited_out(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    """Telegram's 429 names when it takes sends again: the next attempt is not due before."""
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.fail("sendMessage", 429, retry_after=5)
    seq = _say(db, settings, "later")
    before = utc_now()
    report = Deliverer(db, settings, ChannelRegistry([channel])).deliver_due()
    assert report.failed_attempts == 1 and report.retry_in is not None and report.retry_in > 4
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("pending", 0)
    assert row.next_attempt_at - before >= timedelta(seconds=4.99)


def test_long_texts_are_split_at_4096(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    body = "\n".join(f"line {i:05d} " + "x" * 60 for i in range(150))  # ~10,500 characters
    _say(db, settings, body)
    assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 1
    parts = [text for _, text in fake.sent()]
    assert len(parts) == 3 and all(utf16_len(p) <= 4096 for p in parts)
    assert "".join(parts) == "Ann: " + body
    assert all(p.endswith("\n") for p in parts[:-1])  # cut at line breaks


def test_a_failed_part_of_a_long_text_is_resent_alone(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    _say(db, settings, "y" * 5000)
    deliverer = Deliverer(db, settings, ChannelRegistry([channel]))
    fake.fail("sendMessage", 500, after=1)  # the first part goes, the second fails
    _deliver_until(deliverer, lambda: len(fake.sent()) == 2, "both parts")
    assert [r.status for r in fake.calls("sendMessage")] == [200, 500, 200]
    assert [len(t) for _, t in fake.sent()] == [4096, 5005 - 4096]
    assert "".join(t for _, t in fake.sent()) == "Ann: " + "y" * 5000
    # The ledger keeps each part's message id, the first one's too though a retry sent the second.
    [row] = list_deliveries(db, state="sent")
    assert row.sent_ids == [str(m.message_id) for m in fake.live(TG_CHAT)] and len(row.sent_ids) == 2


def test_split_text_counts_utf16_units() -> None:
    assert split_text("") == [] and split_text("short") == ["short"]
    emoji = "😀" * 3000  # 2 units each: 6000 units
    parts = split_text(emoji)
    assert [utf16_len(p) for p in parts] == [4096, 1904] and "".join(parts) == emoji
    assert split_text("a" * 4096) == ["a" * 4096]
    assert split_text("a" * 4097) == ["a" * 4096, "a"]


# -- inbound ------------------------------------------------------------------------------


def test_updates_become_messages_of_the_attached_group(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    desk = RecordingChannel("desk")
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    attach_channel(db, JID, "desk")
    signalled: list[str] = []
    poller = TelegramPoller(db, settings, signal=signalled.append)
    try:
        fake.push_text(TG_CHAT, 42, "@Robo what's up?", first_name="Ann", last_name="Lee")
        [result] = poller.poll_once()
    finally:
        poller.close()
    assert result.created and result.triggered and signalled == [JID]
    [stored] = get_messages_after(JID, 0, db=db)
    assert (stored.sender, stored.sender_name, stored.content) == ("tg:42", "Ann Lee", "@Robo what's up?")
    assert stored.id == f"tg-{TG_CHAT}-1" and stored.metadata == {"origin_channel": "telegram"}
    # Mirrored to the group's other channel, not echoed back to Telegram.
    assert [d.channel for d in list_deliveries(db, message_seq=stored.seq)] == ["desk"]
    Deliverer(db, settings, ChannelRegistry([channel, desk])).deliver_due()
    assert desk.rendered == ["Ann Lee: @Robo what's up?"] and fake.sent() == []


def test_duplicate_updates_are_stored_once_and_the_offset_survives_a_restart(
    tg: tuple[Database, Settings],
    fake: FakeTelegramAPI,
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    first = fake.push_text(TG_CHAT, 42, "once")
    fake.push_text(TG_CHAT, 42, "once", message_id=first["message"]["message_id"])  # redelivered
    poller = TelegramPoller(db, settings)
    try:
        results = poller.poll_once()
    finally:
        poller.close()
    assert [r.created for r in results] == [True, False]
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["once"]
    last_update = max(u["update_id"] for u in fake.updates)

    fake.push_text(TG_CHAT, 43, "after the restart")
    restarted = TelegramPoller(db, settings)
    try:
        assert restarted.offset == last_update + 1
        [result] = restarted.poll_once()
        # A crash after storing but before the offset was written: the same update again.
        fake.push_text(TG_CHAT, 43, "after the restart", message_id=first["message"]["message_id"] + 1)
        assert [r.created for r in restarted.poll_once()] == [False]
    finally:
        restarted.close()
    assert result.created and result.message.sender == "tg:43"
    assert fake.calls("getUpdates")[-2].params["offset"] == str(last_update + 1)
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["once", "after the restart"]


def test_an_unattached_chat_is_stored_but_never_wakes_the_agent(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    signalled: list[str] = []
    poller = TelegramPoller(db, settings, signal=signalled.append)
    try:
        fake.push_text(-555, 7, "@Robo are you there?", chat_type="group")
        fake.push_text(7, 7, "@Robo hello in private", chat_type="private")
        results = poller.poll_once()
    finally:
        poller.close()
    assert [(r.created, r.triggered) for r in results] == [(True, False), (True, False)]
    assert signalled == [] and get_messages_after(JID, 0, db=db) == []
    [stray] = get_messages_after("tg:-555", 0, db=db)
    assert stray.content == "@Robo are you there?" and stray.sender == "tg:7"
    assert [m.content for m in get_messages_after("tg:7", 0, db=db)] == ["@Robo hello in private"]
    assert list_deliveries(db) == []


def test_unattached_chats_past_the_cap_are_dropped_and_polling_goes_on(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI
) -> None:
    """Ingest's bounds on unregistered chats hold for Telegram's: one unattached chat kept (its
    two newest messages), a second one's messages dropped, the attached group's taken, and the
    offset moves past them all (a dropped message is not fetched again and again)."""
    db, settings = tg
    settings = settings.replace(**{"unregistered_chats": 1, "unregistered_chat_messages": 2})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    poller = TelegramPoller(db, settings)
    try:
        for n in range(3):
            fake.push_text(-555, 7, f"kept {n}", chat_type="group")
        fake.push_text(-666, 8, "dropped", chat_type="group")
        fake.push_text(9, 9, "dropped too", chat_type="private")
        fake.push_text(TG_CHAT, 42, "the group's")
        results = poller.poll_once()
        assert poller.offset == max(u["update_id"] for u in fake.updates) + 1
    finally:
        poller.close()
    assert [r.message.chat_jid for r in results] == ["tg:-555"] * 3 + [JID]
    assert [m.content for m in get_messages_after("tg:-555", 0, db=db)] == ["kept 1", "kept 2"]
    assert get_messages_after("tg:-666", 0, db=db) == [] and get_messages_after("tg:9", 0, db=db) == []
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["the group's"]


def test_a_failed_poll_raises_and_keeps_the_offset(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    db, settings = tg
    fake.push_text(TG_CHAT, 1, "hi")
    fake.fail("getUpdates", 500)
    poller = TelegramPoller(db, settings)
    try:
        with pytest.raises(ChannelError, match="getUpdates"):
            poller.poll_once()
        assert poller.offset is None
        assert len(poller.poll_once()) == 1 and poller.offset is not None
    finally:
        poller.close()


def test_the_poll_command_stores_a_batch(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.push_text(TG_CHAT, 42, "via the CLI")
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
        "ORCHESTRATOR_TELEGRAM_BOT_TOKEN": fake.token,
        "ORCHESTRATOR_TELEGRAM_API_BASE": fake.base,
    }
    cli = str(Path(sys.executable).parent / "orchestrator")
    done = subprocess.run(
        [cli, "telegram", "poll", "--once", "--timeout", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "stored 1 message(s)" in done.stdout
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["via the CLI"]


# -- files in ----------------------------------------------------------------------------

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg bytes " * 50


def _poll(db: Database, settings: Settings) -> list[IngestResult]:
    poller = TelegramPoller(db, settings)
    try:
        return poller.poll_once()
    finally:
        poller.close()


def _kept_files(settings: Settings) -> list[Path]:
    """Every file under the store's folder: content and leftovers alike."""
    return [p for p in settings.files_dir.rglob("*") if p.is_file()] if settings.files_dir.exists() else []


def _methods(fake: FakeTelegramAPI) -> list[str]:
    return [r.method for r in fake.requests]


def test_a_document_is_stored_with_its_caption_as_the_words(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    _, held = fake.push_document(TG_CHAT, 42, b"line one\nline two\n", file_name="notes.txt", caption="@Robo read it")
    [result] = _poll(db, settings)
    assert result.created and result.triggered
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "@Robo read it"
    files = files_of(stored.metadata)
    assert files is not None and [(f.name, f.mime, f.size) for f in files.files] == [("notes.txt", "text/plain", 18)]
    store = FileStore.from_settings(db, settings)
    kept = store.get(files.files[0].id, chat_jid=JID)
    assert store.read_bytes(kept) == b"line one\nline two\n"
    [get_file] = fake.calls("getFile")
    assert get_file.params["file_id"] == held.file_id
    assert fake.downloads() == [held.file_path]
    assert render_text(stored, "Robo").endswith("📎 notes.txt (text/plain, 18 B)")


def test_a_senders_file_name_is_made_safe(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.push_document(TG_CHAT, 42, b"x", file_name="../../.bashrc\u202egpj.exe\x00")
    _poll(db, settings)
    [stored] = get_messages_after(JID, 0, db=db)
    files = files_of(stored.metadata)
    assert files is not None and [f.name for f in files.files] == ["bashrcgpj.exe"]
    assert all(settings.files_dir in p.parents for p in _kept_files(settings))


def test_a_photo_takes_its_largest_size_within_the_limit(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    db, settings = tg
    settings = settings.replace(**{"file_max_bytes": 2000})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    small, medium, large = JPEG[:100], JPEG + b"m" * 400, JPEG + b"x" * 3000
    _, held = fake.push_photo(TG_CHAT, 42, [(90, 90, small), (320, 320, medium), (1280, 1280, large)], caption="look")
    _poll(db, settings)
    [stored] = get_messages_after(JID, 0, db=db)
    files = files_of(stored.metadata)
    assert stored.content == "look"
    assert files is not None and [(f.name, f.mime, f.size) for f in files.files] == [
        ("photo.jpg", "image/jpeg", len(medium))
    ]
    assert fake.downloads() == [held[1].file_path]  # the largest within 2000 bytes, and only it


def test_a_chat_that_is_no_registered_group_downloads_nothing(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.push_document(-555, 7, b"malware", file_name="run.sh", caption="@Robo open this")
    fake.push_photo(-555, 7, [(90, 90, JPEG)])
    results = _poll(db, settings)
    assert [(r.created, r.triggered) for r in results] == [(True, False), (True, False)]
    # Not one request about the files: getMe and getUpdates only.
    assert _methods(fake) == ["getMe", "getUpdates"]
    assert [m.content for m in get_messages_after("tg:-555", 0, db=db)] == [
        "@Robo open this\n📎 run.sh: not taken (this chat is no registered group)",
        "📎 photo.jpg: not taken (this chat is no registered group)",
    ]
    assert all(files_of(m.metadata) is None for m in get_messages_after("tg:-555", 0, db=db))
    assert _kept_files(settings) == []


def test_a_file_declared_over_the_limit_is_not_fetched(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    db, settings = tg
    settings = settings.replace(**{"file_max_bytes": 1000})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.push_document(TG_CHAT, 42, b"z" * 1001, file_name="big.txt", caption="here")
    fake.push_photo(TG_CHAT, 42, [(90, 90, JPEG + b"x" * 1000), (320, 320, JPEG + b"x" * 2000)])
    _poll(db, settings)
    assert fake.calls("getFile") == [] and fake.downloads() == []
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == [
        "here\n📎 big.txt: not taken (larger than 1000 B)",
        "📎 photo.jpg: not taken (larger than 1000 B)",
    ]
    assert _kept_files(settings) == []


def test_bytes_that_run_over_the_limit_are_not_stored(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    """The message and getFile both say 10 bytes; 50 KB come: stopped at the limit, nothing kept."""
    db, settings = tg
    settings = settings.replace(**{"file_max_bytes": 1000})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    _, held = fake.push_document(TG_CHAT, 42, b"z" * 50_000, file_name="liar.txt", declared=10)
    _poll(db, settings)
    assert fake.downloads() == [held.file_path]
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "📎 liar.txt: not taken (larger than 1000 B)" and files_of(stored.metadata) is None
    assert FileStore.from_settings(db, settings).list_chat(JID) == []
    assert _kept_files(settings) == []


def test_a_compressed_download_is_never_expanded(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    """A download sent with Content-Encoding: gzip (10 KB that expand to 10 MB) is taken as the
    bytes that came, not inflated in memory."""
    db, settings = tg
    settings = settings.replace(**{"file_max_bytes": 1_000_000})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    bomb = gzip.compress(bytes(10_000_000))
    _, held = fake.push_document(TG_CHAT, 42, bomb, file_name="bomb.bin")
    held.content_encoding = "gzip"
    _poll(db, settings)
    [stored] = get_messages_after(JID, 0, db=db)
    files = files_of(stored.metadata)
    assert files is not None and [f.size for f in files.files] == [len(bomb)]
    store = FileStore.from_settings(db, settings)
    assert store.read_bytes(store.get(files.files[0].id, chat_jid=JID)) == bomb


def test_a_full_group_takes_no_more_files(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    db, settings = tg
    settings = settings.replace(**{"group_files_max_bytes": 100})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.push_document(TG_CHAT, 42, b"a" * 80, file_name="first.txt")
    fake.push_document(TG_CHAT, 42, b"b" * 80, file_name="second.txt")
    _poll(db, settings)
    first, second = get_messages_after(JID, 0, db=db)
    assert files_of(first.metadata) is not None
    assert second.content == "📎 second.txt: not taken (this group's files have no room left under 100 B)"


class _Elsewhere:
    """Another host on loopback: counts what reaches it (nothing must)."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's naming
                hits.append(self.path)
                self.send_response(200)
                self.send_header("content-length", "4")
                self.end_headers()
                self.wfile.write(b"evil")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    "hostile",
    [
        "../../../etc/passwd",
        "documents/../../etc/passwd",
        "/etc/passwd",
        "{elsewhere}/steal",
        "//127.0.0.1/steal",
        "documents/%2e%2e/%2e%2e/x",
        "documents\\..\\x",
        "documents/file_1.txt?x=1",
        ".hidden/file",
    ],
)
def test_a_hostile_file_path_is_never_fetched(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, hostile: str
) -> None:
    """getFile's file_path decides the download URL: one that could leave the configured API's
    folder or host is refused, and no request is made for it, here or anywhere."""
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    elsewhere = _Elsewhere()
    try:
        _, held = fake.push_document(TG_CHAT, 42, b"fine", file_name="a.txt")
        held.file_path = hostile.format(elsewhere=elsewhere.url)
        _poll(db, settings)
    finally:
        elsewhere.close()
    assert len(fake.calls("getFile")) == 1
    assert fake.downloads() == [] and elsewhere.hits == []
    [stored] = get_messages_after(JID, 0, db=db)
    assert stored.content == "📎 a.txt: not taken (Telegram's path for it is not a plain relative one)"
    assert files_of(stored.metadata) is None and _kept_files(settings) == []


@pytest.mark.parametrize("how", ["drips", "stalls"])
def test_a_download_past_its_time_is_stopped(tg: tuple[Database, Settings], fake: FakeTelegramAPI, how: str) -> None:
    """A download that drips (each chunk in time, the whole too slow) or stalls is stopped at
    ORCHESTRATOR_TELEGRAM_FILE_TIMEOUT_S; the message is stored saying so, polling goes on."""
    db, settings = tg
    settings = settings.replace(**{"telegram_file_timeout_s": 0.6})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    _, held = fake.push_document(TG_CHAT, 42, b"s" * (4096 * 40), file_name="slow.txt")
    held.delay_s = 0.1 if how == "drips" else 5.0
    poller = TelegramPoller(db, settings)
    try:
        started = time.monotonic()
        [result] = poller.poll_once()
        took = time.monotonic() - started
        assert poller.offset == max(u["update_id"] for u in fake.updates) + 1
    finally:
        poller.close()
    assert took < 3.0
    assert result.message.content == "📎 slow.txt: not taken (the download took longer than 0.6 s)"
    assert _kept_files(settings) == []


def test_an_album_is_a_message_per_photo_each_with_its_file(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI
) -> None:
    """A media group arrives as one message per item (one media_group_id): each is stored with its file."""
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.push_photo(TG_CHAT, 42, [(90, 90, JPEG + b"1")], caption="our trip", media_group_id="album-1")
    fake.push_photo(TG_CHAT, 42, [(90, 90, JPEG + b"2")], media_group_id="album-1")
    _poll(db, settings)
    first, second = get_messages_after(JID, 0, db=db)
    assert first.content == "our trip"
    sizes = [[f.size for f in files.files] for m in (first, second) if (files := files_of(m.metadata))]
    assert sizes == [[len(JPEG) + 1], [len(JPEG) + 1]]
    assert len(FileStore.from_settings(db, settings).list_chat(JID)) == 2


def test_a_redelivered_file_message_is_not_downloaded_again(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    update, _ = fake.push_document(TG_CHAT, 42, b"once", file_name="once.txt")
    assert [r.created for r in _poll(db, settings)] == [True]
    fake.push_document(TG_CHAT, 42, b"once", file_name="once.txt", message_id=update["message"]["message_id"])
    assert [r.created for r in _poll(db, settings)] == [False]
    assert len(fake.calls("getFile")) == 1 and len(fake.downloads()) == 1
    assert len(FileStore.from_settings(db, settings).list_chat(JID)) == 1


def test_a_sender_over_its_rate_gets_nothing_downloaded(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    db, settings = tg
    settings = settings.replace(**{"sender_messages_per_minute": 1})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    fake.push_text(TG_CHAT, 42, "first")
    fake.push_document(TG_CHAT, 42, b"flood", file_name="flood.txt")
    assert [r.message.content for r in _poll(db, settings)] == ["first"]
    assert fake.calls("getFile") == [] and fake.downloads() == []
    assert [text for _, text in fake.sent()] == ["⏳ slow down: try again in 60 s (this message was not taken)"]


def test_a_file_whose_message_is_refused_is_not_kept(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    """The sender's rate is used up while its file downloads (another message of theirs is
    stored meanwhile): the message is refused, and its file is taken back, not left to count
    against the group."""
    db, settings = tg
    settings = settings.replace(**{"sender_messages_per_minute": 1})
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    _, held = fake.push_document(TG_CHAT, 42, b"raced", file_name="raced.txt")
    meanwhile = IncomingMessage(chat_jid=JID, sender="tg:42", content="meanwhile", channel="telegram")
    held.on_download = lambda: ingest(db, settings, meanwhile, signal=None)
    assert _poll(db, settings) == []
    assert fake.downloads() == [held.file_path]
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["meanwhile"]
    store = FileStore.from_settings(db, settings)
    assert store.list_chat(JID) == [] and store.group_bytes(JID) == 0
    assert [p.name for p in _kept_files(settings)] == []


# -- files out -----------------------------------------------------------------------------


def _send_files(db: Database, settings: Settings, *files: tuple[bytes, str]) -> int:
    """An assistant message carrying ``files`` (bytes, name), as a run's send_file stores one."""
    store = FileStore.from_settings(db, settings)
    stored = [store.store_bytes(JID, data, name) for data, name in files]
    incoming = IncomingMessage(
        chat_jid=JID,
        sender="bot",
        sender_name="Robo",
        content="here you are",
        message_type="assistant",
        is_from_me=True,
        metadata=file_envelope(stored, extras={"via": "send_file"}),
    )
    return ingest(db, settings, incoming, signal=None).message.seq


def test_files_go_as_a_photo_and_a_document_after_the_words(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    seq = _send_files(db, settings, (PNG, "chart.png"), (b"a,b\n1,2\n", "data.csv"))
    assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 1
    assert _methods(fake) == ["getMe", "sendMessage", "sendPhoto", "sendDocument"]
    [(_, text)] = fake.sent()
    assert text.startswith("Robo: here you are\n📎 chart.png (image/png")
    assert fake.uploads() == [
        ("sendPhoto", str(TG_CHAT), Upload("chart.png", "image/png", PNG)),
        ("sendDocument", str(TG_CHAT), Upload("data.csv", "text/plain", b"a,b\n1,2\n")),
    ]
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("sent", 1)
    words, photo, document = fake.live(TG_CHAT)
    assert (words.kind, photo.kind, document.kind) == ("text", "photo", "document")
    assert row.sent_ids == [str(words.message_id), f"file:{photo.message_id}", f"file:{document.message_id}"]


def test_a_retry_after_a_failed_file_sends_only_the_missing_one(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    seq = _send_files(db, settings, (PNG, "chart.png"), (b"notes\n", "notes.txt"))
    fake.fail("sendDocument", 500)
    deliverer = Deliverer(db, settings, ChannelRegistry([channel]))
    _deliver_until(deliverer, lambda: len(fake.uploads()) == 2, "both files")
    assert [r.status for r in fake.calls("sendMessage")] == [200]
    assert [r.status for r in fake.calls("sendPhoto")] == [200]
    assert [r.status for r in fake.calls("sendDocument")] == [500, 200]
    assert [(m, u.filename) for m, _, u in fake.uploads()] == [
        ("sendPhoto", "chart.png"),
        ("sendDocument", "notes.txt"),
    ]
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("sent", 2)


def test_a_photo_telegram_refuses_goes_as_a_document(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    db, settings = tg
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    _send_files(db, settings, (PNG, "wide.png"))
    fake.fail("sendPhoto", 400, description="Bad Request: PHOTO_INVALID_DIMENSIONS")
    assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 1
    assert [r.status for r in fake.calls("sendPhoto")] == [400]
    assert fake.uploads() == [("sendDocument", str(TG_CHAT), Upload("wide.png", "image/png", PNG))]


def test_what_goes_as_a_photo() -> None:
    def stored(mime: str, size: int) -> StoredFile:
        return StoredFile("id", JID, "0" * 64, size, mime, "f", JID, datetime.now(UTC))

    assert upload_method(stored("image/png", 10_000_000)) == "sendPhoto"
    assert upload_method(stored("image/jpeg", 5)) == "sendPhoto"
    assert upload_method(stored("image/webp", 5)) == "sendPhoto"
    assert upload_method(stored("image/png", 10_000_001)) == "sendDocument"  # past sendPhoto's 10 MB
    assert upload_method(stored("image/gif", 5)) == "sendDocument"  # Telegram animates GIFs: a document
    assert upload_method(stored("text/plain", 5)) == "sendDocument"
    assert upload_method(stored("application/octet-stream", 5)) == "sendDocument"


def test_a_forged_envelope_never_sends_another_chats_file(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, channel: TelegramChannel
) -> None:
    """The channel reads only the message's own chat's files: an envelope naming another
    chat's file (which ingest refuses; here handed to the channel as it is) sends no bytes."""
    db, settings = tg
    add_group(db, chat_jid="other@chat", name="Other", folder="other")
    theirs = FileStore.from_settings(db, settings).store_bytes("other@chat", b"their secret", "secret.txt")
    rendered = RenderedMessage(
        text="Robo: see\n📎 secret.txt",
        chat_jid=JID,
        seq=1,
        id="forged",
        message_type="assistant",
        sender="bot",
        sender_name="Robo",
        content="see",
        metadata=file_envelope([theirs]),
    )
    channel.send(str(TG_CHAT), rendered)
    assert fake.uploads() == []
    assert [text for _, text in fake.sent()] == ["Robo: see\n📎 secret.txt", "📎 secret.txt: no longer stored"]


# -- the plugin entry -----------------------------------------------------------------------


def test_the_plugin_entry_adds_the_channel(tg: tuple[Database, Settings]) -> None:
    _, settings = tg
    registry = build_registry(settings.replace(**{"channel_plugins": "orchestrator.channels.telegram:channel"}))
    try:
        ch = registry.get("telegram")
        assert isinstance(ch, TelegramChannel)
        assert ch.owns("-1001234567890") and ch.owns("42") and ch.owns("@my_channel")
        assert not ch.owns("team@chat") and not ch.owns("https://example.com")
    finally:
        registry.close()
    with pytest.raises(ChannelError, match="TELEGRAM_BOT_TOKEN"):
        build_registry(
            settings.replace(**{"channel_plugins": "orchestrator.channels.telegram:channel", "telegram_bot_token": ""})
        )
