"""Slack messages in: what the Events API and Socket Mode share, and the Events API's checks.

Both transports hand over the same ``event_callback`` document (the Events
API POSTs it; Socket Mode wraps it in an ``events_api`` envelope);
:class:`SlackInbound` takes it in:

* only a person's message is stored: a ``message`` (plain, ``thread_broadcast``
  or ``file_share``) or ``app_mention`` event with a ``user``.  Bots' messages
  (``bot_id`` set, the ``bot_message`` subtype) and our own bot user's are never
  taken in, so no reply of ours (nor another bot's) comes back as input, and
  deletions, joins and the like are skipped; a person's edit of their own message
  (``message_changed``) edits the stored one (``orchestrator/channels/slack_edits.py``);
* what the sender chooses is the text, nothing else: the message is a ``user``
  message from ``slack:<user id>``, never a harness sender or type, with
  channel ``slack`` (mirrored to the group's other channels, not back);
* the text is read as people read it (:meth:`SlackInbound.readable`): a
  mention of the bot user (``<@U…>``) becomes ``@<assistant>``, so it triggers
  the agent as the trigger word does (``app_mention`` events are such
  messages), other mentions ``@name``, channels ``#name``, links ``label
  (url)``, and Slack's escapes undone (``&lt;`` is ``<``);
* the files a message shares (``file_share``, or any message with ``files``) are
  downloaded with the bot token into the file store under the message's chat and named by
  its FILE envelope (``orchestrator/channels/slack_files.py``: only from Slack's hosts,
  within the size limits and a timeout); each one not taken is a line of the text saying
  why.  Nothing is downloaded for a channel no registered group is attached to, for a
  message stored already, or for a sender over the rate; a retry that comes while the
  first take still downloads waits for it;
* the id is ``slack-<channel>-<ts>``: the same message seen twice (a retry,
  both transports, its ``message`` and ``app_mention`` events) is stored once;
  the channel, ts and thread ts are kept in the metadata (a reply goes to the
  thread: ``orchestrator/channels/slack.py``);
* the group is the one whose ``slack`` attachment address is the channel id; a
  channel no group is attached to is stored under ``slack:<channel id>`` and
  never wakes an agent, like any unregistered chat, within ingest's bounds on them
  (``ORCHESTRATOR_UNREGISTERED_CHATS``, ``ORCHESTRATOR_UNREGISTERED_CHAT_MESSAGES``):
  a message past them is dropped (counted and logged by ingest) and answered 200;
* a sender over ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE`` gets an ephemeral
  "slow down" (once per wait) and the message is dropped.

``POST /slack/events`` (mounted by the HTTP API, ``orchestrator/http/routes/slack.py``,
with :class:`SlackEvents` and :func:`read_document`) checks Slack's signature
before it reads anything else: ``X-Slack-Signature: v0=<hex>``, the HMAC-SHA256
with ``ORCHESTRATOR_SLACK_SIGNING_SECRET`` of ``v0:<X-Slack-Request-Timestamp>:<raw
body>``, the timestamp within 5 minutes of this host's clock (older: a replay,
refused).  It answers the ``url_verification`` challenge, and a retry
(``X-Slack-Retry-Num``) of an event this process already took by its
``event_id`` without doing anything again (any other process finds the
message's id taken).  Everything Slack sends is answered 200 once it is
verified and understood (an event we skip too), so Slack does not retry it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.channels.base import InboundDoor
from orchestrator.channels.slack import (
    ADDRESS,
    CHANNEL,
    CHANNEL_KEY,
    ID_PREFIX,
    THREAD_KEY,
    TS,
    TS_KEY,
    UNATTACHED_PREFIX,
    SlackWeb,
    UserInfo,
    attached_groups,
)
from orchestrator.channels.slack import SENDER_PREFIX as SENDER_PREFIX
from orchestrator.channels.slack_blocks import escape, unescape
from orchestrator.channels.slack_edits import EDITED_SUBTYPE, take_slack_edit
from orchestrator.channels.slack_files import FileShares, Intake, not_taken
from orchestrator.core.errors import (
    ChannelError,
    InvalidMessage,
    MessageNotFound,
    RateLimited,
    UnregisteredChatsFull,
)
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest
from orchestrator.store.db import Database
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.groups import is_registered
from orchestrator.store.message_log import resolve_message
from orchestrator.store.usage import sender_retry_after

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
SIGNATURE_HEADER = "X-Slack-Signature"
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
RETRY_HEADER = "X-Slack-Retry-Num"
WINDOW_S = 300  # Slack's own advice: older requests are replays
TAKEN_SUBTYPES = frozenset({None, "thread_broadcast", "file_share"})
_SECONDS = re.compile(r"[0-9]{1,12}")
_USER = re.compile(r"^[UW][A-Z0-9]{2,24}$")
_SEEN_EVENTS = 10_000  # event ids remembered for retries (a few hours of a busy workspace)


# -- the wire (what Slack sends; unknown keys ignored, known ones typed) -------------------


# Strict: what the document says is a string must be one (pydantic's lax mode would take
# 5 for "5" and "yes" for true, which the document refuses).
class SlackEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: str
    subtype: str | None = None
    channel: str | None = None
    user: str | None = None
    bot_id: str | None = None
    text: str | None = None
    ts: str | None = None
    thread_ts: str | None = None
    # The files a message shares (file_share, or any message with some): each read by
    # orchestrator/channels/slack_files.py, one that is not understood noted, not fatal.
    files: list[Any] | None = None
    # A message_changed event's message as it is now (read by orchestrator/channels/slack_edits.py).
    message: Any = None


class Authorization(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    user_id: str | None = None
    is_bot: bool = False


class EventCallback(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["event_callback"]
    event_id: str | None = None
    event: SlackEvent
    authorizations: list[Authorization] = []


class UrlVerification(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["url_verification"]
    challenge: str


# -- the signature --------------------------------------------------------------------------


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's v0 signature of a request: HMAC-SHA256 of ``v0:<timestamp>:<body>``."""
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def signed_headers(secret: str, body: bytes, *, timestamp: float | None = None) -> dict[str, str]:
    """The headers Slack puts on ``body`` (now unless given): what the tests send."""
    stamp = str(int(time.time() if timestamp is None else timestamp))
    return {TIMESTAMP_HEADER: stamp, SIGNATURE_HEADER: sign(secret, stamp, body), "content-type": "application/json"}


def timestamp_refusal(timestamp: str | None, now: float) -> str | None:
    """Why a request's timestamp is refused before its body is read (None: it is not)."""
    if timestamp is None or not _SECONDS.fullmatch(timestamp.strip()):
        return f"a Slack request needs {TIMESTAMP_HEADER} (Unix seconds) and {SIGNATURE_HEADER}"
    if abs(now - int(timestamp)) > WINDOW_S:
        return f"{TIMESTAMP_HEADER} is more than {WINDOW_S} s from this server's clock (a replay?)"
    return None


def verify(secret: str, timestamp: str, body: bytes, signature: str | None) -> bool:
    return (
        bool(secret)
        and signature is not None
        and hmac.compare_digest(sign(secret, timestamp.strip(), body), signature.strip())
    )


# -- taking a message in --------------------------------------------------------------------


_ENTITY = re.compile(r"<([^<>]*)>")  # Slack's markup: a literal "<" a person typed arrives as "&lt;"
_SPECIAL = frozenset({"here", "channel", "everyone"})


class SlackInbound:
    """Stores the people's messages of ``event_callback`` documents (see the module's doc)."""

    def __init__(
        self,
        db: Database,
        settings: Settings,
        *,
        signal: Callable[[str], object] | None = None,
        signal_delivery: Callable[[str], object] | None = None,
        web: SlackWeb | None = None,
        max_chars: int = 100_000,
    ) -> None:
        self.db, self.settings = db, settings
        self.signal, self.signal_delivery = signal, signal_delivery
        self.web = web
        self.max_chars = max_chars
        self._names: dict[str, str] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._told: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._shares: FileShares | None = None
        # Messages whose files are being taken, by id (with how many takes wait on each): a
        # retry that comes while the first take still downloads waits for it, then finds the
        # message stored and downloads nothing.
        self._taking: dict[str, tuple[threading.Lock, int]] = {}

    # event ids: a retry of an event this process took is not taken again
    def seen(self, event_id: object) -> bool:
        """Whether the event ``event_id`` was taken already; anything but a string (the
        signed body says what it likes there) is an event never seen."""
        if not isinstance(event_id, str):
            return False
        with self._lock:
            return event_id in self._seen

    def _remember(self, event_id: str | None) -> None:
        if event_id is None:
            return
        with self._lock:
            self._seen[event_id] = None
            while len(self._seen) > _SEEN_EVENTS:
                self._seen.popitem(last=False)

    def _bot_user(self, callback: EventCallback) -> str | None:
        for auth in callback.authorizations:
            if auth.is_bot and auth.user_id:
                return auth.user_id
        if self.web is not None:
            try:
                return self.web.bot_user_id()
            except ChannelError as exc:
                log.warning("slack: could not ask who the bot is (%s)", exc)
        return None

    def sender_name(self, user: str) -> str:
        """A person's name as Slack shows it (users.info, remembered; the id without the Web API)."""
        if user in self._names:
            return self._names[user]
        name = user
        if self.web is not None:
            try:
                name = self.web.ask(UserInfo, "users.info", user=user).user.shown_name or user
            except ChannelError as exc:  # users:read missing, or Slack away: the id will do
                log.info("slack: no name for %s (%s)", user, exc)
        if len(self._names) >= _SEEN_EVENTS:
            self._names.clear()  # a workspace's people, asked again now and then: names change too
        self._names[user] = name.replace("\x00", "")[:200]
        return self._names[user]

    def readable(self, text: str, bot: str | None, trigger: str) -> str:
        """Slack's text as people read it, for the agent and the other channels: a mention of
        the bot is the trigger word, other mentions ``@name``, channels ``#name``, links
        ``label (url)``, ``<!here>`` ``@here``; then unescaped (``&lt;`` is ``<``)."""

        def entity(match: re.Match[str]) -> str:
            target, _, label = match.group(1).partition("|")
            if target.startswith("@"):
                user = target[1:]
                if bot is not None and user == bot:
                    return trigger
                return "@" + (label or (self.sender_name(user) if _USER.match(user) else user))
            if target.startswith("#"):
                return "#" + (label or target[1:])
            if target.startswith("!"):
                special = target[1:].split("^")[0]
                return "@" + special if special in _SPECIAL else label or special
            return f"{label} ({target})" if label and label != target else target

        return unescape(_ENTITY.sub(entity, text))

    def incoming(self, callback: EventCallback) -> IncomingMessage | None:
        """The message to store for ``callback`` (None: nothing of it is stored)."""
        event = callback.event
        if event.type not in ("message", "app_mention") or event.subtype not in TAKEN_SUBTYPES:
            return None
        if event.bot_id or not event.user or not _USER.match(event.user):
            return None  # a bot's message (ours among them), or no person behind it
        if not event.channel or not ADDRESS.match(event.channel) or not event.ts or not TS.match(event.ts):
            return None
        bot = self._bot_user(callback)
        if event.user == bot:
            return None  # our own bot user, whatever way it posted
        groups = attached_groups(self.db)
        chat_jid, assistant = groups.get(event.channel, (f"{UNATTACHED_PREFIX}{event.channel}", None))
        trigger = "@" + (assistant or self.settings.assistant_name)
        text = self.readable(event.text or "", bot, trigger).replace("\x00", "")[: self.max_chars]  # no NUL kept
        if not text.strip() and not event.files:
            return None
        meta: dict[str, Any] = {CHANNEL_KEY: event.channel, TS_KEY: event.ts}
        if event.thread_ts and TS.match(event.thread_ts):
            meta[THREAD_KEY] = event.thread_ts
        return IncomingMessage(
            chat_jid=chat_jid,
            sender=f"{SENDER_PREFIX}{event.user}",
            sender_name=self.sender_name(event.user),
            content=text,
            id=f"{ID_PREFIX}{event.channel}-{event.ts}",
            timestamp=datetime.fromtimestamp(float(event.ts), UTC).isoformat(),
            message_type="user",
            metadata=meta,
            channel=CHANNEL,
        )

    def take(self, document: Any) -> IngestResult | None:
        """Store what ``document`` (an ``event_callback``) carries; None when it carries nothing to store.
        Raises ``pydantic.ValidationError`` for a document that is no event callback."""
        callback = EventCallback.model_validate(document)
        if self.seen(callback.event_id):
            return None
        if callback.event.type == "message" and callback.event.subtype == EDITED_SUBTYPE:
            self._take_edit(callback)  # a person's edit of their message (slack_edits.py)
            self._remember(callback.event_id)
            return None
        incoming = self.incoming(callback)
        if incoming is None:
            self._remember(callback.event_id)
            return None
        files = callback.event.files or []
        stored: list[StoredFile] = []
        try:
            if files:
                assert incoming.id is not None  # incoming() names every message
                with self._taking_files(incoming.id):
                    incoming, stored = self._with_files(incoming, files)
                    result = ingest(
                        self.db, self.settings, incoming, signal=self.signal, signal_delivery=self.signal_delivery
                    )
            else:
                result = ingest(
                    self.db, self.settings, incoming, signal=self.signal, signal_delivery=self.signal_delivery
                )
        except RateLimited as exc:
            self._unused(stored)
            self._slow_down(callback.event, incoming, exc)
            result = None
        except UnregisteredChatsFull:
            result = None  # an unattached channel past the cap: dropped (ingest counted and logged it)
        except BaseException:
            self._unused(stored)
            raise
        if result is not None and not result.created:
            self._unused(stored)  # stored meanwhile by another process: its first copy stands
        self._remember(callback.event_id)  # only once stored: a failure is retried by Slack
        return result

    def _take_edit(self, callback: EventCallback) -> None:
        bot = self._bot_user(callback)
        take_slack_edit(
            self.db,
            self.settings,
            callback.event.channel,
            callback.event.message,
            readable=lambda text, trigger: self.readable(text, bot, trigger).replace("\x00", ""),
            max_chars=self.max_chars,
            signal_delivery=self.signal_delivery,
        )

    # -- files shared with a message --------------------------------------------------------

    @contextmanager
    def _taking_files(self, message_id: str) -> Iterator[None]:
        """One take of a message's files at a time (see ``_taking``)."""
        with self._lock:
            gate, waiting = self._taking.get(message_id, (threading.Lock(), 0))
            self._taking[message_id] = (gate, waiting + 1)
        try:
            with gate:
                yield
        finally:
            with self._lock:
                gate, waiting = self._taking[message_id]
                if waiting == 1:
                    del self._taking[message_id]
                else:
                    self._taking[message_id] = (gate, waiting - 1)

    def _with_files(self, incoming: IncomingMessage, files: list[Any]) -> tuple[IncomingMessage, list[StoredFile]]:
        """``incoming`` with the files it shares: downloaded into the store and named by a FILE
        envelope, each one not taken noted in its text; and the files stored.  Nothing is
        downloaded for a chat that is no registered group, for a message stored already (a
        retry), or for a sender over the rate (:class:`RateLimited`, as ingest would refuse
        the message itself)."""
        assert incoming.id is not None
        if not is_registered(self.db, incoming.chat_jid):
            why = "this Slack channel is no registered group's"
            intake = Intake(notes=[not_taken(f"{len(files)} shared file(s)", why)])
        elif self._stored_already(incoming.chat_jid, incoming.id):
            return incoming, []  # ingest answers it as the duplicate it is
        else:
            self._check_rate(incoming)
            intake = self._file_shares().take(incoming.chat_jid, files)
        content = "\n".join(part for part in (incoming.content, *intake.notes) if part.strip())
        metadata = file_envelope(intake.stored, extras=incoming.metadata) if intake.stored else incoming.metadata
        return incoming.model_copy(update={"content": content, "metadata": metadata}), intake.stored

    def _unused(self, stored: list[StoredFile]) -> None:
        """Take back files whose message was not stored with them: no message would ever
        name them, and they would count against the group's limit."""
        if stored:
            self._file_shares().store.discard(stored)

    def _file_shares(self) -> FileShares:
        with self._lock:
            if self._shares is None:
                self._shares = FileShares(self.db, self.settings)
            return self._shares

    def _stored_already(self, chat_jid: str, message_id: str) -> bool:
        try:
            resolve_message(chat_jid, message_id, db=self.db)
        except MessageNotFound:
            return False
        return True

    def _check_rate(self, incoming: IncomingMessage) -> None:
        """Raise :class:`RateLimited` for a sender that ingest would refuse now, before any
        file of theirs is downloaded (ingest decides again when it stores the message)."""
        rate = self.settings.quotas.sender_messages_per_minute
        if not rate:
            return
        assert incoming.id is not None
        with self.db.engine.connect() as conn:
            wait = sender_retry_after(
                conn, self.db, chat_jid=incoming.chat_jid, sender=incoming.sender, message_id=incoming.id, limit=rate
            )
        if wait is not None:
            raise RateLimited(incoming.sender, rate, wait)

    def _slow_down(self, event: SlackEvent, incoming: IncomingMessage, exc: RateLimited) -> None:
        """A sender over its rate: dropped, not stored; told once per wait (only they see it)."""
        key = (incoming.chat_jid, incoming.sender)
        now = time.monotonic()
        log.info(
            "slack: %s in %s is over the rate limit; message %s not stored (retry in %d s)",
            incoming.sender,
            incoming.chat_jid,
            incoming.id,
            exc.retry_after_s,
        )
        with self._lock:
            if self._told.get(key, 0.0) > now:
                return
            self._told = {k: until for k, until in self._told.items() if until > now}
            self._told[key] = now + exc.retry_after_s
        if self.web is None:
            return
        try:
            self.web.call(
                "chat.postEphemeral",
                channel=event.channel,
                user=event.user,
                thread_ts=event.thread_ts,
                text=escape(f"⏳ slow down: try again in {exc.retry_after_s} s (this message was not taken)"),
            )
        except ChannelError as err:  # a courtesy: taking messages goes on
            log.warning("slack: could not tell %s to slow down: %s", incoming.sender, err)


# -- the Events API (its route: orchestrator/http/routes/slack.py) -------------------------


_KNOWN_TYPES = ["url_verification", "event_callback"]


def events_schema() -> dict[str, Any]:
    """The request body as the document states it: the two documents read, or any other
    typed one (answered 200 and left alone)."""
    callback = EventCallback.model_json_schema()
    callback["title"] = "SlackEventCallback"
    verification = UrlVerification.model_json_schema()
    verification["title"] = "SlackUrlVerification"
    other = {
        "title": "SlackOtherDocument",
        "type": "object",
        "required": ["type"],
        "properties": {"type": {"type": "string", "not": {"enum": _KNOWN_TYPES}}},
    }
    doc = json.loads(json.dumps({"anyOf": [verification, callback, other]}))
    # The models' own definitions, inlined: the document's schemas stay the API's.
    defs = doc["anyOf"][1].pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return dict(inline(doc))


def read_document(body: bytes) -> UrlVerification | dict[str, Any] | None:
    """What a verified Events API body is: a ``url_verification`` (answered with its
    challenge), an ``event_callback`` document (for :meth:`SlackEvents.take`), or None:
    another typed document (``app_rate_limited`` and the like), nothing to do.  Raises
    :class:`InvalidMessage` for a body that is no Slack document."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise InvalidMessage("the body is not JSON") from None
    kind = doc.get("type") if isinstance(doc, dict) else None
    if kind == "url_verification":
        try:
            return UrlVerification.model_validate(doc)
        except ValidationError as exc:
            raise InvalidMessage(f"url_verification: {exc.errors()[0]['msg']}") from None
    if kind != "event_callback":
        if not isinstance(kind, str):
            raise InvalidMessage("the body is not a Slack event document (no type)")
        return None
    assert isinstance(doc, dict)  # a "type" was read from it
    return doc


class SlackEvents(InboundDoor):
    """The Events API's side of the channel: whether it is on, the request's signature,
    and the :class:`SlackInbound` that takes its events, made on first use (the bot token,
    for names, is optional, and slack_sdk too until then)."""

    def _open(self) -> None:
        self._secret = self.settings.slack.signing_secret
        self.off = "" if self._secret else "the Slack Events API is off (set ORCHESTRATOR_SLACK_SIGNING_SECRET)"
        self._inbound: SlackInbound | None = None
        self._lock = threading.Lock()

    def signed(self, timestamp: str, body: bytes, signature: str | None) -> bool:
        """The request's v0 signature is Slack's over ``timestamp`` and ``body`` (constant time)."""
        return verify(self._secret, timestamp, body, signature)

    def inbound(self) -> SlackInbound:
        with self._lock:
            if self._inbound is None:
                web = None
                if self.settings.slack.bot_token:
                    try:
                        web = SlackWeb(self.settings)
                    except ChannelError as exc:
                        log.warning("slack: no Web API for names and our bot's id (%s)", exc)
                self._inbound = SlackInbound(
                    self.db,
                    self.settings,
                    signal=self.signal,
                    signal_delivery=self.signal_delivery,
                    web=web,
                    max_chars=self.max_chars,
                )
            return self._inbound

    def take(self, document: dict[str, Any]) -> IngestResult | None:
        """:meth:`SlackInbound.take`, a document that is no event callback refused with
        :class:`InvalidMessage` naming where.  Blocks on the store: call it off the event loop."""
        try:
            return self.inbound().take(document)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise InvalidMessage(f"{where}: {err['msg']}") from exc
