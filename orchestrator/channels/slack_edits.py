"""A person's edit of their own message on Slack becomes an edit in the history.

Slack sends an edit as a ``message`` event of the subtype ``message_changed`` (both
transports: ``orchestrator/channels/slack_inbound.py`` hands it here), the message as it
is now under ``message``: its author (``user``), who edited it (``edited.user``), its
``ts`` and its new ``text``.  It names the stored message ``slack-<channel>-<ts>``, and is
taken by ``orchestrator/run/channel_edits.py`` only when the editor is its author and the
stored message's sender.  A bot's change (ours, by ``chat.update``, among them), an edit
by anyone else, or one that is not understood is ignored (and logged); the text is read
as a new message's is (mentions, links, escapes).  Nothing reruns the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.channels.slack import (
    ADDRESS,
    CHANNEL,
    ID_PREFIX,
    SENDER_PREFIX,
    TS,
    UNATTACHED_PREFIX,
    attached_groups,
)
from orchestrator.core.settings import Settings
from orchestrator.core.terminal import for_log
from orchestrator.run.channel_edits import take_edit
from orchestrator.store.db import Database
from orchestrator.store.history import HistoryChange

log = logging.getLogger(__name__)

EDITED_SUBTYPE = "message_changed"


class _Edited(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    user: str | None = None


class ChangedMessage(BaseModel):
    """A ``message_changed`` event's ``message``: the message as it is now."""

    model_config = ConfigDict(extra="ignore", strict=True)

    user: str | None = None
    bot_id: str | None = None
    text: str | None = None
    ts: str | None = None
    edited: _Edited | None = None


def take_slack_edit(
    db: Database,
    settings: Settings,
    channel: str | None,
    message: Any,
    *,
    readable: Callable[[str, str], str],
    max_chars: int,
    signal_delivery: Callable[[str], object] | None = None,
) -> HistoryChange | None:
    """The edit a ``message_changed`` event in ``channel`` carries (``message``, as Slack sent
    it) made in the history; ``readable(text, trigger)``: Slack's text as people read it."""
    try:
        changed = ChangedMessage.model_validate(message)
    except ValidationError:
        log.info("slack: a message_changed event in %s that is not understood; ignored", for_log(channel or "?"))
        return None
    if changed.bot_id or not changed.user:
        return None  # a bot's message changed (our own updates among them)
    if not channel or not ADDRESS.match(channel) or not changed.ts or not TS.match(changed.ts):
        return None
    editor = changed.edited.user if changed.edited is not None and changed.edited.user else changed.user
    if editor != changed.user:
        log.warning(
            "slack: %s edited %s's message %s in %s; ignored",
            for_log(editor),
            for_log(changed.user),
            for_log(changed.ts),
            for_log(channel),
        )
        return None
    chat_jid, assistant = attached_groups(db).get(channel, (f"{UNATTACHED_PREFIX}{channel}", None))
    text = readable(changed.text or "", "@" + (assistant or settings.assistant_name))[:max_chars]
    return take_edit(
        db,
        settings,
        chat_jid=chat_jid,
        message_id=f"{ID_PREFIX}{channel}-{changed.ts}",
        editor=f"{SENDER_PREFIX}{editor}",
        content=text,
        channel=CHANNEL,
        signal_delivery=signal_delivery,
    )
