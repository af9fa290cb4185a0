"""Slack: a workspace's channels as an optional channel (``pip install '.[slack]'``).

* **Outbound**: the ``slack`` channel posts each delivered message with the Web
  API's ``chat.postMessage`` to the attachment's address, a Slack channel id
  (``orchestrator groups attach JID slack --address C0123456789``), drawn as
  Block Kit (``orchestrator/channels/slack_blocks.py``: escaped, cut to Slack's
  sizes; a long message is several posts).  A reply to a message written in a
  Slack thread goes to that thread (:func:`reply_thread`).  A failed call (an
  error answer, a 500, a network error) raises
  :class:`~orchestrator.core.errors.ChannelError`, so the deliveries table
  retries it; a 429 raises :class:`~orchestrator.core.errors.ChannelRateLimited`
  with Slack's ``Retry-After``, and the next attempt waits at least that long.
  slack_sdk's own retry handlers are off: every retry is the ledger's, so a
  message is never posted twice.  The posts of a long message already made are
  not made again by a retry in the same process.
* **Files**: a message that carries files (a FILE envelope: what the agent sent
  with ``send_file``, or a person's upload on another channel) is posted as any
  other (its words, and the line naming its files), then each file is uploaded
  to the same conversation and thread with Slack's external upload flow, as
  Slack documents it: ``files.getUploadURLExternal`` (``filename``, ``length``,
  as a form), the bytes POSTed to the ``upload_url`` it answers (only one on
  Slack's hosts: ``orchestrator/channels/slack_files.py``), then
  ``files.completeUploadExternal`` (``files=[{id, title}]``, ``channel_id``,
  ``thread_ts`` when the message goes to a thread).  The bytes are read from
  the file store, only a file of the message's own chat.  The posts and the
  uploads are one sequence of steps: a retry in the same process resumes at
  the first step not done, so no file is shared twice.  An empty file is not
  uploaded (Slack takes no file of 0 bytes); a file that is gone from the store
  fails the delivery.
* **Inbound**: ``orchestrator/channels/slack_inbound.py`` (the Events API route
  and what both transports share) and ``orchestrator/channels/slack_socket.py``
  (Socket Mode).
* **Working...**: ``orchestrator/channels/slack_progress.py``.
* **Changes**: an edited message updated in place, a superseded one deleted
  (``orchestrator/channels/slack_changes.py``), by the ts's ``send`` returned.

Enable it with ``ORCHESTRATOR_CHANNEL_PLUGINS=orchestrator.channels.slack:channel``
and ``ORCHESTRATOR_SLACK_BOT_TOKEN``.  slack_sdk's ``WebClient`` is synchronous
and thread-safe (one HTTP request per call, no shared connection state), so the
deliverer calls it from any thread.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Collection
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from agent_runner.protocol import Reaction
from orchestrator.channels.base import FILE_POST, BaseChannel, post_named
from orchestrator.channels.slack_blocks import SlackPost, slack_posts
from orchestrator.channels.slack_changes import SlackChanges
from orchestrator.channels.slack_files import send_upload, slack_origins
from orchestrator.core.errors import ChannelError, ChannelRateLimited, StoreError
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import FileRef, files_of
from orchestrator.model.render import RenderedMessage
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.store.attachments import chats_on_with_assistant
from orchestrator.store.db import Database, open_database
from orchestrator.store.files import FileStore
from orchestrator.store.message_log import message_metadata

log = logging.getLogger(__name__)

CHANNEL = "slack"
UNATTACHED_PREFIX = "slack:"
# A person's sender id is slack:<user id>; a stored message's id slack-<channel>-<ts>.
SENDER_PREFIX, ID_PREFIX = "slack:", "slack-"
# Where a stored Slack message came from, in its metadata: the reply finds its thread by them.
CHANNEL_KEY, TS_KEY, THREAD_KEY = "slack_channel", "slack_ts", "slack_thread_ts"
# A conversation id: C (public), G (private, older), D (direct), upper-case letters and digits.
ADDRESS = re.compile(r"^[CGD][A-Z0-9]{6,24}$")
# A message's ts: Unix seconds (a date a datetime can hold) and a sequence number.
TS = re.compile(r"^[0-9]{1,10}\.[0-9]{1,9}$")
_TIMEOUT_S = 30


# -- the Web API's answers this code reads (typed; the rest of each answer is ignored) ------


class _Answer(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Posted(_Answer):
    """``chat.postMessage``: the new message's ts (what ``chat.update``/``chat.delete`` name)."""

    ts: str


class UploadTicket(_Answer):
    """``files.getUploadURLExternal``: where to POST a file's bytes, and the file's id."""

    upload_url: str
    file_id: str


class Identity(_Answer):
    """``auth.test``: who the token is."""

    user_id: str | None = None


class Profile(_Answer):
    display_name: str = ""
    real_name: str = ""


class User(_Answer):
    name: str = ""
    profile: Profile = Profile()

    @property
    def shown_name(self) -> str:
        return self.profile.display_name or self.profile.real_name or self.name


class UserInfo(_Answer):
    """``users.info``."""

    user: User


A = TypeVar("A", bound=_Answer)


def _require_sdk() -> None:
    try:
        import slack_sdk  # noqa: F401
    except ImportError as exc:  # the optional extra is not installed
        raise ChannelError("the slack channel needs slack_sdk: pip install 'agent-orchestrator[slack]'") from exc


def _retry_after(headers: Any) -> float:
    try:
        return max(1.0, float((headers or {}).get("Retry-After") or (headers or {}).get("retry-after") or 1))
    except (TypeError, ValueError):
        return 1.0


class SlackWeb:
    """The Web API with one token: :meth:`call` posts a method's JSON and returns the answer,
    or raises :class:`ChannelError` (:class:`ChannelRateLimited` on a 429)."""

    def __init__(self, settings: Settings, *, token: str | None = None) -> None:
        token = settings.slack.bot_token if token is None else token
        if not token:
            raise ChannelError("set ORCHESTRATOR_SLACK_BOT_TOKEN to use the slack channel")
        _require_sdk()
        from slack_sdk import WebClient

        # No retry handlers: a retry is the deliveries ledger's to make (and to count).
        self.client = WebClient(token=token, base_url=settings.slack.api_base, timeout=_TIMEOUT_S, retry_handlers=[])
        self._me: Identity | None = None
        self._lock = threading.Lock()

    def call(self, method: str, *, form: bool = False, tolerate: Collection[str] = (), **params: Any) -> JsonObject:
        """``method`` with ``params`` as a JSON body, or as a form (``form``: what slack_sdk's
        own methods send, and what a method that takes no JSON needs, such as
        ``files.getUploadURLExternal``); None values are left out.  An error answer named in
        ``tolerate`` (``message_not_found`` for a delete) is returned, not raised."""
        from slack_sdk.errors import SlackApiError

        given = {k: v for k, v in params.items() if v is not None}
        try:
            if form:
                response = self.client.api_call(method, params=given)
            else:
                response = self.client.api_call(method, json=given)
        except SlackApiError as exc:
            status = exc.response.status_code
            error = (exc.response.data or {}).get("error") if isinstance(exc.response.data, dict) else None
            if status == 429 or error == "ratelimited":
                wait = _retry_after(exc.response.headers)
                raise ChannelRateLimited(f"slack {method}: rate limited (retry after {wait:g} s)", wait) from exc
            if error in tolerate and isinstance(exc.response.data, dict):
                return exc.response.data
            raise ChannelError(f"slack {method}: {error or 'HTTP ' + str(status)}") from exc
        except Exception as exc:  # a network error, a body that is no JSON: a failed call
            raise ChannelError(f"slack {method}: {type(exc).__name__}: {exc}") from exc
        data = response.data
        if not isinstance(data, dict):
            raise ChannelError(f"slack {method}: an answer that is not a JSON object")
        return data

    def ask(self, answer: type[A], method: str, *, form: bool = False, **params: Any) -> A:
        """:meth:`call`, its answer read as ``answer`` (one that is not: a failed call)."""
        data = self.call(method, form=form, **params)
        try:
            return answer.model_validate(data)
        except ValidationError as exc:
            raise ChannelError(f"slack {method}: an answer without {exc.errors()[0]['loc']}") from exc

    def bot_user_id(self) -> str | None:
        """The bot's own user id (``auth.test``, asked once): its messages are never taken in."""
        with self._lock:
            if self._me is None:
                self._me = self.ask(Identity, "auth.test")
            return self._me.user_id


def thread_of(db: Database, chat_jid: str, seq: int, address: str) -> str | None:
    """The Slack thread message ``seq`` of ``chat_jid`` was written in, when it came from
    the Slack conversation ``address`` in a thread (None: not from there, or not in a thread)."""
    meta = message_metadata(db, chat_jid, seq)
    if not isinstance(meta, dict) or meta.get(CHANNEL_KEY) != address:
        return None
    thread = meta.get(THREAD_KEY)
    return thread if isinstance(thread, str) and TS.match(thread) else None


def reply_thread(db: Database, rendered: RenderedMessage, address: str) -> str | None:
    """The Slack thread a message goes to at ``address``: the thread of the message it answers
    (``reply_to_seq``, the last input of the run that wrote it), if that one was written in one."""
    seq = (rendered.metadata or {}).get(REPLY_TO_KEY)
    if not isinstance(seq, int) or isinstance(seq, bool):
        return None
    return thread_of(db, rendered.chat_jid, seq, address)


class SlackChannel(BaseChannel):
    """Posts each delivered message to a Slack conversation (the attachment's address: its id)."""

    name = CHANNEL

    def __init__(self, settings: Settings, web: SlackWeb | None = None, db: Database | None = None) -> None:
        self.settings = settings
        self.web = web or SlackWeb(settings)
        self._db = db
        self._own_db = db is None
        # Steps of a message already made (its posts, then its files' uploads: each one's
        # id, "" for a step that posted nothing), by (address, chat, seq): a retry resumes
        # at the first step not done.
        self._progress: dict[tuple[str, str, int], list[str]] = {}
        self._lock = threading.Lock()
        self._files: FileStore | None = None
        self._origins = slack_origins(settings.slack.api_base)
        self._changes = SlackChanges(self.web, self._post)

    @property
    def db(self) -> Database:
        # Made on first use: a process that only builds the registry (the CLI) never opens it.
        with self._lock:
            if self._db is None:
                self._db = open_database(self.settings, migrate=False)
            return self._db

    def owns(self, address: str) -> bool:
        return bool(ADDRESS.match(address.strip()))

    def send(self, address: str, rendered: RenderedMessage) -> list[str]:
        """Post ``rendered``; the ts of each post, then ``file:<id>`` of each file shared."""
        address = address.strip()
        if not self.owns(address):
            raise ChannelError(
                f"the slack channel needs a conversation id (C..., G... or D...) as its address, not {address!r}"
            )
        posts = slack_posts(rendered)
        carried = files_of(rendered.metadata)
        files = list(carried.files) if carried is not None else []
        thread = reply_thread(self.db, rendered, address)
        key = (address, rendered.chat_jid, rendered.seq)
        with self._lock:
            made = list(self._progress.get(key, []))
        for i in range(len(made), len(posts) + len(files)):
            if i < len(posts):
                made.append(self._post(address, posts[i], thread))
            else:
                shared = self._upload(address, thread, rendered.chat_jid, files[i - len(posts)])
                made.append(FILE_POST + shared if shared else "")
            with self._lock:
                self._progress[key] = list(made)
        with self._lock:
            self._progress.pop(key, None)
        return [m for m in made if m]

    def _post(self, address: str, post: SlackPost, thread: str | None) -> str:
        """One ``chat.postMessage``; its ts."""
        # unfurl off: a link in the agent's words does not fetch a preview on Slack's side.
        posted = self.web.ask(
            Posted,
            "chat.postMessage",
            channel=address,
            text=post.text,
            blocks=post.blocks,
            thread_ts=thread,
            unfurl_links=False,
            unfurl_media=False,
        )
        return posted.ts

    def _file_store(self) -> FileStore:
        db = self.db  # before the lock: self.db takes it too
        with self._lock:
            if self._files is None:
                self._files = FileStore.from_settings(db, self.settings)
            return self._files

    def _upload(self, address: str, thread: str | None, chat_jid: str, ref: FileRef) -> str | None:
        """One file of ``chat_jid``'s message shared in ``address`` (and ``thread``); its Slack
        file id (None: an empty file, not uploaded)."""
        store = self._file_store()
        try:
            stored = store.get(ref.id, chat_jid=chat_jid)
            data = store.read_bytes(stored)
        except StoreError as exc:
            raise ChannelError(f"slack: file {ref.id} of {chat_jid} cannot be read: {exc}") from exc
        if not data:
            log.info("slack: file %s of %s is empty; not uploaded", ref.id, chat_jid)
            return None
        ticket = self.web.ask(
            UploadTicket, "files.getUploadURLExternal", form=True, filename=stored.name, length=len(data)
        )
        send_upload(ticket.upload_url, data, origins=self._origins, timeout_s=self.settings.slack.file_timeout_s)
        self.web.call(
            "files.completeUploadExternal",
            form=True,
            files=json.dumps([{"id": ticket.file_id, "title": stored.name}]),
            channel_id=address,
            thread_ts=thread,
        )
        return ticket.file_id

    def edit(self, address: str, posted: list[str], rendered: RenderedMessage) -> list[str]:
        """``chat.update`` of each post in place (``orchestrator/channels/slack_changes.py``)."""
        address = address.strip()
        thread = reply_thread(self.db, rendered, address)
        return self._changes.edit(address, posted, slack_posts(rendered), thread, rendered)

    def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None:
        """``chat.delete`` of each post, ``files.delete`` of each file shared."""
        self._changes.retract(address.strip(), posted)

    def react(self, address: str, posted: list[str], rendered: RenderedMessage, reaction: Reaction) -> bool:
        """``reactions.add`` of the reaction's Slack name on the message's first post."""
        return self._changes.react(address.strip(), posted, reaction.slack)

    def origin_post(self, address: str, message_id: str) -> str | None:
        """The ts of a message that came from conversation ``address`` (``slack-<conversation>-<ts>``)."""
        return post_named(message_id, f"{ID_PREFIX}{address.strip()}-")

    def disconnect(self) -> None:
        with self._lock:
            db, self._db = (self._db, None) if self._own_db else (None, self._db)
        if db is not None:
            db.engine.dispose()


def channel(settings: Settings) -> SlackChannel:
    """The ``ORCHESTRATOR_CHANNEL_PLUGINS`` factory: ``orchestrator.channels.slack:channel``."""
    return SlackChannel(settings)


def attached_groups(db: Database) -> dict[str, tuple[str, str | None]]:
    """Slack conversation id -> (the group attached to it, its assistant's name), the first
    group by chat id when several are."""
    found: dict[str, tuple[str, str | None]] = {}
    for chat_jid, address, assistant in chats_on_with_assistant(db, CHANNEL):
        found.setdefault((address or chat_jid).strip(), (chat_jid, assistant))
    return found
