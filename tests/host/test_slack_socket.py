"""Slack's Socket Mode on a real database against a fake Socket Mode server on loopback:
``apps.connections.open`` with the app-level token, ``hello``, ``events_api`` envelopes
stored in the attached group and acknowledged, an envelope whose storing failed left
unacknowledged and stored once when Slack sends it again, Slack's ``disconnect`` (a new
connection, nothing lost), and the ``orchestrator slack socket`` command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakes.slack_api import FakeSlack, fake_slack  # noqa: F401 - the fixture "fake"
from orchestrator.channels.slack_socket import SlackSocket
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import wait_until

JID = "team@chat"
SLACK_CHANNEL = "C0TEAM0001"


@pytest.fixture
def sl(db: Database, settings: Settings, fake: FakeSlack) -> tuple[Database, Settings]:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    attach_channel(db, JID, "desk")
    return db, settings.replace(
        slack_bot_token=fake.bot_token, slack_app_token=fake.app_token, slack_api_base=fake.base
    )


def _contents(db: Database) -> list[str]:
    return [m.content for m in get_messages_after(JID, 0, db=db)]


def test_envelopes_are_stored_and_acknowledged(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    signalled: list[str] = []
    listener = SlackSocket(db, settings, signal=signalled.append)
    try:
        listener.connect()
        wait_until(lambda: fake.hellos == 1, 10, "the hello")
        [opened] = fake.calls("apps.connections.open")
        assert opened.token == fake.app_token  # the app-level token, not the bot's
        first = fake.push_event(fake.message_event(SLACK_CHANNEL, "UANN0001", f"<@{fake.bot_user}> ship it"))
        bots = fake.push_event(fake.message_event(SLACK_CHANNEL, fake.bot_user, "@Robo our own reply"))
        assert fake.wait_acks(2) == [first, bots] or sorted(fake.wait_acks(2)) == sorted([first, bots])
    finally:
        listener.close()
    [stored] = get_messages_after(JID, 0, db=db)
    assert (stored.content, stored.sender, stored.sender_name) == ("@Robo ship it", "slack:UANN0001", "Ann Lee")
    assert signalled == [JID]  # the mention woke the agent
    assert [d.channel for d in list_deliveries(db, message_seq=stored.seq)] == ["desk"]  # mirrored, not echoed


def test_an_envelope_not_stored_is_not_acknowledged_and_is_stored_once_when_sent_again(
    sl: tuple[Database, Settings],
    fake: FakeSlack,
) -> None:
    db, settings = sl
    # A database that cannot be reached: storing fails, so the envelope must not be acknowledged.
    away = Database("postgresql://nobody@127.0.0.1:1/none")
    broken = SlackSocket(away, settings)
    try:
        broken.connect()
        envelope = fake.push_event(fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo are you there?"))
        wait_until(lambda: broken.failed == 1, 30, "the failed store")
        assert fake.acks == [] and _contents(db) == []
    finally:
        broken.close()
        away.engine.dispose()
    listener = SlackSocket(db, settings)
    try:
        listener.connect()
        wait_until(lambda: fake.hellos == 2, 10, "the second connection")
        fake.redeliver()  # Slack sends what was not acknowledged again (retry_attempt 1)
        assert fake.wait_acks(1) == [envelope]
        fake.acks.clear()
        fake.resend(envelope)  # at least once: an acknowledged one again is the same message
        assert fake.wait_acks(1) == [envelope]
    finally:
        listener.close()
    assert _contents(db) == ["@Robo are you there?"]


def test_a_disconnect_from_slack_is_a_new_connection_and_nothing_is_lost(
    sl: tuple[Database, Settings], fake: FakeSlack
) -> None:
    db, settings = sl
    listener = SlackSocket(db, settings)
    try:
        listener.connect()
        fake.push_event(fake.message_event(SLACK_CHANNEL, "UANN0001", "before"))
        fake.wait_acks(1)
        fake.push_disconnect()
        wait_until(lambda: fake.hellos == 2 and len(fake.connections) == 1, 15, "a new connection")
        assert len(fake.calls("apps.connections.open")) == 2
        fake.push_event(fake.message_event(SLACK_CHANNEL, "UBOB0002", "after"))
        assert len(fake.wait_acks(2)) == 2
    finally:
        listener.close()
    assert _contents(db) == ["before", "after"]


def test_a_wrong_app_token_is_said(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    with pytest.raises(ChannelError, match="SLACK_APP_TOKEN"):
        SlackSocket(db, settings.replace(slack_app_token=""))
    listener = SlackSocket(db, settings.replace(slack_app_token="xapp-wrong"))
    try:
        with pytest.raises(ChannelError, match="not_allowed_token_type"):
            listener.connect()
    finally:
        listener.close()


def test_the_socket_command_stores_what_arrives(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    fake.push_event(fake.message_event(SLACK_CHANNEL, "UANN0001", "via the CLI"))  # waits for a connection
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
        "ORCHESTRATOR_SLACK_BOT_TOKEN": fake.bot_token,
        "ORCHESTRATOR_SLACK_APP_TOKEN": fake.app_token,
        "ORCHESTRATOR_SLACK_API_BASE": fake.base,
    }
    cli = str(Path(sys.executable).parent / "orchestrator")
    done = subprocess.run(
        [cli, "slack", "socket", "--seconds", "3"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "slack: connected (Socket Mode)" in done.stdout and "1 envelope(s) taken" in done.stdout
    assert _contents(db) == ["via the CLI"] and len(fake.acks) == 1
