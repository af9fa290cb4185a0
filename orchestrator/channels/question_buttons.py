"""Buttons that answer the agent's questions on a chat platform: what a button names, and a click taken.

A channel draws a message with an APPROVAL envelope (a question: ``run/questions.py``)
with one button per option; each button names the question and the option's place,
``q:<question id>:<index>`` (Slack's ``action_id``, Telegram's ``callback_data``: at most
22 bytes, within Telegram's 64).  What a click brings back is hostile (anyone in the
conversation can click, and a forged click can name anything): :func:`parse_button` reads
only that shape, the conversation decides the chat (a click names a question of that chat
only), and :func:`take_click` answers through ``answer_question``, which checks who may
answer (the group's approvers: the same sender ids the channel gives the person's
messages), the option's place and that the question is still open.  A refusal is words
for the clicker, never an exception: a click on a stale button is an everyday thing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from agent_runner.protocol import MAX_OPTIONS, ApprovalPayload
from orchestrator.core.errors import BadInput, Conflict, InvalidMessageMetadata, NotAllowed, NotFound
from orchestrator.model.envelopes import APPROVAL, parse_message_metadata
from orchestrator.run.questions import Choice, announce, answer_question
from orchestrator.store.db import Database

log = logging.getLogger(__name__)

PREFIX = "q"
# A question's id (the host's: 12 hex digits; the envelope allows 16) and an option's place.
_BUTTON = re.compile(r"^q:([A-Za-z0-9_-]{1,16}):([0-9])$")
assert MAX_OPTIONS <= 10  # one digit names an option's place


def approval_of(metadata: Any) -> ApprovalPayload | None:
    """The question a message's metadata carries (its APPROVAL envelope), or None."""
    if not isinstance(metadata, dict) or metadata.get("message_type") != APPROVAL:
        return None
    try:
        payload = parse_message_metadata(metadata).payload
    except InvalidMessageMetadata:
        return None  # a row that no longer validates: its text (the numbered options) is shown
    return payload if isinstance(payload, ApprovalPayload) else None


def button_id(question_id: str, index: int) -> str:
    """What the button of option ``index`` (0-based) of question ``question_id`` names."""
    return f"{PREFIX}:{question_id}:{index}"


def parse_button(said: object) -> tuple[str, int] | None:
    """The (question id, option index) a clicked button names; None for anything else."""
    if not isinstance(said, str):
        return None
    found = _BUTTON.match(said)
    return (found[1], int(found[2])) if found else None


def take_click(
    db: Database,
    chat_jid: str,
    button: tuple[str, int],
    *,
    by: str,
    by_name: str,
    via: str,
    signal: Callable[[str], object] | None,
    signal_delivery: Callable[[str], object] | None,
) -> tuple[bool, str]:
    """Answer the question ``button`` names in ``chat_jid`` with its option, as ``by``: whether
    it was taken, and what the clicker is told (the refusal's words when it was not)."""
    question_id, index = button
    try:
        answered = answer_question(
            db, chat_jid, Choice((index,)), by=by, by_name=by_name, via=via, question_id=question_id
        )
    except (NotFound, BadInput, Conflict, NotAllowed) as exc:
        log.info("%s: %s's click on question %s in %s refused: %s", via, by, question_id, chat_jid, exc)
        return False, str(exc)
    announce(answered, signal=signal, signal_delivery=signal_delivery)
    return True, f"Your answer: {answered.answer}"
