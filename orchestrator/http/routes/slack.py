"""``POST /slack/events``: Slack's Events API, and ``POST /slack/interactions``: its
interactivity (a click on a question's button), requests signed with
``ORCHESTRATOR_SLACK_SIGNING_SECRET``.

The channel's side (the signature, the documents, taking an event in) is
``orchestrator/channels/slack_inbound.py``; this route checks the timestamp on the
headers before it reads the body, then the signature, and answers: the
``url_verification`` challenge, 200 for anything verified and understood (an
event that stores nothing too, so Slack does not retry it), and a retry
(``X-Slack-Retry-Num``) of an event this process took without doing it again.
Like the inbound webhook it needs no bearer token (the request guard exempts it).

An interactivity request is a form with one field, ``payload``, a JSON document; its
timestamp and signature are checked as an event's are, then the document goes to
``orchestrator/channels/slack_clicks.py``.  Everything verified is answered 200 with an
empty body (a refused click is told to the clicker on Slack, not by the status).
"""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qs

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from orchestrator.channels.slack_clicks import INTERACTIONS_PATH, take_interaction
from orchestrator.channels.slack_inbound import (
    EVENTS_PATH,
    RETRY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WINDOW_S,
    UrlVerification,
    events_schema,
    read_document,
    timestamp_refusal,
)
from orchestrator.core.errors import InvalidMessage
from orchestrator.http.state import api_state

router = APIRouter()

_UNSIGNED = {
    "description": f"missing or wrong {SIGNATURE_HEADER}, or {TIMESTAMP_HEADER} more than "
    f"{WINDOW_S} s from the server's clock"
}


async def _signed_body(request: Request) -> bytes | JSONResponse:
    """The body of a request Slack signed, or the answer that refuses it: 404 while Slack's
    requests are off, 401 for a timestamp out of the window (read on the headers, before the
    body) or a signature that is not Slack's over the timestamp and the body."""
    slack = api_state(request).slack
    if slack.off:
        return JSONResponse({"detail": slack.off}, 404)
    timestamp = request.headers.get(TIMESTAMP_HEADER)
    problem = timestamp_refusal(timestamp, time.time())
    if problem or timestamp is None:
        return JSONResponse({"detail": problem}, 401)
    body = await request.body()
    if not slack.signed(timestamp, body, request.headers.get(SIGNATURE_HEADER)):
        return JSONResponse({"detail": f"missing or wrong {SIGNATURE_HEADER}"}, 401)
    return body


@router.post(
    EVENTS_PATH,
    tags=["slack"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": events_schema()}},
        }
    },
    responses={
        200: {
            "description": "verified and taken (an event that stores nothing too); a `url_verification` "
            "is answered with its `challenge`",
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {"ok": {"type": "boolean"}, "challenge": {"type": "string"}},
                    }
                }
            },
        },
        400: {"description": "the body is not a Slack event document"},
        401: _UNSIGNED,
        404: {"description": "the Slack Events API is off (no ORCHESTRATOR_SLACK_SIGNING_SECRET)"},
    },
)
async def events(request: Request) -> JSONResponse:
    """Slack's Events API: a request signed with ORCHESTRATOR_SLACK_SIGNING_SECRET (see
    orchestrator/channels/slack_inbound.py)."""
    body = await _signed_body(request)
    if isinstance(body, JSONResponse):
        return body
    slack = api_state(request).slack
    # A body that is no Slack document raises InvalidMessage: a 400 (orchestrator/http/errors.py).
    doc = read_document(body)
    if isinstance(doc, UrlVerification):
        return JSONResponse({"challenge": doc.challenge}, 200)
    if doc is None:
        return JSONResponse({"ok": True}, 200)  # app_rate_limited and the like: nothing to do
    if request.headers.get(RETRY_HEADER) and slack.inbound().seen(doc.get("event_id")):
        return JSONResponse({"ok": True}, 200)  # a retry of what this process took
    await run_in_threadpool(slack.take, doc)  # the store's calls block: off the event loop
    return JSONResponse({"ok": True}, 200)


@router.post(
    INTERACTIONS_PATH,
    tags=["slack"],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-www-form-urlencoded": {
                    "schema": {
                        "type": "object",
                        "required": ["payload"],
                        "properties": {"payload": {"type": "string", "description": "the interaction, as JSON"}},
                    }
                }
            },
        }
    },
    responses={
        200: {"description": "verified and taken (a click refused, or not on a question's button, too)"},
        400: {"description": "the body is no form with a JSON `payload`"},
        401: _UNSIGNED,
        404: {"description": "Slack's requests are off (no ORCHESTRATOR_SLACK_SIGNING_SECRET)"},
    },
)
async def interactions(request: Request) -> Response:
    """Slack's interactivity: a request signed with ORCHESTRATOR_SLACK_SIGNING_SECRET (see
    orchestrator/channels/slack_clicks.py)."""
    body = await _signed_body(request)
    if isinstance(body, JSONResponse):
        return body
    try:
        (raw,) = parse_qs(body.decode(), strict_parsing=True)["payload"]
        payload = json.loads(raw)
    except (ValueError, KeyError):
        raise InvalidMessage("the body is no form with one JSON payload") from None
    # The store's calls and the Web API's block: off the event loop.
    await run_in_threadpool(take_interaction, api_state(request).slack.inbound(), payload)
    return Response(status_code=200)
