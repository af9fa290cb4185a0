"""A person's edit of their own message on a channel becomes an edit in the history.

The channel's inbound side (a Slack ``message_changed`` event:
``orchestrator/channels/slack_edits.py``; a Telegram ``edited_message`` update:
``orchestrator/channels/telegram_edits.py``) names the stored message (by the id ingest
gave it), who edited it and the new words.  :func:`take_edit` makes it an edit as
``orchestrator edit`` makes one (``orchestrator/store/history.py``: the old text kept in
``edit_history``; the channels that showed a copy update it), without a rerun: the agent
answers again only when someone asks (``orchestrator edit --rerun``, the page's edit).

What a channel's sender writes is hostile.  The edit is taken only when the editor is the
stored message's own sender; an edit of anyone else's message, of a message that is not a
person's, of one superseded, or of one never stored is ignored and logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from orchestrator.core.errors import ChangeRefused, InvalidMessage, MessageNotFound
from orchestrator.core.settings import Settings
from orchestrator.core.terminal import for_log
from orchestrator.store.db import Database
from orchestrator.store.history import HistoryChange, edit_message
from orchestrator.store.message_log import resolve_message

log = logging.getLogger(__name__)


def take_edit(
    db: Database,
    settings: Settings,
    *,
    chat_jid: str,
    message_id: str,
    editor: str,
    content: str,
    channel: str,
    signal_delivery: Callable[[str], object] | None = None,
) -> HistoryChange | None:
    """``editor``'s edit on ``channel`` of the stored message ``message_id`` of ``chat_jid``
    to ``content``; what it changed (None: nothing, and why is logged)."""
    where = f"{channel}: {for_log(editor)}'s edit of {for_log(message_id)} in {for_log(chat_jid)}"
    try:
        stored = resolve_message(chat_jid, message_id, db=db)
    except MessageNotFound:
        log.info("%s: no such message stored; ignored", where)
        return None
    if stored.sender != editor:
        log.warning("%s: the message is %s's, not the editor's; ignored", where, for_log(stored.sender))
        return None
    content = content.replace("\x00", "")
    if content == stored.content:
        return None  # the same words (an edit of what is not stored: formatting, an attachment)
    try:
        return edit_message(db, settings, chat_jid, stored.id, content, signal_delivery=signal_delivery)
    except (ChangeRefused, InvalidMessage) as exc:
        log.warning("%s: %s; ignored", where, exc)
        return None
