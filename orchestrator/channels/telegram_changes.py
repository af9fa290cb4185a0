"""Telegram's side of a message that changed after it was sent (``orchestrator/run/outbound_changes.py``).

* **Edit**: each part of the message's words is edited in place with ``editMessageText``
  (its message id kept; "message is not modified" is no failure).  A message that now needs
  more parts gets the extra ones sent after; one that needs fewer has the rest taken back.
  A part someone deleted ("message to edit not found") is sent again.  The files it
  carried stay as they are: an edit changes words.
* **Retract**: each message is deleted with ``deleteMessage`` (one already gone is no
  failure).  Telegram lets a bot delete its messages in a group for 48 hours only; past
  that it answers "message can't be deleted for everyone", and the message is edited to
  :data:`RETRACTED` instead (its caption, for a file's).

* **React**: ``setMessageReaction`` on the message's first part, with Telegram's form of
  the emoji (``agent_runner.protocol.REACTIONS``: its bots may use a fixed set only).  A
  bot has one reaction per message on Telegram, so a second replaces the first there.  An
  emoji outside the set, or one the chat's admins have not allowed (``REACTION_INVALID``),
  is not shown: the change ends with the reason.

Editing, deleting and reacting are the same whatever their repeats, so a retry in this process makes
them again, and sends again only what it had not (:class:`MadeSteps`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from orchestrator.channels.base import FILE_POST, MadeSteps, file_posts
from orchestrator.model.render import RenderedMessage

RETRACTED = "🗑 retracted"

# Sends one message of words to a chat; its message id.
Sender = Callable[[int | str, str], int]


class TelegramChanges:
    def __init__(self, client: Any, send_text: Sender) -> None:
        # ``client``: the channel's TelegramClient (its ``call`` runs a coroutine factory on its loop).
        self.client, self.send_text = client, send_text
        self._made = MadeSteps()

    def edit(self, target: int | str, posted: list[str], parts: list[str], rendered: RenderedMessage) -> list[str]:
        """Show ``parts`` where ``posted`` are (see the module's doc); the message id of each
        part now, then the files as they were."""
        words, files = file_posts(posted)
        key = rendered.delivery_id or f"{target}:{rendered.seq}"
        now = self._made.so_far(key)
        for i in range(len(now), len(parts)):
            if i < len(words) and self._edit_text(target, int(words[i]), parts[i]):
                now.append(words[i])
            else:
                now.append(str(self.send_text(target, parts[i])))
            self._made.keep(key, now)
        for mid in words[len(parts) :]:
            self._take_back(target, int(mid), caption=False)
        self._made.done(key)
        return now + [FILE_POST + f for f in files]

    def retract(self, target: int | str, posted: list[str]) -> None:
        words, files = file_posts(posted)
        for mid in words:
            self._take_back(target, int(mid), caption=False)
        for mid in files:
            self._take_back(target, int(mid), caption=True)

    def react(self, target: int | str, posted: list[str], emoji: str | None) -> bool:
        from telegram.error import BadRequest

        words, _ = file_posts(posted)
        if emoji is None or not words:
            return False
        message_id = int(words[0])
        try:
            self.client.call(
                lambda bot: bot.set_message_reaction(chat_id=target, message_id=message_id, reaction=emoji)
            )
        except BadRequest as exc:
            if "reaction_invalid" in str(exc).lower():
                return False
            raise
        return True

    def _edit_text(self, target: int | str, message_id: int, text: str) -> bool:
        """``editMessageText``; False: the message is not there any more."""
        from telegram.error import BadRequest

        try:
            self.client.call(lambda bot: bot.edit_message_text(chat_id=target, message_id=message_id, text=text))
        except BadRequest as exc:
            said = str(exc).lower()
            if "not modified" in said:
                return True  # it says that already (an earlier attempt's edit went through)
            if "not found" in said:
                return False
            raise
        return True

    def _take_back(self, target: int | str, message_id: int, *, caption: bool) -> None:
        from telegram.error import BadRequest

        try:
            self.client.call(lambda bot: bot.delete_message(chat_id=target, message_id=message_id))
            return
        except BadRequest as exc:
            said = str(exc).lower()
            if "not found" in said:
                return  # gone already
            if "can't be deleted" not in said:
                raise
        # Past Telegram's 48 hours: the message says it was taken back instead.
        try:
            if caption:
                self.client.call(
                    lambda bot: bot.edit_message_caption(chat_id=target, message_id=message_id, caption=RETRACTED)
                )
            else:
                self.client.call(
                    lambda bot: bot.edit_message_text(chat_id=target, message_id=message_id, text=RETRACTED)
                )
        except BadRequest as exc:
            if "not modified" not in str(exc).lower():
                raise
