"""Changes to what channels already show, on a real database against the fake Slack and
Telegram APIs and a webhook receiver on loopback: an edited message updated in place, a
superseded one retracted (Telegram past 48 hours: edited to a "retracted" line), a signed
``message.updated`` / ``message.retracted`` for webhooks, each exactly once; unsent
deliveries of superseded messages cancelled at once; a change that waits for its send."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from fakes.platforms import Platforms, fake_platforms, pointed_at
from fakes.slack_api import FakeSlack, Post
from fakes.telegram_api import FakeTelegramAPI
from fakes.webhook_receiver import WebhookReceiver
from orchestrator.channels.base import LogChannel
from orchestrator.channels.slack import SlackChannel
from orchestrator.channels.telegram import TelegramChannel
from orchestrator.channels.telegram_changes import RETRACTED
from orchestrator.channels.webhook import RETRACTED_EVENT, UPDATED_EVENT, WebhookChannel
from orchestrator.core.settings import Settings
from orchestrator.model.render import RenderedMessage
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.sweeper import sweep
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.deliveries import SUPERSEDED_UNSENT, claim, finish_claim, list_deliveries, utc_now
from orchestrator.store.delivery_changes import list_changes
from orchestrator.store.groups import add_group
from orchestrator.store.history import edit_message, regenerate, truncate_after
from orchestrator.store.hosts import database_now
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.tables import DeliveryChangeRow
from tests.conftest import wait_until

JID = "team@chat"
SLACK_CHANNEL = "C0TEAM0001"
TG_CHAT = -1001234567890
SECRET = "outbound-secret-for-changes"


@pytest.fixture
def fakes() -> Iterator[Platforms]:
    with fake_platforms() as both:
        yield both


@pytest.fixture
def team(db: Database, settings: Settings, fakes: Platforms) -> Settings:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    return pointed_at(settings, fakes, webhook_secret=SECRET, delivery_retry_base_s=0.01, delivery_retry_max_s=0.02)


@pytest.fixture
def registry(db: Database, team: Settings) -> Iterator[ChannelRegistry]:
    reg = ChannelRegistry([SlackChannel(team, db=db), TelegramChannel(team, db=db), WebhookChannel(team)])
    yield reg
    reg.close()


def _attach_both(db: Database) -> None:
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))


def _say(db: Database, settings: Settings, content: str, **kw: Any) -> tuple[int, str]:
    fields: dict[str, Any] = {"sender": "ann", "sender_name": "Ann", **kw}
    msg = ingest(
        db, settings, IncomingMessage(chat_jid=JID, content=content, **fields), signal=None, wake=False
    ).message
    return msg.seq, msg.id


def _reply(db: Database, settings: Settings, content: str) -> tuple[int, str]:
    return _say(db, settings, content, sender="bot", sender_name="Robo", is_from_me=True, message_type="assistant")


def _changes(db: Database) -> list[tuple[str, str, int, str]]:
    return [(c.channel, c.kind, c.message_seq, c.state) for c in list_changes(db, chat_jid=JID)]


def test_an_edit_updates_the_post_in_place_and_a_truncate_retracts_once(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    slack, telegram = fakes
    _attach_both(db)
    asked, asked_id = _say(db, team, "what is two and two")
    answered, _ = _reply(db, team, "four")
    deliverer = Deliverer(db, team, registry)
    assert deliverer.deliver_due().sent == 4
    question_post, answer_post = slack.live_posts(SLACK_CHANNEL)
    question_tg, answer_tg = telegram.live(TG_CHAT)

    edit_message(db, team, JID, asked_id, "what is two and three")
    assert _changes(db) == [("slack", "update", asked, "pending"), ("telegram", "update", asked, "pending")]
    report = deliverer.deliver_due()
    assert (report.changed, report.sent) == (2, 0)
    # In place: the same posts, now with the new words.
    assert [p.ts for p in slack.live_posts(SLACK_CHANNEL)] == [question_post.ts, answer_post.ts]
    assert question_post.text == "Ann: what is two and three" and question_post.updates == 1
    assert "what is two and three" in json.dumps(question_post.blocks)
    assert [(m.message_id, m.text, m.edits) for m in telegram.live(TG_CHAT)] == [
        (question_tg.message_id, "Ann: what is two and three", 1),
        (answer_tg.message_id, "Robo: four", 0),
    ]

    truncate_after(db, team, JID, asked_id)
    assert deliverer.deliver_due().changed == 2
    assert slack.live_posts(SLACK_CHANNEL) == [question_post] and answer_post.deleted
    assert [m.message_id for m in telegram.live(TG_CHAT)] == [question_tg.message_id]
    assert _changes(db)[2:] == [("slack", "retract", answered, "done"), ("telegram", "retract", answered, "done")]
    # Exactly once: later rounds call nothing more.
    for _ in range(3):
        assert deliverer.deliver_due().changed == 0
    assert [(c.params["ts"], c.error) for c in slack.calls("chat.update")] == [(question_post.ts, None)]
    assert [(c.params["ts"], c.error) for c in slack.calls("chat.delete")] == [(answer_post.ts, None)]
    assert [r.params["message_id"] for r in telegram.calls("editMessageText")] == [str(question_tg.message_id)]
    assert [r.params["message_id"] for r in telegram.calls("deleteMessage")] == [str(answer_tg.message_id)]


def test_telegram_past_48_hours_edits_the_post_to_a_retracted_line(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    _, telegram = fakes
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    _, asked_id = _say(db, team, "hello")
    answered, _ = _reply(db, team, "an old answer")
    deliverer = Deliverer(db, team, registry)
    deliverer.deliver_due()
    question, answer = telegram.live(TG_CHAT)
    telegram.age(TG_CHAT, answer.message_id, 49 * 3600)
    truncate_after(db, team, JID, asked_id)
    assert deliverer.deliver_due().changed == 1
    refused = telegram.calls("deleteMessage")
    assert [r.status for r in refused] == [400]  # "message can't be deleted for everyone"
    assert [(m.message_id, m.text) for m in telegram.live(TG_CHAT)] == [
        (question.message_id, "Ann: hello"),
        (answer.message_id, RETRACTED),
    ]
    assert _changes(db) == [("telegram", "retract", answered, "done")]


def test_an_edit_that_needs_more_parts_sends_them_and_one_that_needs_fewer_takes_them_back(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    _, telegram = fakes
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    seq, msg_id = _say(db, team, "short")
    deliverer = Deliverer(db, team, registry)
    deliverer.deliver_due()
    [first] = telegram.live(TG_CHAT)
    edit_message(db, team, JID, msg_id, "y" * 5000)
    deliverer.deliver_due()
    kept, added = telegram.live(TG_CHAT)
    assert kept.message_id == first.message_id and kept.text == "Ann: " + "y" * 4091
    assert added.text == "y" * 909
    [row] = list_deliveries(db, message_seq=seq)
    assert row.sent_ids == [str(first.message_id), str(added.message_id)]  # what the next change names
    edit_message(db, team, JID, msg_id, "short again")
    deliverer.deliver_due()
    assert [(m.message_id, m.text) for m in telegram.live(TG_CHAT)] == [(first.message_id, "Ann: short again")]
    [row] = list_deliveries(db, message_seq=seq)
    assert row.sent_ids == [str(first.message_id)]


def test_a_superseded_message_not_sent_yet_is_cancelled_at_once_and_never_retracted(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    slack, _ = fakes
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    _, asked_id = _say(db, team, "question")
    answered, _ = _reply(db, team, "answer")
    truncate_after(db, team, JID, asked_id)
    [row] = list_deliveries(db, message_seq=answered)
    assert (row.state, row.last_error) == ("cancelled", SUPERSEDED_UNSENT)  # before any deliverer looked
    Deliverer(db, team, registry).deliver_due()
    assert [p.text for p in slack.live_posts()] == ["Ann: question"] and not slack.calls("chat.delete")
    assert _changes(db) == []


def test_a_change_waits_for_its_send_and_is_dropped_if_the_send_never_went(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    """A send in flight when the history changed: the change waits until the send ends,
    then updates what it posted; a send that then fails for good leaves its change nothing
    to do."""
    slack, _ = fakes
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    seq, msg_id = _say(db, team, "draft")
    [row] = list_deliveries(db, message_seq=seq)
    assert claim(db, row.id, "someone-else", 60)  # another deliverer is sending it
    edit_message(db, team, JID, msg_id, "final")
    deliverer = Deliverer(db, team, registry)
    assert deliverer.deliver_due().changed == 0 and _changes(db) == [("slack", "update", seq, "pending")]
    # The other deliverer's send went out with the old words; it finishes.
    posted = slack.next_ts()
    slack.posts.append(Post(SLACK_CHANNEL, posted, "Ann: draft", [], None))
    finish_claim(db, row.id, "someone-else", state="sent", sent_at=utc_now(), sent_ids=[posted])
    assert deliverer.deliver_due().changed == 1
    assert [p.text for p in slack.live_posts()] == ["Ann: final"]

    seq2, msg2 = _say(db, team, "doomed")
    [row2] = list_deliveries(db, message_seq=seq2)
    assert claim(db, row2.id, "someone-else", 60)
    edit_message(db, team, JID, msg2, "doomed, edited")
    finish_claim(db, row2.id, "someone-else", state="failed", last_error="slack was down")
    report = deliverer.deliver_due()
    assert (report.changed, report.cancelled) == (0, 1)
    [change] = [c for c in list_changes(db, chat_jid=JID) if c.message_seq == seq2]
    assert change.state == "cancelled" and "its send ended failed" in (change.last_error or "")


def test_a_rate_limited_retraction_waits_and_uses_up_no_attempt(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    slack, _ = fakes
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    _, asked_id = _say(db, team, "question")
    _reply(db, team, "answer")
    deliverer = Deliverer(db, team, registry)
    deliverer.deliver_due()
    # Long enough that the change cannot fall due again within the same pass, however slow
    # a loaded machine makes it (a 1 s one did, and was sent in that pass).
    slack.fail("chat.delete", 429, retry_after=30)
    truncate_after(db, team, JID, asked_id)
    report = deliverer.deliver_due()
    assert report.failed_attempts == 1 and report.retry_in is not None and report.retry_in > 20
    [change] = list_changes(db, chat_jid=JID)
    assert (change.state, change.attempts) == ("pending", 0) and "rate limited" in (change.last_error or "")
    with db.write() as session:  # its Retry-After has passed
        session.execute(update(DeliveryChangeRow).values(next_attempt_at=utc_now()))
    assert deliverer.deliver_due().changed == 1
    assert [p.text for p in slack.live_posts()] == ["Ann: question"]


def test_webhooks_get_signed_updates_and_retractions_exactly_once(db: Database, team: Settings) -> None:
    """``message.updated`` and ``message.retracted``, signed, each with a delivery id of its
    own that is the same on every attempt (a failed one, and one cut short by a dead
    deliverer that the sweep makes again), naming the message by the id it was sent with."""

    class Dies(BaseException):
        """The deliverer's process ending right after the POST."""

    class DiesAfterPosting(WebhookChannel):
        def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None:
            super().retract(address, posted, rendered)
            raise Dies

    with WebhookReceiver(SECRET, fail=1) as receiver:
        attach_channel(db, JID, "webhook", address=receiver.url)
        asked, asked_id = _say(db, team, "question")
        answered, _ = _reply(db, team, "answer")
        live = WebhookChannel(team)
        registry = ChannelRegistry([live])
        deliverer = Deliverer(db, team, registry)
        wait_until(lambda: deliverer.deliver_due() and len(receiver.taken()) == 2, 10, "both sends, one retried")
        sent_as = {d.message_seq: d.sent_ids for d in list_deliveries(db, chat_jid=JID)}
        assert receiver.events() == ["message", "message"]

        edit_message(db, team, JID, asked_id, "question, edited")
        deliverer.deliver_due()  # the receiver's first 500 was a send's; this goes through
        [updated] = [p for p in receiver.taken() if p.doc["event"] == UPDATED_EVENT]
        assert updated.signed and updated.doc["message"]["text"] == "Ann: question, edited"
        assert [updated.doc["message"]["delivery_id"]] == sent_as[asked]
        assert updated.delivery_id == updated.doc["delivery_id"] != updated.doc["message"]["delivery_id"]

        truncate_after(db, team, JID, asked_id)
        dying = DiesAfterPosting(team)
        with pytest.raises(Dies):
            Deliverer(db, team, ChannelRegistry([dying])).deliver_due()
        dying.disconnect()
        with db.write() as session:  # its claim ran out (the database's clock)
            session.execute(update(DeliveryChangeRow).values(claimed_until=database_now(db) - timedelta(seconds=1)))
        assert sweep(db, signal=None, resend_channels=registry.resent_after_crash()).abandoned_deliveries == 1
        assert deliverer.deliver_due().changed == 1
        for _ in range(2):
            deliverer.deliver_due()
        retractions = [p for p in receiver.posts if p.body and json.loads(p.body)["event"] == RETRACTED_EVENT]
        assert len(retractions) == 2 and len({p.delivery_id for p in retractions}) == 1  # resent with its id
        [retracted] = [p for p in receiver.taken() if p.doc["event"] == RETRACTED_EVENT]
        assert retracted.signed and retracted.doc["message"] == {
            "delivery_id": sent_as[answered][0],  # type: ignore[index]
            "chat_jid": JID,
            "seq": answered,
            "id": retracted.doc["message"]["id"],
        }
        assert retracted.delivery_id is not None and retracted.delivery_id.startswith(f"{team.install_id}-")
        assert receiver.events() == ["message", "message", UPDATED_EVENT, RETRACTED_EVENT]
        assert all(p.signed for p in receiver.posts)
        live.disconnect()


def test_a_regenerated_reply_is_retracted_everywhere_when_nothing_waits_for_a_rerun(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    slack, telegram = fakes
    _attach_both(db)
    now = team.replace(rerun_replace_s=0)
    asked, _ = _say(db, now, "question")
    _, answer_id = _answer(db, now, "a first answer", asked)
    deliverer = Deliverer(db, now, registry)
    deliverer.deliver_due()
    regenerate(db, now, JID, answer_id)
    assert deliverer.deliver_due().changed == 2
    assert [p.text for p in slack.live_posts()] == ["Ann: question"]
    assert [m.text for m in telegram.live(TG_CHAT)] == ["Ann: question"]


def _answer(db: Database, settings: Settings, content: str, asked: int) -> tuple[int, str]:
    """The agent's reply to message ``asked`` (as a run stores it: naming what it answers)."""
    return _say(
        db,
        settings,
        content,
        sender="bot",
        sender_name="Robo",
        is_from_me=True,
        message_type="assistant",
        metadata={REPLY_TO_KEY: asked},
    )


def test_a_rerun_reply_takes_the_old_ones_posts_over_in_place(
    db: Database, team: Settings, registry: ChannelRegistry, fakes: tuple[FakeSlack, FakeTelegramAPI]
) -> None:
    """``orchestrator edit --rerun`` and regenerate: the agent's superseded reply stays on the
    channels until the rerun's reply comes, which is then shown in its place (the same Slack
    ts, the same Telegram message); a superseded reply no rerun replaces is retracted when its
    wait is over."""
    slack, telegram = fakes
    _attach_both(db)
    asked, asked_id = _say(db, team, "what is two and two")
    _, first_id = _answer(db, team, "five", asked)
    deliverer = Deliverer(db, team, registry)
    deliverer.deliver_due()
    question_post, answer_post = slack.live_posts(SLACK_CHANNEL)
    _, answer_tg = telegram.live(TG_CHAT)

    edit_message(db, team, JID, asked_id, "what is two and two, really", rerun=True)
    deliverer.deliver_due()
    assert answer_post.text == "five" and not answer_post.deleted  # held for the rerun's reply
    _answer(db, team, "four", asked)
    assert deliverer.deliver_due().sent == 2
    assert [(p.ts, p.text) for p in slack.live_posts(SLACK_CHANNEL)] == [
        (question_post.ts, "Ann: what is two and two, really"),
        (answer_post.ts, "four"),
    ]
    assert [(m.message_id, m.text) for m in telegram.live(TG_CHAT)][1] == (answer_tg.message_id, "Robo: four")
    retracts = [(c.channel, c.state, c.last_error) for c in list_changes(db, chat_jid=JID) if c.kind == "retract"]
    assert sorted(retracts) == [
        ("slack", "cancelled", f"replaced in place by #{asked + 2}"),
        ("telegram", "cancelled", f"replaced in place by #{asked + 2}"),
    ]
    assert not slack.calls("chat.postMessage")[2:] and not slack.calls("chat.delete")

    # A regenerate whose run brings no reply: the old replies (both) are retracted after the wait.
    second = _answer(db, team, "four, surely", asked)
    deliverer.deliver_due()
    [regenerated] = [m for m in get_messages_after(JID, 0, db=db) if m.content == "four"]
    regenerate(db, team, JID, regenerated.id)
    deliverer.deliver_due()
    assert len(slack.live_posts(SLACK_CHANNEL)) == 3  # nothing taken back yet
    with db.write() as session:  # the wait is over
        session.execute(update(DeliveryChangeRow).values(next_attempt_at=database_now(db) - timedelta(seconds=1)))
    deliverer.deliver_due()
    assert [p.text for p in slack.live_posts(SLACK_CHANNEL)] == ["Ann: what is two and two, really"]
    assert second[1] not in [m.id for m in get_messages_after(JID, 0, db=db)]


def test_the_log_channel_writes_a_line_for_each_change(
    db: Database, team: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    attach_channel(db, JID, "log")
    seq, msg_id = _say(db, team, "one\nline")
    deliverer = Deliverer(db, team, ChannelRegistry([LogChannel()]))
    deliverer.deliver_due()
    assert [d.sent_ids for d in list_deliveries(db, message_seq=seq)] == [[]]
    with caplog.at_level(logging.INFO, logger="orchestrator.channel.log"):
        edit_message(db, team, JID, msg_id, "two\x1b[2J")
        later, _ = _say(db, team, "later")
        deliverer.deliver_due()
        truncate_after(db, team, JID, msg_id)
        deliverer.deliver_due()
    lines = [r.getMessage() for r in caplog.records if r.name == "orchestrator.channel.log"]
    assert f"[{JID} #{seq} edited] Ann: two\\x1b[2J" in lines  # escaped as every log line is
    assert f"[{JID} #{later} retracted]" in lines
