"""A history change reaches what channels already show, through the real stack: a worker
process (the agent's run in Docker, the ``deliver`` task with the Slack and Telegram
plugins) against the fake Slack and Telegram APIs and a webhook receiver on loopback, and
``orchestrator edit --rerun`` and ``truncate`` from the command line.  The edited question
is updated in place on Slack and Telegram and the rerun's answer is shown in place of the
earlier one; the agent's ``/react 👍`` reaches the fakes and the webhook; a truncate
retracts; the webhook gets each signed ``message.updated``, ``message.reaction`` and
``message.retracted`` exactly once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.slack_api import FakeSlack
from fakes.telegram_api import FakeTelegramAPI
from fakes.webhook_receiver import WebhookReceiver
from orchestrator.channels.webhook import REACTION_EVENT, RETRACTED_EVENT, UPDATED_EVENT
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.attachments import attach_channel
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.delivery_changes import list_changes
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import wait_until

from .conftest import Stack

JID = "main@local"
SLACK_CHANNEL = "C0MAIN0001"
TG_CHAT = -1009876543210
SECRET = "integration-webhook-secret"


@pytest.fixture
def channels(stack: Stack) -> Iterator[tuple[FakeSlack, FakeTelegramAPI, WebhookReceiver]]:
    with FakeSlack() as slack, FakeTelegramAPI() as telegram, WebhookReceiver(SECRET) as hook:
        stack.env.update(
            {
                "ORCHESTRATOR_CHANNEL_PLUGINS": "orchestrator.channels.slack:channel,orchestrator.channels.telegram:channel",
                "ORCHESTRATOR_SLACK_BOT_TOKEN": slack.bot_token,
                "ORCHESTRATOR_SLACK_API_BASE": slack.base,
                "ORCHESTRATOR_TELEGRAM_BOT_TOKEN": telegram.token,
                "ORCHESTRATOR_TELEGRAM_API_BASE": telegram.base,
                "ORCHESTRATOR_WEBHOOK_SECRET": SECRET,
                "ORCHESTRATOR_DELIVERY_RETRY_BASE_S": "0.3",
            }
        )
        yield slack, telegram, hook


def test_an_edit_with_rerun_updates_and_retracts_what_channels_show(
    stack: Stack, channels: tuple[FakeSlack, FakeTelegramAPI, WebhookReceiver]
) -> None:
    slack, telegram, hook = channels
    ensure_main_group(stack.db)
    attach_channel(stack.db, JID, "slack", address=SLACK_CHANNEL)
    attach_channel(stack.db, JID, "telegram", address=str(TG_CHAT))
    attach_channel(stack.db, JID, "webhook", address=hook.url)
    stack.start_worker(concurrency=2)
    asked = ingest(
        stack.db,
        stack.settings,
        IncomingMessage(chat_jid=JID, sender="tess", sender_name="Tess", content="what is the plan"),
        signal=stack.signals.group,
        signal_delivery=stack.signals.delivery,
    ).message

    def answered_everywhere(words: str) -> bool:
        return (
            any(words in p.text and p.text.startswith("Andy") for p in slack.live_posts(SLACK_CHANNEL))
            and any(words in (m.text or "") and (m.text or "").startswith("Andy") for m in telegram.live(TG_CHAT))
            and all(d.state == "sent" for d in list_deliveries(stack.db, chat_jid=JID))
        )

    wait_until(
        lambda: answered_everywhere("what is the plan"), 120, "the first answer on every channel", stack.worker_logs
    )
    question_post, first_answer = slack.live_posts(SLACK_CHANNEL)
    question_tg, first_answer_tg = telegram.live(TG_CHAT)
    assert question_post.text == "Tess: what is the plan" and question_tg.text == "Tess: what is the plan"
    answer_seq = next(m.seq for m in get_messages_after(JID, asked.seq, db=stack.db) if m.sender == "bot")

    done = stack.cli("edit", JID, f"#{asked.seq}", "what is the plan now", "--rerun")
    assert done.returncode == 0, done.stderr

    wait_until(
        lambda: answered_everywhere("what is the plan now") and "what is the plan now" in first_answer.text,
        120,
        "the question updated and the new answer shown in place of the old",
        lambda: f"{list_changes(stack.db, chat_jid=JID)}\n{stack.worker_logs()}",
    )
    # Slack: the question and the answer in place (the same ts each), nothing deleted or posted anew.
    posts = slack.live_posts(SLACK_CHANNEL)
    assert [p.ts for p in posts] == [question_post.ts, first_answer.ts]
    assert posts[0].text == "Tess: what is the plan now" and question_post.updates == 1
    assert first_answer.updates == 1 and not slack.calls("chat.delete")
    # Telegram: the same, by message id.
    live = telegram.live(TG_CHAT)
    assert [m.message_id for m in live] == [question_tg.message_id, first_answer_tg.message_id]
    assert live[0].text == "Tess: what is the plan now" and "what is the plan now" in (live[1].text or "")
    assert not telegram.calls("deleteMessage")

    # The agent reacts (the offline model's /react): on the fakes, and a signed webhook event.
    ingest(
        stack.db,
        stack.settings,
        IncomingMessage(chat_jid=JID, sender="tess", sender_name="Tess", content="/react 👍"),
        signal=stack.signals.group,
        signal_delivery=stack.signals.delivery,
    )
    wait_until(
        lambda: REACTION_EVENT in hook.events() and bool(slack.reactions) and bool(telegram.reactions),
        120,
        "the reaction on every channel",
        lambda: f"{list_changes(stack.db, chat_jid=JID)}\n{stack.worker_logs()}",
    )
    react_post = slack.live_posts(SLACK_CHANNEL)[2]
    assert react_post.text == "Tess: /react 👍" and slack.reactions == {(SLACK_CHANNEL, react_post.ts): ["+1"]}
    assert list(telegram.reactions.values()) == [["👍"]]

    # A truncate retracts what follows the question everywhere.
    done = stack.cli("truncate", JID, f"#{asked.seq}")
    assert done.returncode == 0, done.stderr
    wait_until(
        lambda: RETRACTED_EVENT in hook.events() and first_answer.deleted,
        60,
        "the retractions",
        lambda: f"{list_changes(stack.db, chat_jid=JID)}\n{stack.worker_logs()}",
    )
    wait_until(lambda: len(slack.live_posts(SLACK_CHANNEL)) == 1, 30, "only the question left on Slack")
    # Each channel's retractions are worked on their own: Telegram's may still be on their way.
    wait_until(
        lambda: [m.message_id for m in telegram.live(TG_CHAT)] == [question_tg.message_id],
        30,
        "only the question left on Telegram",
        lambda: f"{[(m.message_id, m.text) for m in telegram.live(TG_CHAT)]}\n{list_changes(stack.db, chat_jid=JID)}",
    )
    # The webhook: signed events, each once, naming the messages by the ids they were sent with.
    updated = [p for p in hook.taken() if p.doc["event"] == UPDATED_EVENT]
    retracted = [p for p in hook.taken() if p.doc["event"] == RETRACTED_EVENT]
    assert all(p.signed for p in hook.posts) and all(p.status == 200 for p in hook.posts)
    assert len(hook.taken()) == len(hook.posts)  # nothing came twice
    assert [p.doc["message"]["seq"] for p in updated][0] == asked.seq
    assert updated[0].doc["message"]["text"] == "Tess: what is the plan now"
    sent_as = {d.message_seq: d.sent_ids for d in list_deliveries(stack.db, chat_jid=JID, channel="webhook")}
    # The rerun's answer was sent as the old one's update: the receiver knows it by the old id.
    assert [p.doc["message"]["delivery_id"] for p in updated[1:]] == [sent_as[answer_seq][0]]  # type: ignore[index]
    assert all([p.doc["message"]["delivery_id"]] == sent_as[p.doc["message"]["seq"]] for p in retracted)
    wait_until(
        lambda: all(c.state in ("done", "cancelled") for c in list_changes(stack.db, chat_jid=JID)),
        30,
        "every change made",
        lambda: f"{list_changes(stack.db, chat_jid=JID)}",
    )
    assert list_changes(stack.db, chat_jid=JID)
