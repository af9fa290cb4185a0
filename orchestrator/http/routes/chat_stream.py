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

router = APIRouter()


@router.get(
    "/chats/{chat_jid}/stream",
    response_class=EventSourceResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "events `message` (id: seq), `run` and `reset`; see orchestrator/http/stream.py",
        },
        404: {"description": "the chat is not a registered group (when registration is required)"},
    },
)
async def stream(
    request: Request,
    chat_jid: str,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Send messages with seq > after.")] = 0,
    last_event_id: Annotated[int, Header(ge=0, le=MAX_SEQ, description="Set by EventSource on reconnect.")] = 0,
) -> EventSourceResponse:
    """Server-sent events: the chat's new messages (display view) and run-state changes, live."""
    state = api_state(request)
    await run_in_threadpool(require_registered, state.db, state.settings, chat_jid)
    return event_stream(state.db, chat_jid, max(after, last_event_id), state.settings.api_stream_poll_s)
