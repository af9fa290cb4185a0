"""The HTTP API (FastAPI; OpenAPI docs at /docs).

Health; post a message (the same ingest path as every channel); read a
chat's display view after a seq cursor; edit, regenerate and truncate; export;
groups; runs, with the exact input each run sent.  Bad input is a 400 whose
body names the offending field; nothing is stored.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field
from sqlalchemy import text

from .assembly import stored_input
from .db import get_database
from .envelopes import InvalidMessageMetadata
from .errors import GroupBusy, InvalidMessage, MessageNotFound, OrchestratorError, StoreError, UnknownGroup
from .groups import Group, get_group, list_groups
from .history import HistoryChange, edit_message, regenerate, truncate_after
from .ingest import IncomingMessage, ingest
from .messages import StoredMessage
from .queue import signal_group
from .runs import Run, get_run, list_runs
from .settings import Settings, get_settings
from .store import get_messages_after
from .transfer import export_json, export_markdown

MAX_CONTENT_CHARS = 100_000


class Health(BaseModel):
    status: str
    database: str
    broker: str


class PostedMessage(BaseModel):
    message: StoredMessage
    created: bool
    triggered: bool


class EditRequest(BaseModel):
    content: str = Field(max_length=MAX_CONTENT_CHARS)
    context: list[dict[str, Any]] | None = None
    rerun: bool = False


def _bad_request(field: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=400, content={"detail": message, "field": field})


_STATUS: list[tuple[type[OrchestratorError], int]] = [
    (UnknownGroup, 404), (MessageNotFound, 404), (GroupBusy, 409), (InvalidMessage, 400),
]


def _error_response(exc: OrchestratorError) -> JSONResponse:
    """One mapping from the exception tree to status codes."""
    if isinstance(exc, InvalidMessageMetadata):
        return _bad_request(exc.field, str(exc))
    status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
    return JSONResponse(status_code=status, content={"detail": str(exc)})


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    settings.ensure_dirs()
    db = get_database(settings)
    api = FastAPI(title="Agent orchestrator", version="0.1.0")
    signal = partial(signal_group, settings)

    @api.exception_handler(RequestValidationError)
    def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        # 400 (not FastAPI's 422) with the first offending field, like every other bad input.
        err = exc.errors()[0]
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        return _bad_request(".".join(loc) or "body", f"{'.'.join(loc) or 'body'}: {err.get('msg', 'invalid')}")

    @api.exception_handler(OrchestratorError)
    def _orchestrator_error(request: Request, exc: OrchestratorError) -> JSONResponse:
        return _error_response(exc)

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
        result = ingest(db, settings, body, signal=signal)
        return PostedMessage(message=result.message, created=result.created, triggered=result.triggered)

    @api.get("/api/chats/{chat_jid}/messages", response_model=list[StoredMessage])
    def chat_messages(
        chat_jid: str,
        after: Annotated[int, Query(ge=0, description="Return messages with seq > after.")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
        include_superseded: Annotated[bool, Query(description="Audit: include superseded messages.")] = False,
    ) -> list[StoredMessage]:
        return get_messages_after(chat_jid, after, limit=limit, include_superseded=include_superseded, db=db)

    @api.post("/api/chats/{chat_jid}/messages/{message_id}/edit", response_model=HistoryChange)
    def edit(chat_jid: str, message_id: str, body: EditRequest) -> HistoryChange:
        return edit_message(
            db, settings, chat_jid, message_id, body.content, context=body.context, rerun=body.rerun, signal=signal
        )

    @api.post("/api/chats/{chat_jid}/messages/{message_id}/regenerate", response_model=HistoryChange)
    def regenerate_reply(chat_jid: str, message_id: str) -> HistoryChange:
        return regenerate(db, settings, chat_jid, message_id, signal=signal)

    @api.post("/api/chats/{chat_jid}/messages/{message_id}/truncate", response_model=HistoryChange)
    def truncate(chat_jid: str, message_id: str) -> HistoryChange:
        return truncate_after(db, settings, chat_jid, message_id)

    @api.get("/api/chats/{chat_jid}/export")
    def export(chat_jid: str, format: Annotated[str, Query(pattern="^(md|json)$")] = "json") -> Response:
        if format == "json":
            return Response(export_json(db, chat_jid), media_type="application/json")
        return PlainTextResponse(export_markdown(db, chat_jid, settings.assistant_name), media_type="text/markdown")

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

    @api.get("/api/runs/{run_id}", response_model=Run)
    def run(run_id: str) -> Run:
        try:
            return get_run(db, run_id)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc

    @api.get("/api/runs/{run_id}/input")
    def run_input(run_id: str) -> Response:
        """The exact ContainerInput JSON the run sent to its container."""
        try:
            data = stored_input(db, get_run(db, run_id).id)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        if data is None:
            raise HTTPException(404, f"run {run_id} has no recorded input")
        return Response(data, media_type="application/json")

    return api


def __getattr__(name: str) -> FastAPI:
    # ``uvicorn orchestrator.api:app`` builds the app on first access, so
    # importing this module has no side effects.
    if name == "app":
        global app
        app = create_app()
        return app
    raise AttributeError(name)
