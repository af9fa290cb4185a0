"""The agent's questions on Slack, in: the clicks on a question's buttons.

Slack's interactivity payloads: a ``block_actions`` document, POSTed to
``POST /slack/interactions`` as a form (``payload=<JSON>``, signed as events are:
``orchestrator/http/routes/slack.py``) or carried by Socket Mode's
``interactive`` envelope (``channels/slack_socket.py``).  :func:`take_interaction`
answers the question a button names (``channels/slack_blocks.py`` drew it) in the group
attached to the conversation clicked in, as the clicker (``slack:<user id>``, the sender
id of their messages: what a group's approvers name).  A click taken replaces the buttons
of the message clicked with who answered what (``chat.update``); a refusal (not an
approver, answered already, no such question here) is told to the clicker alone
(``chat.postEphemeral``) and never fails the request: Slack shows an error for anything
but a 200.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.channels.question_buttons import parse_button, take_click
from orchestrator.channels.slack import ADDRESS, CHANNEL, SlackWeb, attached_groups
from orchestrator.channels.slack_blocks import QUESTION_BLOCK, escape
from orchestrator.channels.slack_inbound import SENDER_PREFIX, SlackInbound
from orchestrator.core.errors import ChannelError
from orchestrator.core.jsontypes import JsonObject

log = logging.getLogger(__name__)

INTERACTIONS_PATH = "/slack/interactions"
_NAME_LIMIT = 200


class _Loose(BaseModel):
    # Strict: a string must be one (lax mode would take 5 for "5"); unknown keys ignored.
    model_config = ConfigDict(extra="ignore", strict=True)


class _User(_Loose):
    id: str
    username: str | None = None
    name: str | None = None


class _Channel(_Loose):
    id: str


class _Action(_Loose):
    action_id: str
    type: str | None = None


class _Container(_Loose):
    message_ts: str | None = None


class BlockActions(_Loose):
    """Slack's ``block_actions`` payload, the parts read (the rest ignored)."""

    type: Literal["block_actions"]
    user: _User
    channel: _Channel | None = None
    container: _Container | None = None
    actions: list[_Action]


def take_interaction(clicks: SlackInbound, payload: Any) -> int:
    """Take a verified interactivity ``payload`` with ``clicks`` (the transport's inbound side:
    its store, its Web API, None without a bot token, and its signals): each of its clicks
    on a question's button answered (see the module's doc).  Anything else Slack sends there (a shortcut, a
    modal, a button of no question) is left alone.  How many answers were taken."""
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return 0
    try:
        doc = BlockActions.model_validate(payload)
    except ValidationError as exc:
        log.warning("slack: a block_actions payload not understood (%s); ignored", exc.errors()[0]["msg"])
        return 0
    channel = doc.channel.id if doc.channel is not None else ""
    if not ADDRESS.match(channel) or not doc.user.id.isalnum():
        return 0
    chat = attached_groups(clicks.db).get(channel)
    taken = 0
    for action in doc.actions:
        button = parse_button(action.action_id)
        if button is None:
            continue
        if chat is None:
            _tell(clicks.web, channel, doc.user.id, "this Slack channel is no group's: the question is not here")
            continue
        # The name their messages carry (users.info); without the Web API, the handle Slack sent.
        said = doc.user.name or doc.user.username or doc.user.id
        name = clicks.sender_name(doc.user.id) if clicks.web is not None else said.replace("\x00", "")[:_NAME_LIMIT]
        ok, words = take_click(
            clicks.db,
            chat[0],
            button,
            by=SENDER_PREFIX + doc.user.id,
            by_name=name,
            via=CHANNEL,
            signal=clicks.signal,
            signal_delivery=clicks.signal_delivery,
        )
        if not ok:
            _tell(clicks.web, channel, doc.user.id, words)
            continue
        taken += 1
        ts = doc.container.message_ts if doc.container is not None else None
        _answered(clicks.web, channel, ts, payload, f"✅ {name}: {words.removeprefix('Your answer: ')}")
    return taken


def _tell(web: SlackWeb | None, channel: str, user: str, words: str) -> None:
    """``words`` to ``user`` alone, in ``channel`` (a courtesy: a failure is logged)."""
    if web is None:
        return
    try:
        web.call("chat.postEphemeral", channel=channel, user=user, text=escape(f"⚠️ {words}"))
    except ChannelError as exc:
        log.warning("slack: could not tell %s why their click was refused: %s", user, exc)


def _answered(web: SlackWeb | None, channel: str, ts: str | None, payload: JsonObject, said: str) -> None:
    """The clicked message without its buttons, and who answered what (a courtesy, as above)."""
    message = payload.get("message")
    blocks = message.get("blocks") if isinstance(message, dict) else None
    if web is None or ts is None or not isinstance(blocks, list):
        return
    kept = [b for b in blocks if not (isinstance(b, dict) and str(b.get("block_id", "")).startswith(QUESTION_BLOCK))]
    kept.append({"type": "context", "elements": [{"type": "mrkdwn", "text": escape(said)}]})
    text = message.get("text") if isinstance(message, dict) else None
    try:
        web.call("chat.update", channel=channel, ts=ts, text=text if isinstance(text, str) else said, blocks=kept)
    except ChannelError as exc:
        log.warning("slack: could not take the buttons off the question at %s: %s", ts, exc)
