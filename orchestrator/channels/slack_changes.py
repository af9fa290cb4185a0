"""Slack's side of a message that changed after it was posted (``orchestrator/run/outbound_changes.py``).

* **Edit**: each post of the message is updated in place with ``chat.update`` (its ts kept),
  drawn as a new post is (``slack_blocks.py``).  A message that now needs more posts gets
  the extra ones posted after (in its thread); one that needs fewer has the rest deleted.
  A post someone deleted on Slack's side (``message_not_found``) is posted again.  The
  files it shared stay as they are: an edit changes words.
* **React**: ``reactions.add`` on the message's first post, by Slack's name for the emoji
  (``agent_runner.protocol.REACTIONS``); one already there is no failure.
* **Retract**: each post is deleted with ``chat.delete`` and each file it shared with
  ``files.delete``; one already gone (``message_not_found``, ``file_not_found``,
  ``file_deleted``) is no failure.

Updating and deleting are the same whatever their repeats, so a retry in this process
makes them again, and posts again only what it had not (:class:`MadeSteps`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any, Protocol

from orchestrator.channels.base import FILE_POST, MadeSteps, file_posts
from orchestrator.channels.slack_blocks import SlackPost
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.render import RenderedMessage

POST_GONE = ("message_not_found",)
# A reaction already there is the reaction made (a retry after a lost answer).
REACTED = ("already_reacted",)
FILE_GONE = ("file_not_found", "file_deleted")

# Posts one post to (conversation, thread); its ts.
Poster = Callable[[str, SlackPost, str | None], str]


class WebCalls(Protocol):
    """What this needs of ``slack.py``'s ``SlackWeb``: a Web API call, some error answers tolerated."""

    def call(self, method: str, *, form: bool = False, tolerate: Collection[str] = (), **params: Any) -> JsonObject: ...


class SlackChanges:
    def __init__(self, web: WebCalls, post: Poster) -> None:
        self.web, self.post = web, post
        self._made = MadeSteps()

    def edit(
        self, address: str, posted: list[str], posts: list[SlackPost], thread: str | None, rendered: RenderedMessage
    ) -> list[str]:
        """Show ``posts`` where ``posted`` are (see the module's doc); the ts of each post now,
        then the files as they were."""
        words, files = file_posts(posted)
        key = rendered.delivery_id or f"{address}:{rendered.seq}"
        now = self._made.so_far(key)
        for i in range(len(now), len(posts)):
            post = posts[i]
            if i < len(words):
                answer = self.web.call(
                    "chat.update", channel=address, ts=words[i], text=post.text, blocks=post.blocks, tolerate=POST_GONE
                )
                now.append(words[i] if answer.get("ok") else self.post(address, post, thread))
            else:
                now.append(self.post(address, post, thread))
            self._made.keep(key, now)
        for ts in words[len(posts) :]:
            self.web.call("chat.delete", channel=address, ts=ts, tolerate=POST_GONE)
        self._made.done(key)
        return now + [FILE_POST + f for f in files]

    def retract(self, address: str, posted: list[str]) -> None:
        words, files = file_posts(posted)
        for ts in words:
            self.web.call("chat.delete", channel=address, ts=ts, tolerate=POST_GONE)
        for file_id in files:
            self.web.call("files.delete", file=file_id, tolerate=FILE_GONE)

    def react(self, address: str, posted: list[str], name: str) -> bool:
        words, _ = file_posts(posted)
        if not words:
            return False  # only files posted: Slack's file shares are not messages to react to
        self.web.call("reactions.add", channel=address, timestamp=words[0], name=name, tolerate=REACTED)
        return True
