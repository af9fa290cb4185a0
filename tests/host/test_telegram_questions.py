"""The agent's questions on Telegram, on a real database against the fake Bot API: a
question sent with an inline keyboard (a button per option, ``callback_data`` within 64
bytes), a press (a ``callback_query`` update, long-polled) answering it as the presser and
answered with ``answerCallbackQuery``, a non-approver's press and a second press refused
with an alert, and a forged press naming another group's question, or pressed in a chat
that is no group's, answering nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fakes.telegram_api import FakeTelegramAPI, SentMessage
from orchestrator.channels.telegram import TelegramChannel
from orchestrator.channels.telegram_poller import TelegramPoller
from orchestrator.core.settings import Settings
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.profile import change_profile
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.questions import read_question
from tests.host.asked import stored_question

JID, OTHER = "team@chat", "ops@chat"
TG_CHAT, OTHER_CHAT, STRANGERS = -1001234567890, -1009876543210, -1005555555555
ANN, BOB = 4242, 777


@pytest.fixture
def fake() -> Iterator[FakeTelegramAPI]:
    with FakeTelegramAPI() as api:
        yield api


@pytest.fixture
def tg(db: Database, settings: Settings, fake: FakeTelegramAPI) -> tuple[Database, Settings]:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    add_group(db, chat_jid=OTHER, name="Ops", folder="ops", requires_trigger=True, assistant_name="Robo")
    attach_channel(db, JID, "telegram", address=str(TG_CHAT))
    attach_channel(db, OTHER, "telegram", address=str(OTHER_CHAT))
    return db, settings.replace(telegram_bot_token=fake.token, telegram_api_base=fake.base)


@pytest.fixture
def poller(tg: tuple[Database, Settings]) -> Iterator[TelegramPoller]:
    signalled: list[str] = []
    p = TelegramPoller(tg[0], tg[1], signal=signalled.append)
    p.signalled = signalled  # type: ignore[attr-defined]
    yield p
    p.close()


def _sent_question(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, chat: str = JID, options: list[str] | None = None
) -> tuple[str, SentMessage]:
    """A question asked in ``chat`` and delivered to its Telegram chat: its id and the message."""
    db, settings = tg
    asked, _ = stored_question(db, chat, "Which colour?", options or ["red", "blue"])
    channel = TelegramChannel(settings, db=db)
    try:
        assert Deliverer(db, settings, ChannelRegistry([channel])).deliver_due().sent >= 1
    finally:
        channel.disconnect()
    [sent] = [m for m in fake.messages.values() if m.reply_markup and asked.id in str(m.reply_markup)]
    return asked.id, sent


def test_a_question_is_sent_with_an_inline_keyboard(tg: tuple[Database, Settings], fake: FakeTelegramAPI) -> None:
    long_option = "é" * 75  # 150 bytes of label: labels have no byte limit, callback_data does
    qid, sent = _sent_question(tg, fake, options=["red", long_option])
    assert sent.reply_markup == {
        "inline_keyboard": [
            [{"text": "red", "callback_data": f"q:{qid}:0"}],
            [{"text": long_option, "callback_data": f"q:{qid}:1"}],
        ]
    }
    assert sent.text is not None and "1. red" in sent.text  # the words: the numbered options


def test_a_press_answers_as_the_presser(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, poller: TelegramPoller
) -> None:
    db, _ = tg
    qid, sent = _sent_question(tg, fake)
    first = fake.press(TG_CHAT, sent.message_id, ANN, f"q:{qid}:1", first_name="Ann")
    poller.poll_once()
    answered = read_question(db, qid)
    assert answered is not None and answered.state == "answered"
    assert (answered.answer or {})["options"] == ["blue"]
    assert (answered.answered_by, answered.answered_by_name, answered.answered_via) == (f"tg:{ANN}", "Ann", "telegram")
    assert fake.callbacks[first] == {"text": "Your answer: blue", "show_alert": False}
    assert fake.messages[(str(TG_CHAT), sent.message_id)].reply_markup is None  # the keyboard is off
    group = get_group(db, JID)
    assert group is not None and group.pending_seq is not None
    assert poller.signalled == [JID]  # type: ignore[attr-defined]
    # Pressed again (by someone else): refused, with an alert only they see.
    again = fake.press(TG_CHAT, sent.message_id, BOB, f"q:{qid}:0", first_name="Bob")
    poller.poll_once()
    told = fake.callbacks[again]
    assert told is not None and told["show_alert"] and "answered already" in told["text"]
    still = read_question(db, qid)
    assert still is not None and still.answered_by == f"tg:{ANN}"


def test_a_non_approvers_press_is_refused(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, poller: TelegramPoller
) -> None:
    db, settings = tg
    change_profile(db, settings, JID, {"approvers": [f"tg:{ANN}"]})  # the sender id of her messages
    qid, sent = _sent_question(tg, fake)
    refused = fake.press(TG_CHAT, sent.message_id, BOB, f"q:{qid}:0", first_name="Bob")
    poller.poll_once()
    told = fake.callbacks[refused]
    assert told is not None and told["show_alert"] and "not among this group's approvers" in told["text"]
    assert len(told["text"]) <= 200
    still = read_question(db, qid)
    assert still is not None and still.state == "open"
    fake.press(TG_CHAT, sent.message_id, ANN, f"q:{qid}:0")
    poller.poll_once()
    done = read_question(db, qid)
    assert done is not None and done.answered_by == f"tg:{ANN}"


def test_a_forged_press_answers_nothing(
    tg: tuple[Database, Settings], fake: FakeTelegramAPI, poller: TelegramPoller
) -> None:
    db, _ = tg
    other_qid, _ = _sent_question(tg, fake, chat=OTHER)
    qid, sent = _sent_question(tg, fake)
    forged = [
        fake.press(TG_CHAT, sent.message_id, ANN, f"q:{other_qid}:0"),  # the team's chat, the ops question
        fake.press(TG_CHAT, sent.message_id, ANN, f"q:{qid}:9"),  # no such option
        fake.press(TG_CHAT, sent.message_id, ANN, f"q:{qid}:0;DROP"),  # not a button's shape
    ]
    fake.messages[(str(STRANGERS), sent.message_id)] = fake.messages[(str(TG_CHAT), sent.message_id)]
    forged.append(fake.press(STRANGERS, sent.message_id, ANN, f"q:{qid}:0"))  # a chat that is no group's
    poller.poll_once()
    for asked in (other_qid, qid):
        still = read_question(db, asked)
        assert still is not None and still.state == "open"
    for query in forged:
        told = fake.callbacks[query]
        assert told is not None and told["show_alert"]  # every press is answered: no spinner left
