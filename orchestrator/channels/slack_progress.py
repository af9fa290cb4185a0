"""A run's "working..." message on Slack, updated in place while the run goes on.

The run path knows nothing of Slack: it publishes what a run is doing the way
the chat's event stream reads it (``orchestrator/http/stream.py``), in the
database: the ``runs`` table (a run appears, is ``running``, ends) and the
``run_drafts`` row its reply is written into as the model streams it
(``orchestrator/run/live_draft.py``).  :class:`WorkingMessages` follows the
same two for the groups attached to Slack, in the process that holds the
Socket Mode connection (``orchestrator slack socket``; ``orchestrator slack
progress`` alone where the Events API brings messages in):

* a run of such a group starts: a "⏳ working…" message is posted to the
  group's Slack conversation, in the thread the run's last input was written
  in (where its replies will go, ``orchestrator/channels/slack.py``);
* while it runs, at most every ``ORCHESTRATOR_SLACK_PROGRESS_INTERVAL_S``,
  the message is updated in place (``chat.update``) with the time it has run
  and the end of the reply being written (escaped like every text we send); a
  429 puts the next update off by its ``Retry-After``;
* its first reply has been posted on Slack (its delivery ``sent``), or the run
  ended without one: the message is deleted (``chat.delete``), so the replies
  take its place.

Which messages are out is kept in ``<data dir>/slack/working.json``, so a
restarted follower updates and deletes what the one before it posted instead
of leaving it behind.  Run one per app (as the Socket Mode connection).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.channels.slack import CHANNEL, Posted, SlackWeb, thread_of
from orchestrator.channels.slack_blocks import escape
from orchestrator.core.errors import ChannelError, ChannelRateLimited
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.deliveries import bot_reply_sent
from orchestrator.store.drafts import chat_drafts
from orchestrator.store.runs import running_on

log = logging.getLogger(__name__)

WORKING = "⏳ working…"
DRAFT_TAIL = 1500  # characters of the reply being written shown under it


@dataclass
class _Post:
    chat_jid: str
    address: str
    ts: str
    thread: str | None
    assistant: str
    started: float
    shown: str = ""
    next_update: float = 0.0


@dataclass(frozen=True)
class _Run:
    id: str
    chat_jid: str
    cursor_to: int
    address: str
    assistant: str


class WorkingMessages:
    """Posts, updates and deletes the "working..." messages (see the module's doc)."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        web: SlackWeb | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db, self.settings = db, settings
        self.web = web or SlackWeb(settings)
        self.interval = settings.slack.progress_interval_s
        self.clock = clock
        self.state_path = settings.data_dir / CHANNEL / "working.json"
        self.posts: dict[str, _Post] = self._load()
        self._not_before: dict[str, float] = {}  # run -> when to try posting again after a failure

    # -- what is going on --------------------------------------------------------------

    def _running(self) -> dict[str, _Run]:
        """The running runs (not replays) of the groups attached to Slack."""
        return {
            r.run_id: _Run(
                r.run_id, r.chat_jid, r.cursor_to, r.address.strip(), r.assistant_name or self.settings.assistant_name
            )
            for r in running_on(self.db, CHANNEL)
        }

    def _answered(self, chat_jid: str, address: str, cursor_to: int) -> bool:
        """A reply of the run (the bot's, after its last input) has been posted on Slack."""
        return bot_reply_sent(self.db, chat_jid, CHANNEL, address, cursor_to)

    # -- one look ----------------------------------------------------------------------

    def tick(self) -> None:
        """Post, update and delete what the runs call for now."""
        running = self._running()
        changed = False
        now = self.clock()
        for run in running.values():
            if run.id in self.posts or self._not_before.get(run.id, 0.0) > now:
                continue
            if self._answered(run.chat_jid, run.address, run.cursor_to):
                continue  # its reply is out already (a follower that started late)
            changed |= self._post(run, now)
        for run_id, post in list(self.posts.items()):
            live = running.get(run_id)
            if live is None or self._answered(post.chat_jid, post.address, live.cursor_to):
                changed |= self._delete(run_id, post)
            elif now >= post.next_update:
                self._update(run_id, post, now)
        self._not_before = {k: v for k, v in self._not_before.items() if k in running and v > now}
        if changed:
            self._save()

    def _blocks(self, post: _Post, elapsed: float, draft: str) -> tuple[str, list[JsonObject]]:
        head = f"⏳ {post.assistant} is working… ({int(elapsed)} s)"
        blocks: list[JsonObject] = [
            {"type": "context", "elements": [{"type": "mrkdwn", "text": escape(head), "verbatim": True}]}
        ]
        if draft.strip():
            tail = draft if len(draft) <= DRAFT_TAIL else "…" + draft[-DRAFT_TAIL:]
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": escape(tail), "verbatim": True}})
        return escape(head), blocks

    def _post(self, run: _Run, now: float) -> bool:
        thread = thread_of(self.db, run.chat_jid, run.cursor_to, run.address)
        post = _Post(run.chat_jid, run.address, "", thread, run.assistant, now)
        text, blocks = self._blocks(post, 0, "")
        try:
            posted = self.web.ask(
                Posted,
                "chat.postMessage",
                channel=run.address,
                text=text,
                blocks=blocks,
                thread_ts=thread,
                unfurl_links=False,
                unfurl_media=False,
            )
        except ChannelError as exc:
            wait = exc.retry_after_s if isinstance(exc, ChannelRateLimited) else self.interval
            self._not_before[run.id] = now + wait
            log.warning("slack: no working message for run %s (%s)", run.id, exc)
            return False
        post.ts, post.shown, post.next_update = posted.ts, json.dumps(blocks, ensure_ascii=False), now + self.interval
        self.posts[run.id] = post
        return True

    def _update(self, run_id: str, post: _Post, now: float) -> None:
        draft = next((d.text for d in chat_drafts(self.db, post.chat_jid) if d.run_id == run_id), "")
        text, blocks = self._blocks(post, now - post.started, draft)
        shown = json.dumps(blocks, ensure_ascii=False)
        post.next_update = now + self.interval
        if shown == post.shown:
            return
        try:
            self.web.call("chat.update", channel=post.address, ts=post.ts, text=text, blocks=blocks)
            post.shown = shown
        except ChannelRateLimited as exc:
            post.next_update = now + max(self.interval, exc.retry_after_s)
        except ChannelError as exc:
            log.info("slack: working message of run %s not updated (%s)", run_id, exc)

    def _delete(self, run_id: str, post: _Post) -> bool:
        try:
            self.web.call("chat.delete", channel=post.address, ts=post.ts)
        except ChannelRateLimited as exc:
            post.next_update = self.clock() + exc.retry_after_s
            return False  # tried again on a later tick
        except ChannelError as exc:  # gone already (message_not_found), or not ours to delete any more
            log.info("slack: working message of run %s not deleted (%s)", run_id, exc)
        del self.posts[run_id]
        return True

    # -- kept across restarts ----------------------------------------------------------------

    def _load(self) -> dict[str, _Post]:
        try:
            doc = json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {}
        now = self.clock()
        posts: dict[str, _Post] = {}
        for run_id, p in doc.items() if isinstance(doc, dict) else ():
            try:
                posts[str(run_id)] = _Post(
                    str(p["chat_jid"]),
                    str(p["address"]),
                    str(p["ts"]),
                    p.get("thread"),
                    str(p.get("assistant") or self.settings.assistant_name),
                    now,
                )
            except (KeyError, TypeError):
                continue
        return posts

    def _save(self) -> None:
        doc = {
            run_id: {
                "chat_jid": p.chat_jid,
                "address": p.address,
                "ts": p.ts,
                "thread": p.thread,
                "assistant": p.assistant,
            }
            for run_id, p in self.posts.items()
        }
        path: Path = self.state_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    def run(self, stop: threading.Event, *, poll_s: float = 0.5) -> None:
        """Look every ``poll_s`` until ``stop`` is set; a failed look is logged and the next one comes."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # the database away for a moment: the next look
                log.exception("slack: the working messages could not be brought up to date")
            stop.wait(poll_s)
