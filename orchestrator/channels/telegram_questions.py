"""The agent's questions on Telegram: an inline keyboard out, its ``callback_query`` in.

* **Out**: a message with an APPROVAL envelope (``run/questions.py``) is sent with an
  inline keyboard under its last part: one button per option, a row each, its
  ``callback_data`` ``q:<question id>:<index>`` (``channels/question_buttons.py``: at most
  22 bytes, within Telegram's 64).  The words are the question with its numbered options,
  so a reply naming one answers too.  A multiple choice's button picks one option.
* **In**: the poller asks ``getUpdates`` for ``callback_query`` updates too;
  :func:`take_callback` answers the question a button names in the group attached to the
  chat the button's message is in, as the person who pressed it (``tg:<user id>``, the
  sender id of their messages: what a group's approvers name), then calls
  ``answerCallbackQuery`` (Telegram shows a spinner on the button until it is answered):
  the answer taken as a toast, a refusal (not an approver, answered already, no such
  question here) as an alert only the presser sees.  An answer taken takes the keyboard
  off the message (``editMessageReplyMarkup``), so nobody presses a closed question's
  buttons.  What a callback brings is hostile:
  its data is read only in that shape, and the chat decides the group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orchestrator.channels.question_buttons import approval_of, button_id, parse_button, take_click
from orchestrator.core.jsontypes import JsonObject
from orchestrator.store.db import Database

log = logging.getLogger(__name__)

CHANNEL = "telegram"
SENDER_PREFIX = "tg:"  # as the poller names a person's messages
ALERT_LIMIT = 200  # Telegram's limit on answerCallbackQuery's text
_NAME_LIMIT = 200


def question_keyboard(metadata: JsonObject | None) -> Any:
    """The inline keyboard of a message that carries a question (None: it carries none)."""
    asked = approval_of(metadata)
    if asked is None:
        return None
    from telegram import InlineKeyboardButton, InlineKeyboardMarkup

    return InlineKeyboardMarkup(
        [
            [InlineKeyboardButton(text=option, callback_data=button_id(asked.question_id, i))]
            for i, option in enumerate(asked.options)
        ]
    )


def take_callback(
    db: Database,
    client: Any,
    query: Any,
    groups: dict[str, str],
    *,
    signal: Callable[[str], object] | None,
    signal_delivery: Callable[[str], object] | None,
) -> bool:
    """Take one ``callback_query`` (python-telegram-bot's ``CallbackQuery``) with ``client``
    (a ``TelegramClient``), the poller's ``groups`` (Telegram chat id -> group): whether it
    answered a question.  A press on a button that is no question's is answered and left."""
    button = parse_button(query.data)
    chat = getattr(getattr(query.message, "chat", None), "id", None)
    group = groups.get(str(chat)) if chat is not None else None
    ok, words = False, ""
    if button is None:
        words = "this button answers nothing"
    elif group is None:
        words = "this Telegram chat is no group's: the question is not here"
    else:
        user = query.from_user
        name = (user.full_name or user.username or str(user.id)).replace("\x00", "")[:_NAME_LIMIT]
        ok, words = take_click(
            db,
            group,
            button,
            by=f"{SENDER_PREFIX}{user.id}",
            by_name=name,
            via=CHANNEL,
            signal=signal,
            signal_delivery=signal_delivery,
        )
    text = (words if ok else f"⚠️ {words}")[:ALERT_LIMIT]
    _courtesy(
        client,
        lambda bot: bot.answer_callback_query(callback_query_id=query.id, text=text, show_alert=not ok),
        f"answer the callback query {query.id}",
    )
    if ok and query.message is not None:
        mid = query.message.message_id
        _courtesy(
            client,
            lambda bot: bot.edit_message_reply_markup(chat_id=chat, message_id=mid, reply_markup=None),
            f"take the keyboard off message {mid}",
        )
    return ok


def _courtesy(client: Any, make: Callable[[Any], Any], what: str) -> None:
    """One call whose failure is logged, not raised: the answer (or its refusal) stands."""
    try:
        client.call(make)
    except Exception as exc:  # noqa: BLE001 - see above
        log.warning("telegram: could not %s: %s", what, exc)
