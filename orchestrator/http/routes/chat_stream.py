"""``GET /api/chats/{chat_jid}/stream``: a chat's live event stream (server-sent events;
what it sends and how: ``orchestrator/http/stream.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from orchestrator.http.routes.messages import MAX_SEQ, require_registered
from orchestrator.http.state import api_state
from orchestrator.http.stream import event_stream
from orchestrator.store.draft_feed import DraftMode

router = APIRouter()

_EVENTS = (
    "Server-sent events: `message` (id: the seq; a StoredMessage), `run` (a Run), "
    '`reset` (`{"reason": ...}`: drop what is shown, the view follows from seq 0) and '
    '`draft` (`{"run_id", "offset", "text"}`: the reply a running run is writing; keep the '
    "first `offset` characters (Unicode code points) shown for the run and put `text` after "
    'them; offset 0 starts the draft over, and with `"text": ""` the draft is gone). '
    "See orchestrator/http/stream.py."
)


@router.get(
    "/chats/{chat_jid}/stream",
    response_class=EventSourceResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": _EVENTS},
        404: {"description": "the chat is not a registered group (when registration is required)"},
    },
)
async def stream(
    request: Request,
    chat_jid: str,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Send messages with seq > after.")] = 0,
    drafts: Annotated[
        DraftMode,
        Query(
            description="`append`: each `draft` event carries what the draft grew by, at its `offset`. "
            "`whole`: each one carries the whole text at offset 0 (for a client that reads only `text`)."
        ),
    ] = "whole",
    last_event_id: Annotated[int, Header(ge=0, le=MAX_SEQ, description="Set by EventSource on reconnect.")] = 0,
) -> EventSourceResponse:
    """Server-sent events: the chat's new messages (display view), run-state changes and drafts, live."""
    state = api_state(request)
    await run_in_threadpool(require_registered, state.db, state.settings, chat_jid)
    settings = state.settings
    return event_stream(
        state.db,
        chat_jid,
        max(after, last_event_id),
        safety_poll_s=settings.api.stream_safety_poll_s,
        push=settings.api.stream_wakeup == "push",
        drafts=drafts,
    )
