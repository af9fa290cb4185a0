"""Slack on a real database against a fake Slack Web API on loopback: delivery through
the deliveries table (Block Kit, split, escaped, retried after 429 Retry-After and 500s,
posted once), replies in the thread they answer, and the Events API route (signature,
window, challenge, retries, what a sender may not choose, bots never taken in,
mentions of the bot as the trigger, mirrored not echoed, unattached channels)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from fakes.channel import RecordingChannel
from fakes.slack_api import FakeSlack, fake_slack  # noqa: F401 - the fixture "fake"
from orchestrator.channels.registry import build_registry
from orchestrator.channels.slack import SlackChannel, SlackWeb
from orchestrator.channels.slack_blocks import SECTION_LIMIT, escape, slack_posts, split_escaped, unescape
from orchestrator.channels.slack_inbound import (
    EVENTS_PATH,
    RETRY_HEADER,
    SIGNATURE_HEADER,
    SlackInbound,
    signed_headers,
)
from orchestrator.core.errors import ChannelError
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.envelopes import build_structured_envelope
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import list_deliveries, utc_now
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.tables import DeliveryRow
from tests.conftest import wait_until

JID = "team@chat"
SLACK_CHANNEL = "C0TEAM0001"
SIGNING = "slack-signing-secret-5e1d"
THREAD_TS = "1700000000.000100"


@pytest.fixture
def sl(db: Database, settings: Settings, fake: FakeSlack) -> tuple[Database, Settings]:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    return db, settings.replace(
        **{
            "slack_bot_token": fake.bot_token,
            "slack_api_base": fake.base,
            "slack_signing_secret": SIGNING,
            "delivery_retry_base_s": 0.05,
            "delivery_retry_max_s": 0.1,
        }
    )


@pytest.fixture
def channel(sl: tuple[Database, Settings]) -> Iterator[SlackChannel]:
    ch = SlackChannel(sl[1], db=sl[0])
    yield ch
    ch.disconnect()


def _say(db: Database, settings: Settings, content: str, **kw: Any) -> int:
    fields: dict[str, Any] = {"sender": "ann", "sender_name": "Ann", **kw}
    incoming = IncomingMessage(chat_jid=JID, content=content, **fields)
    return ingest(db, settings, incoming, signal=None, wake=False).message.seq


def _reply(db: Database, settings: Settings, content: str, *, metadata: dict[str, Any] | None = None) -> int:
    return _say(
        db,
        settings,
        content,
        sender="bot",
        sender_name="Robo",
        is_from_me=True,
        message_type="assistant",
        metadata=metadata,
    )


def _deliver_until(deliverer: Deliverer, cond: Any, what: str, timeout: float = 10) -> None:
    def step() -> bool:
        deliverer.deliver_due()
        return bool(cond())

    wait_until(step, timeout, what)


def _due_now(db: Database, seq: int) -> None:
    """Make a pending delivery due at once, as its backoff soon would (the test need not wait)."""
    with db.write() as session:
        session.execute(update(DeliveryRow).where(DeliveryRow.message_seq == seq).values(next_attempt_at=utc_now()))


def _texts(post: Any) -> list[str]:
    return [b["text"]["text"] if b["type"] == "section" else b["elements"][0]["text"] for b in post.blocks]


# -- outbound -------------------------------------------------------------------------------


def test_a_delivered_message_is_posted_as_block_kit(
    sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    registry = ChannelRegistry([channel])
    with pytest.raises(ChannelError, match="cannot reach"):  # the group's jid is no Slack channel id
        attach_channel(db, JID, "slack", registry=registry)
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL, registry=registry)
    seq = _say(db, settings, "hello <b> & <!channel>")
    assert Deliverer(db, settings, registry).deliver_due().sent == 1
    [post] = fake.live_posts(SLACK_CHANNEL)
    # Escaped: no markup of the sender's becomes a mention, a broadcast or a link.
    assert _texts(post) == ["Ann: hello &lt;b&gt; &amp; &lt;!channel&gt;"]
    assert post.text == "Ann: hello &lt;b&gt; &amp; &lt;!channel&gt;" and post.thread_ts is None
    [call] = fake.calls("chat.postMessage")
    assert call.token == fake.bot_token and call.params["unfurl_links"] is False
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.channel, row.address, row.state, row.attempts) == ("slack", SLACK_CHANNEL, "sent", 1)


def test_429_and_500_are_retried_by_the_ledger_and_posted_once(
    sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    fake.fail("chat.postMessage", 500)
    fake.fail("chat.postMessage", 500, raw="<html><body>upstream connect error</body></html>")
    fake.fail("chat.postMessage", 429, retry_after=1)
    seq = _say(db, settings, "persist")
    # A long backoff for the 500s (the test makes each retry due itself), so that one
    # deliver_due makes one attempt however slow the database is.
    slow = Deliverer(
        db, settings.replace(delivery_retry_base_s=30.0, delivery_retry_max_s=60.0), ChannelRegistry([channel])
    )
    slow.deliver_due()
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("pending", 1) and "internal_error" in (row.last_error or "")
    _due_now(db, seq)
    slow.deliver_due()
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("pending", 2) and "non-JSON" in (row.last_error or "")
    _due_now(db, seq)  # the third attempt meets the 429
    deliverer = Deliverer(db, settings, ChannelRegistry([channel]))
    before = utc_now()
    report = deliverer.deliver_due()
    assert report.failed_attempts == 1
    [row] = list_deliveries(db, message_seq=seq)
    assert row.state == "pending" and "rate limited (retry after 1 s)" in (row.last_error or "")
    # Retry-After (1 s) is honoured although the backoff would be 0.1 s at most.
    assert row.next_attempt_at - before >= timedelta(seconds=0.99)
    assert deliverer.deliver_due().sent == 0 and report.retry_in is not None and report.retry_in > 0.8
    _deliver_until(deliverer, lambda: len(fake.live_posts()) == 1, "slack to take the message")
    for _ in range(3):
        deliverer.deliver_due()
    assert [r.status for r in fake.calls("chat.postMessage")] == [500, 500, 429, 200]
    assert [p.text for p in fake.live_posts()] == ["Ann: persist"]
    [row] = list_deliveries(db, message_seq=seq)
    assert (row.state, row.attempts) == ("sent", 3)  # the 429 used up no attempt: two 500s and the send


def test_a_long_reply_is_several_posts_and_a_failed_one_is_resent_alone(
    sl: tuple[Database, Settings],
    fake: FakeSlack,
    channel: SlackChannel,
) -> None:
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    body = "\n".join(f"line {i:05d} " + "x" * 90 for i in range(400))  # ~40,000 characters
    _reply(db, settings, body)
    fake.fail("chat.postMessage", 500, after=1)  # the first post goes, the second fails
    deliverer = Deliverer(db, settings, ChannelRegistry([channel]))
    _deliver_until(deliverer, lambda: not list_deliveries(db, state="pending"), "all posts")
    posts = fake.live_posts()
    assert [p.text for p in posts][1:] == ["(continued)"] * 3 and posts[0].text.startswith("line 00000 ")
    assert len(posts) == 4 and [r.status for r in fake.calls("chat.postMessage")] == [200, 500, 200, 200, 200]
    texts = [t for p in posts for t in _texts(p)]
    assert all(len(t) <= SECTION_LIMIT for t in texts)
    assert "".join(texts) == body  # nothing lost, nothing twice, in order
    assert all(t.endswith("\n") for t in texts[:-1])  # cut at line breaks
    # The ledger keeps each post's ts, the first one's too though a retry sent the rest.
    [row] = list_deliveries(db, state="sent")
    assert row.sent_ids == [p.ts for p in posts]


def test_structured_messages_are_drawn_as_blocks(
    sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    edit = build_structured_envelope(
        "CODE_EDIT", {"edits": [{"file_path": "app.py", "old_content": "a = 1\n", "new_content": "a = 2\n```\n"}]}
    )
    todo = build_structured_envelope(
        "TODO",
        {
            "todos": [
                {"id": "1", "content": "plan", "status": "completed"},
                {"id": "2", "content": "build", "status": "in_progress"},
                {"id": "3", "content": "ship <it>", "status": "pending"},
            ]
        },
    )
    call = build_structured_envelope("TOOL_CALL", {"tool_name": "deploy", "input": {"env": "prod"}, "output": "ok"})
    _reply(db, settings, "edited app.py", metadata=edit)
    _reply(db, settings, "todo", metadata=todo)
    _reply(db, settings, "deploy", metadata=call)
    _say(db, settings, "the build is green", sender="host", sender_name="host", message_type="host", is_from_me=True)
    _say(db, settings, "run failed", sender="system", sender_name="system", message_type="system", is_from_me=True)
    assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 5
    diff, checklist, tool, host, system = fake.live_posts()
    assert [b["type"] for b in diff.blocks] == ["section", "section"]
    assert _texts(diff)[0] == "✏️ edited app.py"
    code = _texts(diff)[1]
    assert code.startswith("```\n--- a/app.py\n+++ b/app.py") and code.endswith("\n```")
    assert "-a = 1\n+a = 2\n+`\u200b``" in code  # a fence in the code does not end the block
    assert _texts(checklist) == ["📋 to do", "✅ ~plan~\n🔄 build\n⬜ ship &lt;it&gt;"]
    assert [b["type"] for b in tool.blocks] == ["context"] and _texts(tool)[0].startswith("🔧 deploy\ninput: ")
    assert [b["type"] for b in host.blocks] == ["context"] and _texts(host) == ["🏠 the build is green"]
    assert [b["type"] for b in system.blocks] == ["context"] and _texts(system) == ["⚙️ [system] run failed"]


def test_a_reply_to_a_message_in_a_thread_goes_to_that_thread(
    sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    thread_ts = "1700000000.000100"
    asked = _say(
        db,
        settings,
        "@Robo in the thread",
        sender="slack:UANN0001",
        channel="slack",
        metadata={"slack_channel": SLACK_CHANNEL, "slack_ts": "1700000005.000200", "slack_thread_ts": thread_ts},
    )
    top = _say(
        db,
        settings,
        "@Robo at the top",
        sender="slack:UANN0001",
        channel="slack",
        metadata={"slack_channel": SLACK_CHANNEL, "slack_ts": "1700000009.000300"},
    )
    _reply(db, settings, "threaded answer", metadata={REPLY_TO_KEY: asked, RUN_ID_KEY: "r1"})
    _reply(db, settings, "top answer", metadata={REPLY_TO_KEY: top, RUN_ID_KEY: "r2"})
    # A thread of another Slack channel is no thread here.
    other = _say(
        db,
        settings,
        "elsewhere",
        sender="slack:UANN0001",
        channel="slack",
        metadata={"slack_channel": "C0OTHER001", "slack_ts": "1700000010.000100", "slack_thread_ts": thread_ts},
    )
    _reply(db, settings, "not threaded", metadata={REPLY_TO_KEY: other, RUN_ID_KEY: "r3"})
    assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent == 3  # people's: not echoed
    assert [(p.text, p.thread_ts) for p in fake.live_posts()] == [
        ("threaded answer", thread_ts),
        ("top answer", None),
        ("not threaded", None),
    ]


def test_escaping_and_splitting() -> None:
    assert escape("<@U1> & <!here>") == "&lt;@U1&gt; &amp; &lt;!here&gt;"
    assert unescape(escape("a &lt; <b> &amp;")) == "a &lt; <b> &amp;"
    text = "x" * 2998 + "&amp;" + "y" * 10
    pieces = split_escaped(text, 3000)
    assert pieces[0] == "x" * 2998 and "".join(pieces) == text  # never inside an escape
    assert split_escaped("", 10) == []


def test_a_post_has_at_most_50_blocks() -> None:
    from orchestrator.model.render import RenderedMessage

    lines = "\n".join("z" * 2999 for _ in range(120))
    rendered = RenderedMessage(
        text=lines,
        chat_jid=JID,
        seq=1,
        id="m",
        message_type="assistant",
        sender="bot",
        sender_name="Robo",
        content=lines,
    )
    posts = slack_posts(rendered)
    assert all(len(p.blocks) <= 50 for p in posts) and len(posts) >= 30
    assert "".join(b["text"]["text"] for p in posts for b in p.blocks) == lines


# What each kind of stored message is drawn as (block types, the first block's text, the
# notification text), plain, with a TOOL_CALL envelope and with a TODO's.  Records (thinking,
# tool_use, result_meta, egress_log) never reach a channel; they are here so that drawing by
# the message's part is held to what drawing by its type and sender was.
_CALL_TEXT = '🔧 deploy\ninput: {"env": "prod"}\nok'
_DRAWN: list[tuple[str, str, dict[str, list[str] | str]]] = [
    ("user", "slack:U1", {"plain": ["section", "Ann: words", "Ann: words"],
                          "call": ["context", f"Ann:\n{_CALL_TEXT}", f"Ann:\n{_CALL_TEXT}"],
                          "todo": ["section", "Ann: 📋 to do", "Ann: ○ plan"]}),
    ("assistant", "bot", {"plain": ["section", "words", "words"],
                          "call": ["context", _CALL_TEXT, f"Robo:\n{_CALL_TEXT}"],
                          "todo": ["section", "📋 to do", "Robo: ○ plan"]}),
    ("assistant", "thinking", {"plain": ["context", "💭 words", "💭 words"],
                               "call": ["context", _CALL_TEXT, "💭 words"],
                               "todo": ["context", "💭 words", "💭 words"]}),
    ("assistant", "tool_use", {"plain": ["context", "🛠️ words", "🛠️ words"],
                               "call": ["context", _CALL_TEXT, "🛠️ words"],
                               "todo": ["context", "🛠️ words", "🛠️ words"]}),
    ("assistant", "result_meta", {"plain": ["section", "words", "words"],
                                  "call": ["context", _CALL_TEXT, f"Robo:\n{_CALL_TEXT}"],
                                  "todo": ["section", "📋 to do", "Robo: ○ plan"]}),
    ("system", "result_meta", {"plain": ["context", "⚙️ [system] words", "⚙️ [system] words"],
                               "call": ["context", f"⚙️ [system] {_CALL_TEXT}", f"⚙️ [system] {_CALL_TEXT}"],
                               "todo": ["context", "⚙️ [system] ○ plan", "⚙️ [system] ○ plan"]}),
    ("system", "egress_log", {"plain": ["context", "⚙️ [system] words", "⚙️ [system] words"],
                              "call": ["context", f"⚙️ [system] {_CALL_TEXT}", f"⚙️ [system] {_CALL_TEXT}"],
                              "todo": ["context", "⚙️ [system] ○ plan", "⚙️ [system] ○ plan"]}),
    ("system", "system", {"plain": ["context", "⚙️ [system] words", "⚙️ [system] words"],
                          "call": ["context", f"⚙️ [system] {_CALL_TEXT}", f"⚙️ [system] {_CALL_TEXT}"],
                          "todo": ["context", "⚙️ [system] ○ plan", "⚙️ [system] ○ plan"]}),
    ("host", "host", {"plain": ["context", "🏠 words", "🏠 words"],
                      "call": ["context", "🏠 words", "🏠 words"],
                      "todo": ["context", "🏠 words", "🏠 words"]}),
    ("tool_result", "tool_result", {"plain": ["context", "🔧\nwords", "🔧\nwords"],
                                    "call": ["context", '🔧\ninput: {"env": "prod"}\nok', '🔧\ninput: {"env": "prod"}\nok'],
                                    "todo": ["context", "🔧\n○ plan", "🔧\n○ plan"]}),
]  # fmt: skip


@pytest.mark.parametrize(("message_type", "sender", "drawn"), _DRAWN, ids=[f"{t}-{s}" for t, s, _ in _DRAWN])
def test_each_kind_of_message_is_drawn_as_its_part_says(
    message_type: str, sender: str, drawn: dict[str, list[str]]
) -> None:
    from orchestrator.model.messages import StoredMessage
    from orchestrator.model.render import render

    envelopes = {
        "plain": None,
        "call": build_structured_envelope(
            "TOOL_CALL", {"tool_name": "deploy", "input": {"env": "prod"}, "output": "ok"}
        ),
        "todo": build_structured_envelope("TODO", {"todos": [{"id": "1", "content": "plan", "status": "pending"}]}),
    }
    for name, metadata in envelopes.items():
        person = message_type == "user"
        stored = StoredMessage.model_validate(
            {"seq": 1, "id": "m", "chat_jid": JID, "sender": sender, "sender_name": "Ann" if person else "",
             "content": "words", "timestamp": "t", "is_from_me": not person, "message_type": message_type,
             "metadata": metadata}
        )  # fmt: skip
        (post,) = slack_posts(render(stored, "Robo"))
        blocks, first, fallback = drawn[name]
        assert [b["type"] for b in post.blocks][0] == blocks, name
        assert _texts(post)[0] == escape(first), name
        assert post.text == escape(fallback), name


def test_the_plugin_entry_adds_the_channel(sl: tuple[Database, Settings]) -> None:
    _, settings = sl
    registry = build_registry(settings.replace(channel_plugins="orchestrator.channels.slack:channel"))
    try:
        ch = registry.get("slack")
        assert isinstance(ch, SlackChannel)
        assert ch.owns("C0123456789") and ch.owns("G01ABCDEF") and ch.owns("D0BOTDM01")
        assert not ch.owns("team@chat") and not ch.owns("c0123456789") and not ch.owns("#general")
    finally:
        registry.close()
    with pytest.raises(ChannelError, match="SLACK_BOT_TOKEN"):
        build_registry(settings.replace(channel_plugins="orchestrator.channels.slack:channel", slack_bot_token=""))


def test_groups_attach_takes_a_slack_channel_id(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
        "ORCHESTRATOR_SLACK_BOT_TOKEN": fake.bot_token,
        "ORCHESTRATOR_SLACK_API_BASE": fake.base,
        "ORCHESTRATOR_CHANNEL_PLUGINS": "orchestrator.channels.slack:channel",
    }
    cli = str(Path(sys.executable).parent / "orchestrator")
    bad = subprocess.run(
        [cli, "groups", "attach", JID, "slack", "--address", "#general"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "cannot reach" in bad.stderr
    done = subprocess.run(
        [cli, "groups", "attach", JID, "slack", "--address", SLACK_CHANNEL],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{JID}: attached to slack at {SLACK_CHANNEL}"
    _say(db, settings, "attached from the CLI")
    assert [(d.channel, d.address) for d in list_deliveries(db)] == [("slack", SLACK_CHANNEL)]


def test_secrets_are_masked(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    _, settings = sl
    settings = settings.replace(slack_app_token=fake.app_token)
    shown = repr(settings)
    for secret in (fake.bot_token, fake.app_token, SIGNING):
        assert secret not in shown and secret in settings.secrets()


# -- the Events API -------------------------------------------------------------------------


@pytest.fixture
def client(sl: tuple[Database, Settings]) -> Iterator[TestClient]:
    app = create_app(Orchestrator(sl[1]))
    with TestClient(app) as c:
        yield c


def _post(
    client: TestClient,
    doc: Any,
    *,
    secret: str = SIGNING,
    timestamp: float | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    body = json.dumps(doc).encode()
    return client.post(
        EVENTS_PATH, content=body, headers={**signed_headers(secret, body, timestamp=timestamp), **(headers or {})}
    )


def test_the_url_verification_challenge_is_answered(client: TestClient) -> None:
    r = _post(
        client,
        {"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"},
    )
    assert r.status_code == 200 and r.json() == {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}


def test_the_signature_and_the_window_are_checked(client: TestClient, fake: FakeSlack, db: Database) -> None:
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    doc = fake.message_event(SLACK_CHANNEL, "UANN0001", "hi")
    assert _post(client, doc, secret="another-secret").status_code == 401
    assert _post(client, doc, timestamp=time.time() - 301).status_code == 401  # a replay, past 5 minutes
    assert _post(client, doc, timestamp=time.time() + 301).status_code == 401
    body = json.dumps(doc).encode()
    good = signed_headers(SIGNING, body)
    assert client.post(EVENTS_PATH, content=body + b" ", headers=good).status_code == 401  # the body is signed
    assert client.post(EVENTS_PATH, content=body, headers={**good, SIGNATURE_HEADER: ""}).status_code == 401
    assert get_messages_after(JID, 0, db=db) == []
    assert _post(client, doc, timestamp=time.time() - 250).status_code == 200
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["hi"]


def test_off_without_a_signing_secret(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    app = create_app(Orchestrator(sl[1].replace(slack_signing_secret="")))
    with TestClient(app) as c:
        r = _post(c, {"type": "url_verification", "challenge": "x"})
    assert r.status_code == 404 and "SLACK_SIGNING_SECRET" in r.json()["detail"]


def test_an_event_becomes_a_message_of_the_attached_group(
    client: TestClient, sl: tuple[Database, Settings], fake: FakeSlack, channel: SlackChannel
) -> None:
    db, settings = sl
    desk = RecordingChannel("desk")
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    attach_channel(db, JID, "desk")
    doc = fake.message_event(
        SLACK_CHANNEL, "UANN0001", f"<@{fake.bot_user}> what's &lt;up&gt; &amp; why?", thread_ts="1700000000.000100"
    )
    assert _post(client, doc).json() == {"ok": True}
    [stored] = get_messages_after(JID, 0, db=db)
    assert (stored.sender, stored.sender_name, stored.message_type) == ("slack:UANN0001", "Ann Lee", "user")
    assert stored.content == "@Robo what's <up> & why?"  # the bot's mention is the trigger word
    ts = doc["event"]["ts"]
    assert stored.id == f"slack-{SLACK_CHANNEL}-{ts}" and stored.metadata == {
        "slack_channel": SLACK_CHANNEL,
        "slack_ts": ts,
        "slack_thread_ts": "1700000000.000100",
        "origin_channel": "slack",
    }
    # Mirrored to the group's other channel, not echoed back to Slack.
    assert [d.channel for d in list_deliveries(db, message_seq=stored.seq)] == ["desk"]
    Deliverer(db, settings, ChannelRegistry([channel, desk])).deliver_due()
    assert desk.rendered == ["Ann Lee: @Robo what's <up> & why?"] and fake.live_posts() == []


def test_the_trigger_word_and_the_mention_wake_the_agent(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    signalled: list[str] = []
    inbound = SlackInbound(db, settings, signal=signalled.append, web=SlackWeb(settings))
    quiet = inbound.take(fake.message_event(SLACK_CHANNEL, "UANN0001", "just chatting"))
    word = inbound.take(fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo please"))
    assert quiet is not None and not quiet.triggered and word is not None and word.triggered
    # app_mention without authorizations in the document: the bot's id comes from auth.test.
    doc = fake.message_event(SLACK_CHANNEL, "UBOB0002", f"<@{fake.bot_user}|robo> hey", event_type="app_mention")
    doc["authorizations"] = []
    mention = inbound.take(doc)
    assert mention is not None and mention.triggered and mention.message.content == "@Robo hey"
    assert mention.message.sender_name == "Bob" and len(fake.calls("auth.test")) == 1
    assert signalled == [JID]  # one signal: the group had pending work after the first


def test_a_mention_wakes_a_group_with_trigger_names_of_its_own(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    from orchestrator.run.profile import change_profile

    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    change_profile(db, settings, JID, {"assistant_name": None, "trigger_names": ["Scout"]}, image_exists=lambda _: True)
    inbound = SlackInbound(db, settings, signal=lambda _: None, web=SlackWeb(settings))
    mention = inbound.take(fake.message_event(SLACK_CHANNEL, "UANN0001", f"<@{fake.bot_user}> look"))
    assert mention is not None and mention.message.content == "@Scout look" and mention.triggered
    # The installation's name no longer wakes it.
    word = inbound.take(fake.message_event(SLACK_CHANNEL, "UANN0001", f"@{settings.assistant_name} look"))
    assert word is not None and not word.triggered


def test_bots_and_our_own_messages_are_never_taken_in(client: TestClient, fake: FakeSlack, db: Database) -> None:
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    docs = [
        fake.message_event(SLACK_CHANNEL, fake.bot_user, "@Robo our own reply"),  # our bot user
        fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo a bot's", bot_id="B0OTHER01"),  # any bot
        fake.message_event(SLACK_CHANNEL, None, "@Robo loop", subtype="bot_message", bot_id="B0000001"),
        fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo edited", subtype="message_changed"),
        fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo joined", subtype="channel_join"),
        fake.message_event(SLACK_CHANNEL, "not-a-user", "@Robo forged"),
        fake.message_event("#general", "UANN0001", "@Robo bad channel"),
        {**fake.message_event(SLACK_CHANNEL, "UANN0001", "x"), "event": {"type": "reaction_added", "user": "UANN0001"}},
    ]
    for doc in docs:
        assert _post(client, doc).status_code == 200
    assert get_messages_after(JID, 0, db=db) == [] and list_deliveries(db) == []


def test_a_sender_chooses_only_the_text(client: TestClient, fake: FakeSlack, db: Database) -> None:
    """Whatever else the event says (a type, a sender, metadata), the message is a person's."""
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    doc = fake.message_event(
        SLACK_CHANNEL,
        "UANN0001",
        "hello",
        message_type="system",
        sender="bot",
        is_from_me=True,
        metadata={"origin_channel": "web"},
        channel_type="im",
    )
    assert _post(client, doc).status_code == 200
    [stored] = get_messages_after(JID, 0, db=db)
    assert (stored.message_type, stored.sender, stored.is_from_me) == ("user", "slack:UANN0001", False)
    assert stored.metadata is not None and stored.metadata["origin_channel"] == "slack"


def test_retries_are_stored_once(client: TestClient, fake: FakeSlack, db: Database) -> None:
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    doc = fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo once")
    assert _post(client, doc).status_code == 200
    for n in (1, 2):
        assert (
            _post(client, doc, headers={RETRY_HEADER: str(n), "X-Slack-Retry-Reason": "http_timeout"}).status_code
            == 200
        )
    # The same message by another event (its app_mention twin) is the same message.
    twin = fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo once", ts=doc["event"]["ts"], event_type="app_mention")
    assert _post(client, twin).status_code == 200
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["@Robo once"]


@pytest.mark.parametrize("event_id", [["Ev1"], {"a": 1}, 7, None])
def test_a_signed_retry_with_a_strange_event_id_is_answered_not_a_500(
    client: TestClient, fake: FakeSlack, db: Database, event_id: object
) -> None:
    """The signed body says what it likes in ``event_id``: a list or an object there
    is an event never seen (not an unhashable key that answers 500)."""
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    doc = fake.message_event(SLACK_CHANNEL, "UANN0001", "@Robo odd")
    doc["event_id"] = event_id
    response = _post(client, doc, headers={RETRY_HEADER: "1", "X-Slack-Retry-Reason": "http_timeout"})
    assert response.status_code < 500, response.text


def test_an_unattached_channel_is_stored_but_never_wakes_the_agent(
    client: TestClient, fake: FakeSlack, db: Database
) -> None:
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    assert _post(client, fake.message_event("C0STRAY001", "UANN0001", "@Robo anyone?")).status_code == 200
    assert get_messages_after(JID, 0, db=db) == []
    [stray] = get_messages_after("slack:C0STRAY001", 0, db=db)
    assert stray.content == "@Robo anyone?" and list_deliveries(db) == []


def test_unattached_channels_past_the_cap_are_dropped_and_answered_200(
    sl: tuple[Database, Settings], fake: FakeSlack
) -> None:
    """Ingest's bounds on unregistered chats hold for Slack's: one unattached channel kept (its
    two newest messages), a second one's messages dropped yet answered 200 (Slack must not
    retry them), the attached group's taken."""
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    bounded = settings.replace(**{"unregistered_chats": 1, "unregistered_chat_messages": 2})
    with TestClient(create_app(Orchestrator(bounded))) as c:
        for n in range(3):
            assert _post(c, fake.message_event("C0STRAY001", "UANN0001", f"kept {n}")).status_code == 200
        dropped = fake.message_event("C0STRAY002", "UANN0001", "dropped")
        assert _post(c, dropped).json() == {"ok": True}
        assert _post(c, fake.message_event(SLACK_CHANNEL, "UANN0001", "the group's")).status_code == 200
    assert [m.content for m in get_messages_after("slack:C0STRAY001", 0, db=db)] == ["kept 1", "kept 2"]
    assert get_messages_after("slack:C0STRAY002", 0, db=db) == []
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["the group's"]
    inbound = SlackInbound(db, bounded)  # Socket Mode's way in: the same
    assert inbound.take(fake.message_event("C0STRAY003", "UANN0001", "dropped")) is None
    assert get_messages_after("slack:C0STRAY003", 0, db=db) == []


def test_a_body_that_is_no_event_is_a_400(client: TestClient) -> None:
    assert _post(client, [1, 2]).status_code == 400
    assert _post(client, {"type": "event_callback", "event": "nope"}).status_code == 400
    assert _post(client, {"type": "url_verification"}).status_code == 400
    assert _post(client, {"type": "app_rate_limited", "minute_rate_limited": 1518467820}).json() == {"ok": True}


def test_a_sender_over_the_rate_is_told_once_and_nothing_is_stored(
    sl: tuple[Database, Settings], fake: FakeSlack
) -> None:
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    inbound = SlackInbound(db, settings.replace(sender_messages_per_minute=2), web=SlackWeb(settings))
    results = [
        inbound.take(fake.message_event(SLACK_CHANNEL, "UANN0001", f"message {i}", thread_ts=THREAD_TS))
        for i in range(5)
    ]
    assert [r is not None and r.created for r in results] == [True, True, False, False, False]
    assert [m.content for m in get_messages_after(JID, 0, db=db)] == ["message 0", "message 1"]
    [told] = fake.calls("chat.postEphemeral")  # once per wait, not once per message
    assert (told.params["channel"], told.params["user"], told.params["thread_ts"]) == (
        SLACK_CHANNEL,
        "UANN0001",
        THREAD_TS,
    )
    assert told.params["text"].startswith("⏳ slow down: try again in ")
    # Someone else in the channel is not limited by Ann's rate.
    other = inbound.take(fake.message_event(SLACK_CHANNEL, "UBOB0002", "me too"))
    assert other is not None and other.created


def test_slack_markup_is_read_as_people_read_it(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    inbound = SlackInbound(db, settings, web=SlackWeb(settings))
    text = (
        f"<@{fake.bot_user}> ask <@UBOB0002> about <https://example.com/a?b=1&amp;c=2|the docs> "
        "and <https://example.com/x> in <#C0TEAM0001|team>, <!here>; 1 &lt; 2 &amp;&amp; <@UNOBODY1>"
    )
    result = inbound.take(fake.message_event(SLACK_CHANNEL, "UANN0001", text))
    assert result is not None and result.triggered
    assert result.message.content == (
        "@Robo ask @Bob about the docs (https://example.com/a?b=1&c=2) and "
        "https://example.com/x in #team, @here; 1 < 2 && @UNOBODY1"
    )
