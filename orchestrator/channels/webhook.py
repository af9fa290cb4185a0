"""Webhooks: messages in over signed HTTP, messages out to HTTP endpoints.

* **Inbound**: ``POST /webhooks/inbound`` takes the body of ``POST
  /api/messages`` for a person's message (see :func:`inbound_refusal`), with
  ``X-Orchestrator-Timestamp`` (Unix seconds), ``X-Orchestrator-Nonce`` (16-128
  letters, digits, ``-`` or ``_``, new for every message) and
  ``X-Orchestrator-Signature: sha256=<hex>``, the HMAC-SHA256 of
  ``<timestamp>.<nonce>.<raw body>`` with ``ORCHESTRATOR_WEBHOOK_INBOUND_SECRET``
  (:func:`sign_inbound`).  The signature replaces the bearer token for this one
  route (the sender is another system that holds the secret); a missing or
  wrong one, or a timestamp further than ``ORCHESTRATOR_WEBHOOK_INBOUND_WINDOW_S``
  from this host's clock, is a 401 and nothing is stored.  Replays: past the
  window, refused; inside it, the nonce is the message's id (unless the body
  names one), so the replay is the duplicate of the message it replays, stored
  once (201, ``created: false``), as a sender's own retry is.  The secret is
  not the outbound one: every receiver of our deliveries holds that one, and
  could otherwise post as anyone.  The body's ``sender`` is stored as
  ``webhook:<sender>`` (:data:`SENDER_PREFIX`; kept as it is when it has the prefix): a
  namespace of its own, so a webhook never speaks as ``operator`` (the API's and the
  command line's token holder, who answers questions whatever the group's approvers) nor
  as another channel's person (``slack:U…``, ``tg:…``); a group lets a webhook sender
  answer its questions by naming ``webhook:<sender>`` among its approvers.  A sender over
  ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE`` is a 429 with ``Retry-After``.
  The chat must be a registered group, as for ``POST /api/messages`` (the same
  body, the same rule): else a 404 and nothing is stored.  With
  ``ORCHESTRATOR_API_REQUIRE_REGISTERED_CHAT=false`` any chat is taken, within
  ingest's bounds on unregistered chats (``ORCHESTRATOR_UNREGISTERED_CHATS``,
  ``ORCHESTRATOR_UNREGISTERED_CHAT_MESSAGES``); a new chat past them is a 404 too.
  The HTTP API mounts the route (``orchestrator/http/routes/webhooks.py``); its
  checks and the taking of the message are here (:class:`InboundWebhook`,
  :func:`read_inbound`, :func:`inbound_refusal`).
* **Outbound**: the built-in ``webhook`` channel POSTs each delivered
  message as JSON to the attached address (``orchestrator groups attach JID
  webhook --address https://...``), signed with ``ORCHESTRATOR_WEBHOOK_SECRET``
  (:func:`sign`, over the raw body), so the receiver
  can check it came from us.  Each attempt also carries the time it was sent,
  ``X-Orchestrator-Timestamp`` (Unix seconds), and
  ``X-Orchestrator-Timestamped-Signature: sha256=<hex>``, the HMAC-SHA256 of
  ``<timestamp>.<raw body>`` (:func:`sign_timestamped`): a receiver that checks it
  within a window (:func:`verify_delivery`) refuses a captured delivery replayed
  later, even once it has forgotten the delivery's id.  A non-2xx answer or a
  connection error is a failed send: the deliveries table retries it with
  backoff (each attempt with its own time).  Every POST carries the delivery's
  id in ``X-Orchestrator-Delivery`` (and the body's ``message.delivery_id``), the
  same on every attempt: a send cut short by a deliverer's death is sent again
  with it, so a receiver that keeps the ids it has seen gets each message
  exactly once.  A message that carries files (a FILE envelope) names them in
  ``message.files``, each by its id with its name, type and size
  (``{"id", "name", "mime", "size"}``), and, with ``ORCHESTRATOR_PUBLIC_BASE_URL`` set, a
  signed ``url`` that fetches it without a token until it expires
  (``orchestrator/core/file_links.py``); the payload holds no file's bytes.  A
  question the agent asks (an APPROVAL envelope) is in ``message.question``:
  ``{"id", "question", "options", "multiple", "allow_other"}``, answered with
  ``POST /api/chats/{chat_jid}/questions/{id}/answer``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import secrets
import time
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from agent_runner.protocol import Reaction
from orchestrator.channels.base import BaseChannel, InboundDoor
from orchestrator.channels.question_buttons import approval_of
from orchestrator.core.errors import ChannelError
from orchestrator.core.file_links import file_link
from orchestrator.core.settings import Settings
from orchestrator.model.envelopes import files_of
from orchestrator.model.messages import HARNESS_SENDER_TYPES, NEVER_STORED_SENDERS, SENDER_SCHEDULER
from orchestrator.model.render import RenderedMessage
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Orchestrator-Signature"
TIMESTAMP_HEADER = "X-Orchestrator-Timestamp"
NONCE_HEADER = "X-Orchestrator-Nonce"
DELIVERY_HEADER = "X-Orchestrator-Delivery"
TIMESTAMPED_SIGNATURE_HEADER = "X-Orchestrator-Timestamped-Signature"
UPDATED_EVENT, RETRACTED_EVENT, REACTION_EVENT = "message.updated", "message.retracted", "message.reaction"
INBOUND_PATH = "/webhooks/inbound"
CHANNEL = "webhook"
NONCE_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")
_SECONDS = re.compile(r"[0-9]{1,12}")
# The id of a message whose body names none: its nonce's (see the module's doc).
NONCE_ID_PREFIX = "webhook-"
# Inbound senders' namespace (see the module's doc).
SENDER_PREFIX = "webhook:"
# Senders only the harness writes as (the bot, the host, tools, the scheduler...): a webhook
# naming one would put words in the agent's or the system's mouth.
HARNESS_SENDERS = frozenset({*HARNESS_SENDER_TYPES, SENDER_SCHEDULER, *NEVER_STORED_SENDERS})


def sign(secret: str, body: bytes) -> str:
    """The outbound signature: HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Constant-time check of ``header`` against the body's signature."""
    return bool(secret) and header is not None and hmac.compare_digest(sign(secret, body), header.strip())


def sign_timestamped(secret: str, timestamp: str, body: bytes) -> str:
    """The outbound signature over the send's time too: HMAC-SHA256 of ``<timestamp>.<raw body>``."""
    return sign(secret, f"{timestamp}.".encode() + body)


def verify_delivery(
    secret: str, body: bytes, timestamp: str | None, signature: str | None, *, now: float, window_s: float = 300.0
) -> bool:
    """What a receiver of our deliveries checks (in Python; the same in any language): the
    timestamped signature is ours over this body and this time, and the time is within
    ``window_s`` of the receiver's ``now``, so a captured delivery replayed later is refused."""
    if not secret or timestamp is None or signature is None or not _SECONDS.fullmatch(timestamp.strip()):
        return False
    if abs(now - int(timestamp)) > window_s:
        return False
    return hmac.compare_digest(sign_timestamped(secret, timestamp.strip(), body), signature.strip())


def sign_inbound(secret: str, timestamp: str, nonce: str, body: bytes) -> str:
    """The inbound signature: HMAC-SHA256 of ``<timestamp>.<nonce>.<raw body>``, so neither
    the time nor the nonce can be changed on a captured request."""
    return sign(secret, f"{timestamp}.{nonce}.".encode() + body)


def inbound_headers(
    secret: str, body: bytes, *, timestamp: float | None = None, nonce: str | None = None
) -> dict[str, str]:
    """The headers a sender puts on ``body`` (now, and a fresh nonce, unless given)."""
    stamp = str(int(time.time() if timestamp is None else timestamp))
    nonce = nonce or secrets.token_urlsafe(24)
    return {TIMESTAMP_HEADER: stamp, NONCE_HEADER: nonce, SIGNATURE_HEADER: sign_inbound(secret, stamp, nonce, body)}


def header_refusal(settings: Settings, timestamp: str | None, nonce: str | None, now: float) -> str | None:
    """Why an inbound request's timestamp or nonce is refused before its body is read (None: it is not)."""
    if timestamp is None or nonce is None:
        return f"an inbound webhook needs {TIMESTAMP_HEADER}, {NONCE_HEADER} and {SIGNATURE_HEADER}"
    if not _SECONDS.fullmatch(timestamp.strip()):  # ASCII digits only ("²" is a digit to str.isdigit)
        return f"{TIMESTAMP_HEADER} must be whole Unix seconds"
    if abs(now - int(timestamp)) > settings.webhook.inbound_window_s:
        return (
            f"{TIMESTAMP_HEADER} is more than {settings.webhook.inbound_window_s:g} s from this server's clock "
            "(a replay, or a sender's clock that is off; ORCHESTRATOR_WEBHOOK_INBOUND_WINDOW_S)"
        )
    if not NONCE_PATTERN.fullmatch(nonce):
        return f"{NONCE_HEADER} must be 16-128 letters, digits, '-' or '_'"
    return None


def inbound_refusal(incoming: IncomingMessage) -> tuple[str, str] | None:
    """The field and the reason an inbound message may not be stored as it is (None: it may).

    Another system speaks for people only: a ``user`` message from a sender that is not
    one of the harness's own, not marked as ours (which no rate limit counts), and on
    this channel (the one it is not mirrored back to)."""
    if incoming.message_type != "user":
        return "message_type", f"an inbound webhook stores people's messages (user), not {incoming.message_type!r}"
    if incoming.sender in HARNESS_SENDERS:
        return "sender", f"sender {incoming.sender!r} is the harness's own; an inbound webhook speaks for people"
    if incoming.is_from_me:
        return "is_from_me", "an inbound webhook's message is never the installation's own"
    if incoming.channel not in (None, CHANNEL):
        return "channel", f"an inbound webhook's message arrives on the {CHANNEL!r} channel"
    return None


def webhook_sender(sender: str) -> str:
    """The sender an inbound message is stored as: ``sender`` in the webhook's namespace."""
    return sender if sender.startswith(SENDER_PREFIX) else SENDER_PREFIX + sender


def inbound_schema() -> dict[str, object]:
    """The request body as the document states it: ``IncomingMessage``, held to what
    :func:`inbound_refusal` lets through (written in place, the document's own)."""
    schema = json.loads(json.dumps(IncomingMessage.model_json_schema()))
    props = schema["properties"]
    props["message_type"] = {"enum": ["user"], "default": "user", "type": "string", "title": "Message Type"}
    props["is_from_me"] = {"enum": [False], "default": False, "type": "boolean", "title": "Is From Me"}
    props["sender"]["not"] = {"enum": sorted(HARNESS_SENDERS)}
    props["channel"] = {
        "anyOf": [{"enum": [CHANNEL], "type": "string"}, {"type": "null"}],
        "default": None,
        "title": "Channel",
    }
    schema["title"] = "InboundMessage"
    return dict(schema)


class WebhookChannel(BaseChannel):
    """POSTs each delivered message to an http(s) URL (the attachment's address)."""

    name = CHANNEL
    resend_after_crash = True  # the receiver deduplicates by DELIVERY_HEADER

    def __init__(self, settings: Settings, client: httpx.Client | None = None) -> None:
        self._settings = settings
        self._secret = settings.webhook.secret
        self._client = client or httpx.Client(timeout=settings.webhook.timeout_s)

    def owns(self, address: str) -> bool:
        parts = urlsplit(address)
        return parts.scheme in ("http", "https") and bool(parts.hostname)

    def send(self, address: str, rendered: RenderedMessage) -> list[str]:
        message = _payload(rendered, self._settings, time.time())
        self._post(address, {"event": "message", "message": message}, rendered.delivery_id)
        return [rendered.delivery_id] if rendered.delivery_id else []

    def edit(self, address: str, posted: list[str], rendered: RenderedMessage) -> list[str]:
        """``message.updated``: the message as it is now, under the delivery id it was sent with."""
        message = _payload(rendered, self._settings, time.time()) | {"delivery_id": _sent_as(posted)}
        self._post(address, _change_event(UPDATED_EVENT, rendered, message), rendered.delivery_id)
        return posted

    def retract(self, address: str, posted: list[str], rendered: RenderedMessage) -> None:
        """``message.retracted``: which message, by the delivery id it was sent with."""
        self._post(address, _change_event(RETRACTED_EVENT, rendered, _which(rendered, posted)), rendered.delivery_id)

    def react(self, address: str, posted: list[str], rendered: RenderedMessage, reaction: Reaction) -> bool:
        """``message.reaction``: the emoji, and which message, by the delivery id it was sent with."""
        doc = _change_event(REACTION_EVENT, rendered, _which(rendered, posted)) | {"emoji": reaction.emoji}
        self._post(address, doc, rendered.delivery_id)
        return True

    def _post(self, address: str, doc: dict[str, object], delivery_id: str | None) -> None:
        """POST ``doc`` signed, with ``delivery_id`` in :data:`DELIVERY_HEADER`; raise on failure."""
        if not self.owns(address):
            raise ChannelError(f"the webhook channel needs an http(s) URL as its address, not {address!r}")
        body = json.dumps(doc, ensure_ascii=False).encode()
        headers = {"content-type": "application/json"}
        if self._secret:
            # The body's signature (receivers written before the timestamp keep working), and
            # the one over this attempt's time and the body (replays past a window refused).
            stamp = str(int(time.time()))
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
            headers[TIMESTAMP_HEADER] = stamp
            headers[TIMESTAMPED_SIGNATURE_HEADER] = sign_timestamped(self._secret, stamp, body)
        if delivery_id:
            headers[DELIVERY_HEADER] = delivery_id
        try:
            resp = self._client.post(address, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ChannelError(f"webhook {address} unreachable: {exc}") from exc
        if resp.status_code >= 300:
            raise ChannelError(f"webhook {address} answered {resp.status_code}: {resp.text[:200]}")

    def disconnect(self) -> None:
        self._client.close()


def _sent_as(posted: list[str]) -> str | None:
    """The delivery id a message was sent with (what its receiver knows it by)."""
    return posted[0] if posted else None


def _which(rendered: RenderedMessage, posted: list[str]) -> dict[str, object]:
    """Which message a change is of: by the delivery id it was sent with, and its place."""
    return {"delivery_id": _sent_as(posted), "chat_jid": rendered.chat_jid, "seq": rendered.seq, "id": rendered.id}


def _change_event(event: str, rendered: RenderedMessage, message: dict[str, object]) -> dict[str, object]:
    """A change's body: the event, its own delivery id (the header's: what a receiver
    deduplicates the change by), and the message it changes."""
    return {"event": event, "delivery_id": rendered.delivery_id, "message": message}


def _payload(rendered: RenderedMessage, settings: Settings, now: float) -> dict[str, object]:
    """The body's ``message``: the rendered message, the files it carries, by id (with a
    signed link each when links are on), and the question it asks."""
    message: dict[str, object] = rendered.model_dump(mode="json")
    files = files_of(rendered.metadata)
    if files is not None:
        message["files"] = [
            {"id": f.id, "name": f.name, "mime": f.mime, "size": f.size}
            | ({"url": url} if (url := file_link(settings, rendered.chat_jid, f.id, now)) else {})
            for f in files.files
        ]
    asked = approval_of(rendered.metadata)
    if asked is not None:
        message["question"] = {
            "id": asked.question_id,
            "question": asked.question,
            "options": list(asked.options),
            "multiple": asked.multiple,
            "allow_other": asked.allow_other,
        }
    return message


class InboundWebhook(InboundDoor):
    """The inbound webhook's side of the channel (see the module's doc): whether it is on,
    the checks of a request's headers and signature, the message its body carries, and
    taking that message in.  The HTTP route (``orchestrator/http/routes/webhooks.py``)
    calls these in order and answers for each refusal."""

    def _open(self) -> None:
        self._secret = self.settings.webhook.inbound_secret
        self.off = _off_reason(self.settings)

    def header_refusal(self, timestamp: str | None, nonce: str | None, now: float) -> str | None:
        """Why a request's timestamp or nonce is refused, before its body is read (None: it is not)."""
        return header_refusal(self.settings, timestamp, nonce, now)

    def signed(self, timestamp: str, nonce: str, body: bytes, signature: str | None) -> bool:
        """The request's signature is ours over ``<timestamp>.<nonce>.<body>`` (constant time)."""
        return (
            bool(self._secret)
            and signature is not None
            and hmac.compare_digest(sign_inbound(self._secret, timestamp.strip(), nonce, body), signature.strip())
        )

    def too_long(self, incoming: IncomingMessage) -> str | None:
        """Why ``incoming``'s content is refused for its length (None: it is not)."""
        if len(incoming.content) > self.max_chars:
            return f"content is longer than {self.max_chars} characters"
        return None

    def take(self, incoming: IncomingMessage, nonce: str) -> IngestResult:
        """Store ``incoming`` as this channel's, from a sender in its namespace, its id the
        nonce's unless the body names one (a replay inside the window is the duplicate of what
        it replays).  Raises what ingest raises: ``RateLimited``, ``UnknownGroup`` (an
        unregistered chat past ORCHESTRATOR_UNREGISTERED_CHATS), ``InvalidMessage``."""
        incoming = incoming.model_copy(
            update={
                "channel": CHANNEL,
                "id": incoming.id or NONCE_ID_PREFIX + nonce,
                "sender": webhook_sender(incoming.sender),
            }
        )
        return ingest(self.db, self.settings, incoming, signal=self.signal, signal_delivery=self.signal_delivery)


def read_inbound(body: bytes) -> IncomingMessage | tuple[str, str]:
    """The message an inbound body carries, or the field at fault and why (the body is no
    JSON, or not a message: the first error pydantic names)."""
    try:
        return IncomingMessage.model_validate(json.loads(body))
    except ValueError as exc:  # JSONDecodeError and ValidationError both
        err = exc.errors()[0] if isinstance(exc, ValidationError) else None
        field = ".".join(str(p) for p in err["loc"]) if err else "body"
        return field, f"{field}: {err['msg'] if err else exc}"


def _off_reason(settings: Settings) -> str:
    """Why inbound webhooks are off ("": they are on); said in the log at start when a setting
    that used to turn them on is all there is."""
    if settings.webhook.inbound_secret:
        return ""
    if settings.webhook.secret:
        # The old configuration signed inbound webhooks with the outbound secret.  Taking it for
        # inbound still would keep the hole open (every receiver holds it), and a silent 404 would
        # leave its senders guessing: refused, said at start and in every answer.
        off = (
            "inbound webhooks are off: ORCHESTRATOR_WEBHOOK_SECRET signs outbound webhooks only; "
            "give inbound ones a secret of their own, ORCHESTRATOR_WEBHOOK_INBOUND_SECRET, and have "
            f"senders sign {TIMESTAMP_HEADER}.{NONCE_HEADER}.body with it"
        )
        log.warning("%s", off)
        return off
    return "inbound webhooks are off (set ORCHESTRATOR_WEBHOOK_INBOUND_SECRET)"
