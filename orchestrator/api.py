"""The HTTP API (FastAPI; OpenAPI docs at /docs).

Skeleton surface: health, post a message (the same ingest path as every
channel), read a chat's messages after a seq cursor, list groups and runs.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import FastAPI, HTTPException, Query
from pydantic import BaseModel
from sqlalchemy import text

from .db import get_database
from .errors import InvalidMessage, OrchestratorError, UnknownGroup
from .groups import Group, get_group, list_groups
from .ingest import IncomingMessage, ingest
from .messages import StoredMessage
from .queue import signal_group
from .runs import Run, list_runs
from .settings import Settings, get_settings
from .store import get_messages_after

MAX_CONTENT_CHARS = 100_000


class Health(BaseModel):
    status: str
    database: str
    broker: str


class PostedMessage(BaseModel):
    message: StoredMessage
    created: bool
    triggered: bool


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    settings.ensure_dirs()
    db = get_database(settings)
    api = FastAPI(title="Agent orchestrator", version="0.1.0")

    @api.get("/health", response_model=Health)
    def health() -> Health:
        try:
            with db.read() as session:
                session.execute(text("SELECT 1"))
            database = "ok"
        except Exception as exc:  # noqa: BLE001
            database = f"error: {exc}"
        broker = settings.effective_broker_url.split("://", 1)[0]
        return Health(status="ok" if database == "ok" else "degraded", database=database, broker=broker)

    @api.post("/api/messages", status_code=201, response_model=PostedMessage)
    def post_message(body: IncomingMessage) -> PostedMessage:
        if len(body.content) > MAX_CONTENT_CHARS:
            raise HTTPException(413, f"content is longer than {MAX_CONTENT_CHARS} characters")
        try:
            result = ingest(db, settings, body, signal=partial(signal_group, settings))
        except InvalidMessage as exc:
            raise HTTPException(400, str(exc)) from exc
        except OrchestratorError as exc:
            raise HTTPException(500, str(exc)) from exc
        return PostedMessage(message=result.message, created=result.created, triggered=result.triggered)

    @api.get("/api/chats/{chat_jid}/messages", response_model=list[StoredMessage])
    def chat_messages(
        chat_jid: str,
        after: Annotated[int, Query(ge=0, description="Return messages with seq > after.")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    ) -> list[StoredMessage]:
        return get_messages_after(chat_jid, after, limit=limit, db=db)

    @api.get("/api/groups", response_model=list[Group])
    def groups() -> list[Group]:
        return list_groups(db)

    @api.get("/api/groups/{chat_jid}", response_model=Group)
    def group(chat_jid: str) -> Group:
        try:
            return get_group(db, chat_jid)
        except UnknownGroup as exc:
            raise HTTPException(404, str(exc)) from exc

    @api.get("/api/runs", response_model=list[Run])
    def runs(
        chat_jid: str | None = None, state: str | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> list[Run]:
        return list_runs(db, chat_jid=chat_jid, state=state, limit=limit)

    return api


def __getattr__(name: str) -> FastAPI:
    # ``uvicorn orchestrator.api:app`` builds the app on first access, so
    # importing this module has no side effects.
    if name == "app":
        global app
        app = create_app()
        return app
    raise AttributeError(name)
