"""A chat's messages: ``POST /api/messages`` (the same ingest path as every channel) and
``GET /api/chats/{chat_jid}/messages`` (the display view after a seq cursor).

Posted messages are stored in the thread pool, those that arrive together in one
transaction (:func:`post_batches`, ``orchestrator/http/write_batches.py``).  A
sender over its rate is a 429 with ``Retry-After``; a chat that is no registered
group a 404 while ``ORCHESTRATOR_API_REQUIRE_REGISTERED_CHAT`` is on (the rule of
the event stream and the inbound webhook too: :func:`require_registered`);
nothing is stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel

from orchestrator.core.errors import NotFound
from orchestrator.core.settings import Settings
from orchestrator.http.responses import model_response
from orchestrator.http.state import api_state
from orchestrator.http.write_batches import WriteBatches
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest_batch
from orchestrator.store.db import Database
from orchestrator.store.groups import is_registered, registered_chats
from orchestrator.store.message_log import get_messages_after

router = APIRouter()

# Batches of posts written at once on PostgreSQL (http/write_batches.py); its pool holds 5.
POSTGRES_WRITERS = 2
MAX_CONTENT_CHARS = 100_000
# The largest seq a query may name: what the seq columns hold (INTEGER: 32 bits on
# PostgreSQL).  A larger one was a 500 (SQLite's OverflowError, PostgreSQL's "integer
# out of range") instead of a 400.
MAX_SEQ = 2**31 - 1

# What POST /api/messages (and the inbound webhook) lists for a sender over its rate.
RATE_LIMITED_DOC: dict[int | str, dict[str, Any]] = {
    429: {
        "description": "the sender sent ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE messages into the chat in the last "
        "minute; nothing was stored. `Retry-After`: seconds until one more is taken",
        "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
    }
}


class PostedMessage(BaseModel):
    message: StoredMessage
    created: bool
    triggered: bool


def unregistered(chat_jid: str) -> NotFound:
    """The 404 of a chat that is no registered group, while registration is required."""
    return NotFound(
        f"no registered group for chat {chat_jid!r} (register it with POST /api/groups; "
        "ORCHESTRATOR_API_REQUIRE_REGISTERED_CHAT=false accepts any chat)"
    )


def require_registered(db: Database, settings: Settings, chat_jid: str) -> None:
    """Raise :func:`unregistered` for a chat that is no registered group, when registration is required."""
    if settings.api.require_registered_chat and not is_registered(db, chat_jid):
        raise unregistered(chat_jid)


@router.post(
    "/messages",
    status_code=201,
    response_model=PostedMessage,
    responses={
        404: {"description": "the chat is not a registered group (when registration is required)"},
        413: {"description": "content too long"},
        **RATE_LIMITED_DOC,
    },
)
async def post_message(request: Request, body: IncomingMessage) -> Response:
    if len(body.content) > MAX_CONTENT_CHARS:
        raise HTTPException(413, f"content is longer than {MAX_CONTENT_CHARS} characters")
    return await api_state(request).posts.submit(body)


@router.get("/chats/{chat_jid}/messages", response_model=list[StoredMessage])
def chat_messages(
    request: Request,
    chat_jid: str,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Return messages with seq > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    include_superseded: Annotated[bool, Query(description="Audit: include superseded messages.")] = False,
) -> list[StoredMessage]:
    db = api_state(request).db
    return get_messages_after(chat_jid, after, limit=limit, include_superseded=include_superseded, db=db)


def store_posted(
    db: Database,
    settings: Settings,
    bodies: Sequence[IncomingMessage],
    *,
    signal: Callable[[str], object],
    signal_delivery: Callable[[str], object] | None,
) -> list[Response | Exception]:
    """Each post's answer, or the exception its caller raises (a 404, a 429, the database's 503)."""
    refused: dict[int, Exception] = {}
    if settings.api.require_registered_chat:
        try:
            known = registered_chats(db, [body.chat_jid for body in bodies])
        except Exception as exc:  # noqa: BLE001 - the database's state: every post's answer
            return [exc] * len(bodies)
        refused = {i: unregistered(body.chat_jid) for i, body in enumerate(bodies) if body.chat_jid not in known}
    stored = iter(
        ingest_batch(
            db,
            settings,
            [b for i, b in enumerate(bodies) if i not in refused],
            signal=signal,
            signal_delivery=signal_delivery,
        )
    )
    return [refused[i] if i in refused else _posted(next(stored)) for i in range(len(bodies))]


def _posted(result: IngestResult | Exception) -> Response | Exception:
    if isinstance(result, Exception):
        return result
    return model_response(
        PostedMessage(message=result.message, created=result.created, triggered=result.triggered), status_code=201
    )


def post_batches(
    db: Database,
    settings: Settings,
    *,
    signal: Callable[[str], object],
    signal_delivery: Callable[[str], object] | None,
) -> WriteBatches[IncomingMessage, Response]:
    """The write batches ``POST /api/messages`` submits to (one per app).

    SQLite has one writer at a time, and a thread that finds the write lock taken sleeps
    in SQLite's busy handler (1, 2, 5, 10 ms...) rather than waking when it is free: so on
    SQLite one batch is written at a time, the posts that arrive meanwhile wait on the
    event loop for the next; PostgreSQL writes a few batches at once, on the pool's
    connections."""

    def store(bodies: Sequence[IncomingMessage]) -> list[Response | Exception]:
        return store_posted(db, settings, bodies, signal=signal, signal_delivery=signal_delivery)

    return WriteBatches(store, writers=1 if db.is_sqlite else POSTGRES_WRITERS)
