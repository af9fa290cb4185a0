"""Webhooks: messages in over signed HTTP, messages out to HTTP endpoints.

* **Inbound**: ``POST /webhooks/inbound`` takes the same JSON body as
  ``POST /api/messages``, signed with HMAC-SHA256 over the raw body with
  ``ORCHESTRATOR_WEBHOOK_SECRET``, in ``X-Orchestrator-Signature:
  sha256=<hex>``.  A missing or wrong signature is a 401 and nothing is
  stored; so is a sender over ``ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE``
  (429 with ``Retry-After``).  The signature replaces the bearer token for this one route (the
  sender is another system that holds the shared secret).
* **Outbound**: the built-in ``webhook`` channel POSTs each delivered
  message as JSON to the attached address (``orchestrator groups attach JID
  webhook --address https://...``), signed the same way, so the receiver
  can check it came from us.  A non-2xx answer or a connection error is a
  failed send: the deliveries table retries it with backoff.  Every POST
  carries the delivery's id in ``X-Orchestrator-Delivery`` (and the body's
  ``message.delivery_id``), the same on every attempt: a send cut short by a
  deliverer's death is sent again with it, so a receiver that keeps the ids
  it has seen gets each message exactly once.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from orchestrator.channels.base import BaseChannel
from orchestrator.core.errors import ChannelError, OrchestratorError, RateLimited
from orchestrator.core.settings import Settings
from orchestrator.model.render import RenderedMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.db import Database

SIGNATURE_HEADER = "X-Orchestrator-Signature"
DELIVERY_HEADER = "X-Orchestrator-Delivery"
INBOUND_PATH = "/webhooks/inbound"
CHANNEL = "webhook"


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """Constant-time check of ``header`` against the body's signature."""
    return bool(secret) and header is not None and hmac.compare_digest(sign(secret, body), header.strip())


class WebhookChannel(BaseChannel):
    """POSTs each delivered message to an http(s) URL (the attachment's address)."""

    name = CHANNEL
    resend_after_crash = True  # the receiver deduplicates by DELIVERY_HEADER

    def __init__(self, settings: Settings, client: httpx.Client | None = None) -> None:
        self._secret = settings.webhook_secret
        self._client = client or httpx.Client(timeout=settings.webhook_timeout_s)

    def owns(self, address: str) -> bool:
        parts = urlsplit(address)
        return parts.scheme in ("http", "https") and bool(parts.hostname)

    def send(self, address: str, rendered: RenderedMessage) -> None:
        if not self.owns(address):
            raise ChannelError(f"the webhook channel needs an http(s) URL as its address, not {address!r}")
        body = json.dumps({"event": "message", "message": rendered.model_dump(mode="json")},
                          ensure_ascii=False).encode()
        headers = {"content-type": "application/json"}
        if self._secret:
            headers[SIGNATURE_HEADER] = sign(self._secret, body)
        if rendered.delivery_id:
            headers[DELIVERY_HEADER] = rendered.delivery_id
        try:
            resp = self._client.post(address, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ChannelError(f"webhook {address} unreachable: {exc}") from exc
        if resp.status_code >= 300:
            raise ChannelError(f"webhook {address} answered {resp.status_code}: {resp.text[:200]}")

    def disconnect(self) -> None:
        self._client.close()


def add_inbound_route(
    api: FastAPI, db: Database, settings: Settings, *, signal: Callable[[str], object],
    signal_delivery: Callable[[str], object] | None, max_chars: int,
) -> None:
    # The body is read raw (the signature covers its bytes), so the document is told what it is:
    # the body of POST /api/messages (that route puts IncomingMessage in the components).
    @api.post(INBOUND_PATH, status_code=201, tags=["webhooks"], openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IncomingMessage"}}},
    }}, responses={
        201: {"description": "stored, as POST /api/messages answers",
              "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PostedMessage"}}}},
        400: {"description": "the body is not a valid message; `field` names the offending one"},
        401: {"description": f"missing or wrong {SIGNATURE_HEADER}"},
        404: {"description": "inbound webhooks are off (no ORCHESTRATOR_WEBHOOK_SECRET)"},
        413: {"description": "content too long"},
        429: {"description": "the sender is over ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE; nothing was stored",
              "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}},
    })
    async def inbound(request: Request) -> JSONResponse:
        """A message from another system, signed with the shared webhook secret."""
        if not settings.webhook_secret:
            return JSONResponse({"detail": "inbound webhooks are off (set ORCHESTRATOR_WEBHOOK_SECRET)"}, 404)
        body = await request.body()
        if not verify(settings.webhook_secret, body, request.headers.get(SIGNATURE_HEADER)):
            return JSONResponse({"detail": f"missing or wrong {SIGNATURE_HEADER}"}, 401)
        try:
            doc = json.loads(body)
            if isinstance(doc, dict):
                doc.setdefault("channel", CHANNEL)
            incoming = IncomingMessage.model_validate(doc)
        except ValueError as exc:  # JSONDecodeError and ValidationError both
            err = exc.errors()[0] if isinstance(exc, ValidationError) else None
            field = ".".join(str(p) for p in err["loc"]) if err else "body"
            return JSONResponse({"detail": f"{field}: {err['msg'] if err else exc}", "field": field}, 400)
        if len(incoming.content) > max_chars:
            return JSONResponse({"detail": f"content is longer than {max_chars} characters"}, 413)
        try:
            result = ingest(db, settings, incoming, signal=signal, signal_delivery=signal_delivery)
        except RateLimited as exc:  # the sender is over ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE
            return JSONResponse({"detail": str(exc), "retry_after_s": exc.retry_after_s}, 429,
                                headers={"Retry-After": str(exc.retry_after_s)})
        except OrchestratorError as exc:
            bad_field = getattr(exc, "field", None)
            return JSONResponse({"detail": str(exc), **({"field": bad_field} if bad_field else {})}, 400)
        return JSONResponse(
            {"message": result.message.model_dump(mode="json"), "created": result.created,
             "triggered": result.triggered},
            201,
        )
