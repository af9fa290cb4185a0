"""Telegram on a real database against a fake Bot API on loopback: delivery
through the deliveries table (retried, once, split), long-polled updates
stored in the attached group (mirrored, not echoed, deduplicated), unattached
chats stored (within ingest's bounds) but never waking an agent, the plugin entry."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.channels.registry import build_registry
from orchestrator.channels.telegram import TelegramChannel, TelegramPoller, split_text
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries, utc_now
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import wait_until
from tests.fakes.channel import RecordingChannel
from tests.fakes.telegram_api import FakeTelegramAPI, utf16_len

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
    ch = TelegramChannel(tg[1])
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
