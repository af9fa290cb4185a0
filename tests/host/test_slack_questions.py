"""The agent's questions on Slack, on a real database against the fake Slack: a question
posted with a button per option (Block Kit Slack takes), a signed ``block_actions`` click
answering it as the clicker (the group wakes, the buttons come off), an unsigned or badly
signed one refused (401), a non-approver's click and a second click told to the clicker
alone, a forged click naming another group's question refused, and Socket Mode's
``interactive`` envelope taken the same way."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from fastapi.testclient import TestClient

from fakes.slack_api import FakeSlack, Post, fake_slack  # noqa: F401 - the fixture "fake"
from orchestrator.channels.slack import SlackChannel
from orchestrator.channels.slack_clicks import INTERACTIONS_PATH
from orchestrator.channels.slack_inbound import SIGNATURE_HEADER, signed_headers
from orchestrator.channels.slack_socket import SlackSocket
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.root import Orchestrator
from orchestrator.run.outbound import ChannelRegistry, Deliverer
from orchestrator.run.profile import change_profile
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.questions import read_question
from tests.conftest import wait_until
from tests.host.asked import stored_question

JID, OTHER = "team@chat", "ops@chat"
SLACK_CHANNEL, OTHER_CHANNEL = "C0TEAM0001", "C0OPS00001"
SIGNING = "slack-signing-secret-5e1d"
ANN, BOB = "UANN0001", "UBOB0002"


@pytest.fixture
def sl(db: Database, settings: Settings, fake: FakeSlack) -> tuple[Database, Settings]:
    add_group(db, chat_jid=JID, name="Team", folder="team", requires_trigger=True, assistant_name="Robo")
    add_group(db, chat_jid=OTHER, name="Ops", folder="ops", requires_trigger=True, assistant_name="Robo")
    attach_channel(db, JID, "slack", address=SLACK_CHANNEL)
    attach_channel(db, OTHER, "slack", address=OTHER_CHANNEL)
    return db, settings.replace(
        slack_bot_token=fake.bot_token,
        slack_app_token=fake.app_token,
        slack_api_base=fake.base,
        slack_signing_secret=SIGNING,
    )


@pytest.fixture
def client(sl: tuple[Database, Settings]) -> Iterator[TestClient]:
    with TestClient(create_app(Orchestrator(sl[1]))) as c:
        yield c


def _posted_question(sl: tuple[Database, Settings], fake: FakeSlack, chat: str = JID, **kw: Any) -> tuple[str, Post]:
    """A question asked in ``chat`` and delivered to its Slack channel: its id and its post."""
    db, settings = sl
    asked, _ = stored_question(db, chat, "Which colour <b>?", ["red", "blue & green", "x" * 75], **kw)
    channel = SlackChannel(settings, db=db)
    try:
        Deliverer(db, settings, ChannelRegistry([channel])).deliver_due()
    finally:
        channel.disconnect()
    [post] = [p for p in fake.live_posts() if asked.id in json.dumps(p.blocks)]
    return asked.id, post


def _click(client: TestClient, payload: dict[str, Any], *, secret: str = SIGNING) -> Any:
    body = urlencode({"payload": json.dumps(payload)}).encode()
    headers = {**signed_headers(secret, body), "content-type": "application/x-www-form-urlencoded"}
    return client.post(INTERACTIONS_PATH, content=body, headers=headers)


def test_a_question_is_posted_with_a_button_per_option(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    qid, post = _posted_question(sl, fake, multiple=True)
    section, actions, hint = post.blocks
    assert section == {
        "type": "section",
        "text": {"type": "mrkdwn", "text": "Which colour &lt;b&gt;?", "verbatim": True},
    }
    assert [(e["action_id"], e["text"]["text"]) for e in actions["elements"]] == [
        (f"q:{qid}:0", "red"),
        (f"q:{qid}:1", "blue & green"),  # plain_text: shown as it is, no markup to escape
        (f"q:{qid}:2", "x" * 75),
    ]
    assert hint["type"] == "context" and "numbers" in hint["elements"][0]["text"]
    assert "1. red" in post.text  # the notification: the question with its numbered options


def test_a_signed_click_answers_as_the_clicker_and_takes_the_buttons_off(
    sl: tuple[Database, Settings], fake: FakeSlack, client: TestClient
) -> None:
    db, _ = sl
    qid, post = _posted_question(sl, fake)
    stale = fake.click(post, BOB, f"q:{qid}:0")  # clicked on a screen not refreshed yet
    assert _click(client, fake.click(post, ANN, f"q:{qid}:1")).status_code == 200
    answered = read_question(db, qid)
    assert answered is not None and answered.state == "answered"
    assert (answered.answer or {})["options"] == ["blue & green"]
    assert (answered.answered_by, answered.answered_by_name, answered.answered_via) == (
        f"slack:{ANN}",
        "Ann Lee",
        "slack",
    )
    group = get_group(db, JID)
    assert group is not None and group.pending_seq is not None  # the answer wakes the group
    [update] = fake.calls("chat.update", ok_only=True)
    assert update.params["ts"] == post.ts and "actions" not in json.dumps(update.params["blocks"])
    assert "Ann Lee: blue &amp; green" in json.dumps(update.params["blocks"])
    # A second click, on the same stale button: told to the clicker alone, nothing changes.
    assert _click(client, stale).status_code == 200
    [told] = fake.ephemerals(BOB)
    assert "answered already" in told
    again = read_question(db, qid)
    assert again is not None and again.answered_by == f"slack:{ANN}"


def test_an_unsigned_or_badly_signed_click_is_refused(
    sl: tuple[Database, Settings], fake: FakeSlack, client: TestClient
) -> None:
    db, _ = sl
    qid, post = _posted_question(sl, fake)
    payload = fake.click(post, ANN, f"q:{qid}:0")
    assert _click(client, payload, secret="another-secret").status_code == 401
    body = urlencode({"payload": json.dumps(payload)}).encode()
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert client.post(INTERACTIONS_PATH, content=body, headers=form).status_code == 401
    good = signed_headers(SIGNING, body)
    tampered = urlencode({"payload": json.dumps({**payload, "user": {"id": BOB}})}).encode()
    assert client.post(INTERACTIONS_PATH, content=tampered, headers={**good, **form}).status_code == 401
    stale = signed_headers(SIGNING, body, timestamp=time.time() - 301)
    assert client.post(INTERACTIONS_PATH, content=body, headers={**stale, **form}).status_code == 401
    assert (
        client.post(INTERACTIONS_PATH, content=body, headers={**good, **form, SIGNATURE_HEADER: ""}).status_code == 401
    )
    still = read_question(db, qid)
    assert still is not None and still.state == "open"
    # Signed, but no form with a payload: a 400.
    junk = b"payload=not-json"
    assert (
        client.post(INTERACTIONS_PATH, content=junk, headers={**signed_headers(SIGNING, junk), **form}).status_code
        == 400
    )


def test_a_non_approvers_click_is_refused_and_told(
    sl: tuple[Database, Settings], fake: FakeSlack, client: TestClient
) -> None:
    db, settings = sl
    change_profile(db, settings, JID, {"approvers": [f"slack:{ANN}"]})  # the sender id of her messages
    qid, post = _posted_question(sl, fake)
    assert _click(client, fake.click(post, BOB, f"q:{qid}:0")).status_code == 200
    [told] = fake.ephemerals(BOB)
    assert "not among this group's approvers" in told
    still = read_question(db, qid)
    assert still is not None and still.state == "open"
    assert _click(client, fake.click(post, ANN, f"q:{qid}:0")).status_code == 200
    done = read_question(db, qid)
    assert done is not None and done.state == "answered" and done.answered_by == f"slack:{ANN}"


def test_a_click_in_one_channel_cannot_answer_another_groups_question(
    sl: tuple[Database, Settings], fake: FakeSlack, client: TestClient
) -> None:
    db, _ = sl
    other_qid, _ = _posted_question(sl, fake, chat=OTHER)
    qid, post = _posted_question(sl, fake)
    forged = fake.click(post, ANN, f"q:{qid}:0")
    forged["actions"][0]["action_id"] = f"q:{other_qid}:0"  # the team's channel, the ops question
    assert _click(client, forged).status_code == 200
    forged["actions"][0]["action_id"] = f"q:{qid}:7"  # an option the question does not have
    assert _click(client, forged).status_code == 200
    for asked in (other_qid, qid):
        still = read_question(db, asked)
        assert still is not None and still.state == "open"
    assert len(fake.ephemerals(ANN)) == 2


def test_socket_modes_interactive_envelope_answers(sl: tuple[Database, Settings], fake: FakeSlack) -> None:
    db, settings = sl
    qid, post = _posted_question(sl, fake)
    signalled: list[str] = []
    listener = SlackSocket(db, settings, signal=signalled.append)
    try:
        listener.connect()
        envelope = fake.push_interactive(fake.click(post, ANN, f"q:{qid}:0"))
        assert fake.wait_acks(1) == [envelope]
    finally:
        listener.close()
    answered = read_question(db, qid)
    assert answered is not None and answered.state == "answered" and answered.answered_by == f"slack:{ANN}"
    wait_until(lambda: signalled == [JID], 5, "the group's signal")


def test_the_signature_stands_in_for_the_client_header(
    sl: tuple[Database, Settings], fake: FakeSlack, client: TestClient
) -> None:
    """Slack's servers send no X-Orchestrator-Client header: the request guard leaves its
    cross-site check to the signature on this path, as on /slack/events."""
    db, _ = sl
    qid, post = _posted_question(sl, fake)
    body = urlencode({"payload": json.dumps(fake.click(post, ANN, f"q:{qid}:0"))}).encode()
    form = {"content-type": "application/x-www-form-urlencoded", "origin": "https://evil.example"}
    assert client.post("/api/messages", content=b"{}", headers=form).status_code == 403  # the guard is on
    assert client.post(INTERACTIONS_PATH, content=body, headers=form).status_code == 401  # the route's own refusal
    signed = {**signed_headers(SIGNING, body), **form}
    assert client.post(INTERACTIONS_PATH, content=body, headers=signed).status_code == 200
    answered = read_question(db, qid)
    assert answered is not None and answered.state == "answered"
