"""``POST /webhooks/inbound``: a person's message from another system, signed with
``ORCHESTRATOR_WEBHOOK_INBOUND_SECRET`` over timestamp, nonce and body.

The channel's side (the secret, the checks, the message and its taking) is
``orchestrator/channels/webhook.py``; this route reads the request in the order that
keeps an unsigned sender cheap (the headers, then the body, then its signature) and
answers each refusal.  It needs no bearer token and no ``X-Orchestrator-Client``
(the request guard exempts it): its signature is its credential.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from orchestrator.channels.webhook import (
    INBOUND_PATH,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    inbound_refusal,
    inbound_schema,
    read_inbound,
)
from orchestrator.core.errors import BadInput
from orchestrator.http.routes.messages import require_registered
from orchestrator.http.state import ApiState, api_state
from orchestrator.run.ingest import IncomingMessage, IngestResult

router = APIRouter()


# The body is read raw (the signature covers its bytes), so the document is told what it is.
@router.post(
    INBOUND_PATH,
    status_code=201,
    tags=["webhooks"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inbound_schema()}},
        }
    },
    responses={
        201: {
            "description": "stored, as POST /api/messages answers (a replay inside the window: "
            "the message it replays, `created: false`)",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PostedMessage"}}},
        },
        400: {
            "description": "the body is not a valid message, or one another system may not send (not a "
            "person's `user` message, a harness sender, `is_from_me`, another channel); "
            "`field` names the offending one"
        },
        401: {
            "description": f"missing or wrong {SIGNATURE_HEADER}, {TIMESTAMP_HEADER} outside the window, "
            f"or a malformed {NONCE_HEADER}"
        },
        404: {
            "description": "inbound webhooks are off (no ORCHESTRATOR_WEBHOOK_INBOUND_SECRET), or the chat "
            "is not a registered group (when registration is required; else: a new chat past "
            "ORCHESTRATOR_UNREGISTERED_CHATS); nothing was stored"
        },
        413: {"description": "content too long"},
        429: {
            "description": "the sender is over ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE; nothing was stored",
            "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
        },
    },
)
async def inbound(request: Request) -> JSONResponse:
    """A person's message from another system, signed with ORCHESTRATOR_WEBHOOK_INBOUND_SECRET
    over timestamp, nonce and body (see orchestrator/channels/webhook.py)."""
    state = api_state(request)
    hook = state.webhook
    if hook.off:
        return JSONResponse({"detail": hook.off}, 404)
    timestamp, nonce = request.headers.get(TIMESTAMP_HEADER), request.headers.get(NONCE_HEADER)
    problem = hook.header_refusal(timestamp, nonce, time.time())
    if problem or timestamp is None or nonce is None:  # checked on the headers, before the body is read
        return JSONResponse({"detail": problem}, 401)
    body = await request.body()
    if not hook.signed(timestamp, nonce, body, request.headers.get(SIGNATURE_HEADER)):
        return JSONResponse({"detail": f"missing or wrong {SIGNATURE_HEADER}"}, 401)
    incoming = read_inbound(body)
    if isinstance(incoming, tuple):
        raise BadInput(*incoming)
    refused = inbound_refusal(incoming)
    if refused:
        raise BadInput(*refused)
    too_long = hook.too_long(incoming)
    if too_long:
        return JSONResponse({"detail": too_long}, 413)
    # What ingest refuses (a sender over its rate, an unregistered chat past the cap, bad
    # metadata) is answered by the exception handlers (orchestrator/http/errors.py).  The
    # database's work waits in the thread pool, never on the event loop that serves the rest.
    result = await run_in_threadpool(_take, state, incoming, nonce)
    return JSONResponse(
        {
            "message": result.message.model_dump(mode="json"),
            "created": result.created,
            "triggered": result.triggered,
        },
        201,
    )


def _take(state: ApiState, incoming: IncomingMessage, nonce: str) -> IngestResult:
    # As POST /api/messages answers (the same body): a message no agent will ever see is not stored.
    require_registered(state.db, state.settings, incoming.chat_jid)
    return state.webhook.take(incoming, nonce)
