"""A person's edit of their own message on Telegram becomes an edit in the history.

Telegram sends an edit as an ``edited_message`` update (the poller asks for them:
``orchestrator/channels/telegram.py``): the message as it is now, with its chat, its id and
who sent it.  It names the stored message ``tg-<chat id>-<message id>`` and is taken by
``orchestrator/run/channel_edits.py`` only when its sender is the stored message's (Telegram
lets only the author edit, but the stored sender is the host's word, not the update's); its
new words are its text, or a file's caption.  Nothing reruns the agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.core.settings import Settings
from orchestrator.run.channel_edits import take_edit
from orchestrator.store.db import Database
from orchestrator.store.history import HistoryChange

SENDER_PREFIX = "tg:"


def sender_of(msg: Any) -> tuple[str, str]:
    """Who sent a Telegram message, as ingest stores it: (``tg:<id>``, their name): the person,
    else the chat it was sent as (an anonymous admin, a channel's post)."""
    user = msg.from_user
    if user is not None:
        return f"{SENDER_PREFIX}{user.id}", user.full_name or user.username or str(user.id)
    if msg.sender_chat is not None:
        return f"{SENDER_PREFIX}{msg.sender_chat.id}", msg.sender_chat.title or str(msg.sender_chat.id)
    return f"{SENDER_PREFIX}{msg.chat.id}", msg.chat.title or str(msg.chat.id)


def take_telegram_edit(
    db: Database,
    settings: Settings,
    msg: Any,
    chat_jid: str,
    *,
    channel: str,
    signal_delivery: Callable[[str], object] | None = None,
) -> HistoryChange | None:
    """The edit an ``edited_message`` (``msg``, of the chat stored as ``chat_jid``) carries,
    made in the history."""
    sender, _ = sender_of(msg)
    return take_edit(
        db,
        settings,
        chat_jid=chat_jid,
        message_id=f"tg-{msg.chat.id}-{msg.message_id}",
        editor=sender,
        content=msg.text or msg.caption or "",
        channel=channel,
        signal_delivery=signal_delivery,
    )
