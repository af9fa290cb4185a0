"""The HTTP API (FastAPI; OpenAPI docs at /docs) and the web chat page at ``/``.

Health; post a message (the same ingest path as every channel); read a
chat's display view after a seq cursor, or follow it live (server-sent
events, ``orchestrator/http/stream.py``); edit, regenerate and truncate; export;
register, list, change and move groups (to a worker host), and see a group's use of its quotas; runs,
with the exact input each run sent, and the groups waiting for a run slot;
the fleet's hosts.  Bad input is a 400
whose body names the offending field; a sender over its rate a 429 with
``Retry-After``; nothing is stored.  A history change the message's state
does not allow (or a run in progress) is a 409.  Every answer is in the
OpenAPI document (``orchestrator/http/contract.py`` adds what all routes share;
``tests/host/test_api_contract.py`` holds the server to it).

Every ``/api`` route takes ``Authorization: Bearer <ORCHESTRATOR_API_TOKEN>``
when a token is set (compared in constant time; 401 otherwise); without one
(loopback only), a POST, PUT, PATCH or DELETE needs ``X-Orchestrator-Client``
and no sign of another site's page (``orchestrator/http/guards.py``).  Serving
beyond loopback without a token is refused at start-up
(:func:`check_exposure`).  ``/health``, the page and its static files need no
token (they hold no data).  ``GET /metrics`` (Prometheus' text format: what this
process counted, ``orchestrator/core/metrics.py``) takes the same token as ``/api``
when one is set: counts of messages and senders are the installation's business,
and a scraper can send a bearer token (``authorization`` in its scrape config).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema
from sqlalchemy import exc as sqlalchemy_exc
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders

from orchestrator.channels.slack_inbound import EVENTS_PATH, add_slack_route
from orchestrator.channels.webhook import INBOUND_PATH, add_inbound_route
from orchestrator.core import heap, metrics
from orchestrator.core.errors import (
    ChangeRefused,
    ConfigError,
    ContainerConfigError,
    DatabaseUnavailable,
    GroupBusy,
    InvalidMessage,
    MessageNotFound,
    MountRefused,
    OrchestratorError,
    RateLimited,
    ReplayLimited,
    ReplayRefused,
    StoreError,
    UnknownGroup,
)
from orchestrator.core.jsontypes import WHOLE_NUMBER, JsonBool, JsonObject
from orchestrator.core.settings import Settings
from orchestrator.http.contract import (
    NO_NUL_PATTERN,
    allow_every_method,
    document_shared_errors,
    inline_json_schema,
    refuse_nul_parameters,
)
from orchestrator.http.endpoint import INSTALL_HEADER
from orchestrator.http.fleet_metrics import fleet_exposition
from orchestrator.http.guards import RequestGuard
from orchestrator.http.stream import event_stream
from orchestrator.http.write_batches import WriteBatches
from orchestrator.model.context import MAX_ITEMS, ContextItem
from orchestrator.model.envelopes import InvalidMessageMetadata
from orchestrator.model.messages import StoredMessage
from orchestrator.root import Orchestrator
from orchestrator.run.assembly import stored_input
from orchestrator.run.ingest import IncomingMessage, IngestResult, ingest_batch
from orchestrator.run.run_diff import RunDiff, diff_runs
from orchestrator.sandbox.config import ContainerConfig
from orchestrator.store.db import driver_execute, unavailable_reason
from orchestrator.store.groups import (
    FOLDER_PATTERN,
    MAX_QUOTA,
    Group,
    add_group,
    get_group,
    is_registered,
    list_groups,
    registered_chats,
    update_group,
)
from orchestrator.store.history import HistoryChange, edit_message, regenerate, truncate_after
from orchestrator.store.hosts import ALIVE_WINDOW_S, Host, list_hosts
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.placement import HostUnavailable, Moved, move
from orchestrator.store.runs import Run, get_run, list_runs
from orchestrator.store.slots import FleetSlots, fleet_slots
from orchestrator.store.transfer import export_json, export_markdown
from orchestrator.store.usage import GroupUsage, group_usage

log = logging.getLogger(__name__)

# Batches of posts written at once on PostgreSQL (http/write_batches.py); its pool holds 5.
POSTGRES_WRITERS = 2

MAX_CONTENT_CHARS = 100_000
WEB_DIR = Path(__file__).parent / "web"
# The page runs only its own files: no inline script, nothing from elsewhere.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# No whitespace or control character, spelled out: "\s" is another set in JSON Schema's ECMA
# regexes than in Python's and pydantic's Rust ones (U+0085, U+FEFF), so a client (or a fuzzer)
# reading the document would send what the server refuses.
_SPACE_OR_CONTROL = r"\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
# A chat id: no whitespace or control characters.
JID_PATTERN = rf"^[^{_SPACE_OR_CONTROL}]+$"
# The largest seq a query may name: what the seq columns hold (INTEGER: 32 bits on
# PostgreSQL).  A larger one was a 500 (SQLite's OverflowError, PostgreSQL's "integer
# out of range") instead of a 400.
MAX_SEQ = 2**31 - 1
# A liveness window of a year is already meaningless; timedelta refuses far larger ones.
MAX_WINDOW_S = 366 * 86400.0

# An assistant name is the trigger word after "@": no spaces or control characters, no "@".
ASSISTANT_NAME_PATTERN = rf"^[^@{_SPACE_OR_CONTROL}]{{1,64}}$"


class Health(BaseModel):
    status: str
    database: str
    broker: str


class PostedMessage(BaseModel):
    message: StoredMessage
    created: bool
    triggered: bool


class Info(BaseModel):
    """What the web page needs to know about this server."""

    assistant_name: str
    trigger_names: list[str]
    require_registered_chat: bool
    token_required: bool


# The request bodies are strict: JSON's types as the document states them (no "3" for 3, no 1 for true).
class NewGroup(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    chat_jid: str = Field(min_length=1, max_length=256, pattern=JID_PATTERN)
    name: str = Field(min_length=1, max_length=200, pattern=NO_NUL_PATTERN)
    folder: str = Field(pattern=FOLDER_PATTERN, description="The workspace folder: 1-64 letters, digits, '-' or '_'.")
    requires_trigger: JsonBool = Field(default=True, description="Only messages starting with @Name wake the agent.")
    assistant_name: str | None = Field(
        default=None, pattern=ASSISTANT_NAME_PATTERN, description="This group's assistant (default: the setting)."
    )
    is_main: JsonBool = Field(
        default=False,
        description=(
            "The main group: answers every message (no trigger) and its agent may post to other chats. "
            "There is one; 409 if another group is main."
        ),
    )


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class GroupChanges(BaseModel):
    """Only the fields given change; ``assistant_name: null`` goes back to the
    setting, ``container_config: null`` back to the settings' limits."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Left out or given, never null (change_group refuses a null naming the field): None here only
    # means "not given", so the document states the given value alone, without that default.
    name: Annotated[
        str | None, WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 200, "pattern": NO_NUL_PATTERN})
    ] = Field(default=None, min_length=1, max_length=200, pattern=NO_NUL_PATTERN, json_schema_extra=_no_default)
    requires_trigger: Annotated[JsonBool | None, WithJsonSchema({"type": "boolean"})] = Field(
        default=None, json_schema_extra=_no_default
    )
    assistant_name: str | None = Field(default=None, pattern=ASSISTANT_NAME_PATTERN)
    container_config: ContainerConfig | None = Field(
        default=None,
        description="The group's sandbox (orchestrator/sandbox/config.py); null: the settings' limits. "
        "Refused (400) beyond its schema: a run_timeout_s above ORCHESTRATOR_RUN_TIMEOUT_S, a "
        "workspace_quota below the size of the group's volume, mounts the mount allowlist does not allow "
        "and mounts whose names clash.",
    )
    runs_per_hour: Annotated[int, Field(ge=0, le=MAX_QUOTA), WHOLE_NUMBER] | None = Field(
        default=None,
        description="The group's runs per hour (0: no limit; null: ORCHESTRATOR_GROUP_RUNS_PER_HOUR).",
    )
    tokens_per_day: Annotated[int, Field(ge=0, le=MAX_QUOTA), WHOLE_NUMBER] | None = Field(
        default=None,
        description="The group's model tokens per UTC day (0: no limit; null: ORCHESTRATOR_GROUP_TOKENS_PER_DAY).",
    )


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^(offline|(anthropic|openai):[^\x00\s]+)$",
        description="The model to replay the run with, as ORCHESTRATOR_MODEL spells it: `offline`, "
        "`anthropic:<model id>` or `openai:<model id>`.",
    )


class MoveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    host: str = Field(
        min_length=1,
        max_length=256,
        pattern=NO_NUL_PATTERN,
        description="The worker host (ORCHESTRATOR_HOST_ID) to place the group on; it must be up (GET /api/hosts).",
    )


# The context items an edit may give, as the document states them; checked by
# orchestrator/model/context.py (parse_context), whose 400 names the field as in a message's metadata.
_CONTEXT_ITEMS = {**inline_json_schema(TypeAdapter(list[ContextItem])), "maxItems": MAX_ITEMS}


class EditRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    content: str = Field(max_length=MAX_CONTENT_CHARS, pattern=NO_NUL_PATTERN)
    context: Annotated[list[JsonObject] | None, WithJsonSchema({"anyOf": [_CONTEXT_ITEMS, {"type": "null"}]})] = None
    rerun: JsonBool = False


def _json(model: BaseModel, status_code: int = 200) -> Response:
    """``model`` as the JSON answer, serialized once: a route that returns a model has FastAPI
    validate it against the route's ``response_model`` again before serializing it, a
    tenth of a small request's time (docs/performance.md, "The HTTP path").  For routes on the
    hot path, whose model is the response_model (the document still names it)."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


def _bad_request(field: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=400, content={"detail": message, "field": field})


_STATUS: list[tuple[type[OrchestratorError], int]] = [
    (UnknownGroup, 404),
    (MessageNotFound, 404),
    (GroupBusy, 409),
    (HostUnavailable, 409),
    (ChangeRefused, 409),
    (InvalidMessage, 400),
]


def rate_limited_response(exc: RateLimited) -> JSONResponse:
    """429 with ``Retry-After`` (whole seconds) for a sender over its rate; nothing was stored."""
    return JSONResponse(
        status_code=429,
        content={"detail": str(exc), "retry_after_s": exc.retry_after_s},
        headers={"Retry-After": str(exc.retry_after_s)},
    )


# What edit, regenerate and truncate may answer besides their 200 (and the shared 400 and 401).
HISTORY_CHANGE_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such registered chat, or no such message in it"},
    409: {
        "description": "the message's state does not allow the change (superseded; not a person's "
        "message to edit; not a reply to regenerate), or a run is in progress in the chat"
    },
}

# What POST /api/messages (and the inbound webhook) lists for a sender over its rate.
RATE_LIMITED_DOC: dict[int | str, dict[str, Any]] = {
    429: {
        "description": "the sender sent ORCHESTRATOR_SENDER_MESSAGES_PER_MINUTE messages into the chat in the last "
        "minute; nothing was stored. `Retry-After`: seconds until one more is taken",
        "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
    }
}


# Retry-After of a 503: a PostgreSQL restart takes seconds; a lock held elsewhere was
# already waited for (ORCHESTRATOR_API_DB_WAIT_S) before the 503.
DB_RETRY_AFTER_S = 5


def _error_response(exc: OrchestratorError) -> JSONResponse:
    """One mapping from the exception tree to status codes."""
    if isinstance(exc, InvalidMessageMetadata):
        return _bad_request(exc.field, str(exc))
    if isinstance(exc, RateLimited):
        return rate_limited_response(exc)
    if isinstance(exc, DatabaseUnavailable):
        return JSONResponse(
            status_code=503,
            content={"detail": str(exc), "retry_after_s": exc.retry_after_s},
            headers={"Retry-After": str(exc.retry_after_s)},
        )
    status = next((code for kind, code in _STATUS if isinstance(exc, kind)), 500)
    return JSONResponse(status_code=status, content={"detail": str(exc)})


def is_loopback(host: str) -> bool:
    """True if binding ``host`` serves this machine only (a name other than localhost counts as remote)."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str) -> None:
    """Refuse to serve the API beyond loopback without a token (ConfigError)."""
    if not token and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve the HTTP API on {host!r} without a token: anyone who can reach it could "
            "drive the agent. Set ORCHESTRATOR_API_TOKEN (clients then send 'Authorization: Bearer <token>'), "
            "or listen on 127.0.0.1"
        )


# The bearer token's scheme in the API's document; stateless, so one for every app.
BEARER = HTTPBearer(
    auto_error=False, description="ORCHESTRATOR_API_TOKEN; required when the server listens beyond loopback."
)


def _token_check(settings: Settings) -> Callable[[HTTPAuthorizationCredentials | None], None]:
    """401 unless the request carries the API token (when one is set)."""
    expected = settings.api_token.encode()

    def check_token(credentials: HTTPAuthorizationCredentials | None) -> None:
        if not expected:
            return
        given = credentials.credentials.encode() if credentials is not None else b""
        if not hmac.compare_digest(given, expected):
            raise HTTPException(
                401,
                "missing or wrong bearer token" if given else "this API needs 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    return check_token


def _install_check(settings: Settings) -> Callable[[Request], None]:
    """421 when the request names another installation."""
    install_id = settings.install_id

    def check_install(request: Request) -> None:
        # A client that found this API through a data dir's announce file says
        # which installation it means (orchestrator/http/endpoint.py): a stale
        # file naming a port another installation took since must not store
        # its message here.
        claimed = request.headers.get(INSTALL_HEADER)
        if claimed is not None and claimed != install_id:
            raise HTTPException(421, f"this API serves installation {install_id}, not {claimed}")

    return check_install


def _api_checks(settings: Settings) -> Any:
    """What every ``/api`` request must pass, as ONE dependency, in this order: the token
    (401) before anything is looked at, the install header (421), then no NUL in a path
    or query parameter (400).  One, not three: FastAPI's resolution costs per dependency
    per request, a tenth of a small post's server time for three (docs/performance.md).
    async: FastAPI runs a plain def dependency in its thread pool, a hop per request for
    checks that never block."""
    check_token, check_install = _token_check(settings), _install_check(settings)

    # A default, not Annotated: string annotations only see module globals.
    async def api_checks(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(BEARER)) -> None:
        check_token(credentials)
        check_install(request)
        await refuse_nul_parameters(request)

    return api_checks


def _metrics_check(settings: Settings) -> Any:
    """The token alone (``/metrics`` is outside ``/api``)."""
    check_token = _token_check(settings)

    async def require_token(credentials: HTTPAuthorizationCredentials | None = Depends(BEARER)) -> None:
        check_token(credentials)

    return require_token


def create_app(root: Orchestrator | None = None) -> FastAPI:
    """The API of the installation ``root`` (default: built from the environment, as
    :func:`serve_app` builds it for the server)."""
    root = root or Orchestrator.from_environment()
    settings = root.settings
    check_exposure(settings.api_host, settings.api_token)
    settings.ensure_dirs()
    db = root.db
    db.limit_wait(settings.api_db_wait_s)  # a caller waits: 503 after a few seconds, not the workers' 60
    api = FastAPI(title="Agent orchestrator", version="0.1.0")
    document_shared_errors(api)  # the 400, 401 and error bodies every route shares
    allow_every_method(api)
    require_token = _metrics_check(settings)
    router = APIRouter(
        prefix="/api",
        dependencies=[Depends(_api_checks(settings))],
        responses={421: {"description": f"the request's {INSTALL_HEADER} names another installation"}},
    )
    signal, signal_delivery = root.signals.group, root.signals.delivery

    def unregistered(chat_jid: str) -> HTTPException:
        return HTTPException(
            404,
            f"no registered group for chat {chat_jid!r} (register it with POST /api/groups; "
            "ORCHESTRATOR_API_REQUIRE_REGISTERED_CHAT=false accepts any chat)",
        )

    def registered_or_404(chat_jid: str) -> None:
        if settings.api_require_registered_chat and not is_registered(db, chat_jid):
            raise unregistered(chat_jid)

    @api.exception_handler(RequestValidationError)
    def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        # 400 (not FastAPI's 422) with the first offending field, like every other bad input.
        err = exc.errors()[0]
        # As the other 400s name fields: dotted, list indexes in brackets (extra_mounts[0].name).
        field = (
            "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.get("loc", ()) if p != "body").lstrip(".")
            or "body"
        )
        return _bad_request(field, f"{field}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}")

    @api.exception_handler(OrchestratorError)
    def _orchestrator_error(request: Request, exc: OrchestratorError) -> JSONResponse:
        return _error_response(exc)

    def _database_error(request: Request, exc: Exception) -> JSONResponse:
        # A passing state of the database (restarting, locked elsewhere, disk full) is a 503 the
        # client can retry; anything else is a bug and stays a 500 (raised on, to the server's log).
        reason = unavailable_reason(exc)
        if reason is None:
            raise exc
        # The driver's words, not SQLAlchemy's text: that one quotes the statement's parameters.
        cause = exc.orig if isinstance(exc, sqlalchemy_exc.DBAPIError) else exc
        log.warning("%s %s: 503, %s: %s", request.method, request.url.path, reason, str(cause).strip())
        return _error_response(DatabaseUnavailable(reason, DB_RETRY_AFTER_S))

    # SQLAlchemy's errors, and the driver's own (the ingest path's statements go to it directly).
    for kind in (sqlalchemy_exc.DBAPIError, sqlalchemy_exc.TimeoutError, *db.driver_errors):
        api.add_exception_handler(kind, _database_error)

    broker_kind = settings.effective_broker_url.split("://", 1)[0]
    # SQLite answers a SELECT 1 in process, in microseconds, and a WAL reader never waits
    # for a writer: asked on the event loop, with no thread hop.  A server database is a
    # round trip (two with the pool's pre-ping): that one waits in the thread pool.
    health_inline = db.engine.dialect.name == "sqlite"

    def database_health() -> str:
        try:
            # On the driver, outside a transaction: SQLAlchemy's would begin one (on SQLite
            # BEGIN IMMEDIATE, the write lock: orchestrator/store/db.py).
            with db.engine.connect() as conn:
                driver_execute(conn, "SELECT 1").fetchone()
            return "ok"
        except Exception as exc:  # noqa: BLE001 - a health check reports the failure, it does not raise it
            log.warning("health: the database does not answer: %s", exc)
            return f"error: {exc}"

    @api.get("/health", response_model=Health)
    async def health() -> Response:
        database = database_health() if health_inline else await run_in_threadpool(database_health)
        return _json(Health(status="ok" if database == "ok" else "degraded", database=database, broker=broker_kind))

    @api.get(
        "/metrics",
        dependencies=[Depends(require_token)],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus' text format"}},
    )
    def prometheus_metrics() -> Response:
        """This API process's Prometheus metrics (ingest) and the fleet's per-host gauges
        read from the database; the workers serve theirs on ORCHESTRATOR_METRICS_PORT.
        Needs the API token when one is set."""
        body, content_type = metrics.exposition()
        return Response(body + fleet_exposition(db), media_type=content_type)

    @router.get("/info", response_model=Info)
    def info() -> Info:
        return Info(
            assistant_name=settings.assistant_name,
            trigger_names=settings.trigger_names,
            require_registered_chat=settings.api_require_registered_chat,
            token_required=bool(settings.api_token),
        )

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
    async def post_message(body: IncomingMessage) -> Response:
        if len(body.content) > MAX_CONTENT_CHARS:
            raise HTTPException(413, f"content is longer than {MAX_CONTENT_CHARS} characters")
        return await posts.submit(body)

    def store_posted(bodies: Sequence[IncomingMessage]) -> list[Response | Exception]:
        """Each post's answer, or the exception its caller raises (a 404, a 429, the database's 503)."""
        refused: dict[int, Exception] = {}
        if settings.api_require_registered_chat:
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
        return _json(
            PostedMessage(message=result.message, created=result.created, triggered=result.triggered), status_code=201
        )

    # Posted messages are stored in the thread pool, those that arrive together in one
    # transaction (http/write_batches.py).  SQLite has one writer at a time, and a thread
    # that finds the write lock taken sleeps in SQLite's busy handler (1, 2, 5, 10 ms...)
    # rather than waking when it is free: so on SQLite one batch is written at a time, the
    # posts that arrive meanwhile wait on the event loop for the next; PostgreSQL writes a
    # few batches at once, on the pool's connections.
    posts: WriteBatches[IncomingMessage, Response] = WriteBatches(
        store_posted, writers=1 if db.is_sqlite else POSTGRES_WRITERS
    )

    @router.get("/chats/{chat_jid}/messages", response_model=list[StoredMessage])
    def chat_messages(
        chat_jid: str,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Return messages with seq > after.")] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = 200,
        include_superseded: Annotated[bool, Query(description="Audit: include superseded messages.")] = False,
    ) -> list[StoredMessage]:
        return get_messages_after(chat_jid, after, limit=limit, include_superseded=include_superseded, db=db)

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
        chat_jid: str,
        after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Send messages with seq > after.")] = 0,
        last_event_id: Annotated[int, Header(ge=0, le=MAX_SEQ, description="Set by EventSource on reconnect.")] = 0,
    ) -> EventSourceResponse:
        """Server-sent events: the chat's new messages (display view) and run-state changes, live."""
        await run_in_threadpool(registered_or_404, chat_jid)
        return event_stream(db, chat_jid, max(after, last_event_id), settings.api_stream_poll_s)

    @router.post(
        "/chats/{chat_jid}/messages/{message_id}/edit", response_model=HistoryChange, responses=HISTORY_CHANGE_ERRORS
    )
    def edit(chat_jid: str, message_id: str, body: EditRequest) -> HistoryChange:
        return edit_message(
            db, settings, chat_jid, message_id, body.content, context=body.context, rerun=body.rerun, signal=signal
        )

    @router.post(
        "/chats/{chat_jid}/messages/{message_id}/regenerate",
        response_model=HistoryChange,
        responses=HISTORY_CHANGE_ERRORS,
    )
    def regenerate_reply(chat_jid: str, message_id: str) -> HistoryChange:
        return regenerate(db, settings, chat_jid, message_id, signal=signal)

    @router.post(
        "/chats/{chat_jid}/messages/{message_id}/truncate",
        response_model=HistoryChange,
        responses=HISTORY_CHANGE_ERRORS,
    )
    def truncate(chat_jid: str, message_id: str) -> HistoryChange:
        return truncate_after(db, settings, chat_jid, message_id)

    @router.get(
        "/chats/{chat_jid}/export",
        responses={
            200: {
                "description": "`format=json`: the chat as JSON that `orchestrator import` reads back; "
                "`format=md`: as markdown",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/markdown": {"schema": {"type": "string"}},
                },
            }
        },
    )
    def export(chat_jid: str, format: Annotated[str, Query(pattern="^(md|json)$")] = "json") -> Response:
        if format == "json":
            return Response(export_json(db, chat_jid), media_type="application/json")
        return PlainTextResponse(export_markdown(db, chat_jid, settings.assistant_name), media_type="text/markdown")

    @router.get("/groups", response_model=list[Group])
    def groups() -> list[Group]:
        return list_groups(db)

    @router.post(
        "/groups",
        status_code=201,
        response_model=Group,
        responses={
            409: {"description": "the chat or the folder is already registered, or is_main and another group is main"}
        },
    )
    def register_group(body: NewGroup) -> Group | JSONResponse:
        """Register a chat as a group; with ``is_main`` the main group (``orchestrator up`` and
        ORCHESTRATOR_MAIN_GROUP make one on start)."""
        try:
            return add_group(
                db,
                chat_jid=body.chat_jid,
                name=body.name,
                folder=body.folder,
                is_main=body.is_main,
                requires_trigger=body.requires_trigger,
                assistant_name=body.assistant_name,
            )
        except InvalidMessage as exc:
            return _bad_request("folder", str(exc))
        except StoreError as exc:
            raise HTTPException(409, str(exc)) from exc

    @router.get("/groups/{chat_jid}", response_model=Group, responses={404: {"description": "no such group"}})
    def group(chat_jid: str) -> Group:
        try:
            return get_group(db, chat_jid)
        except UnknownGroup as exc:
            raise HTTPException(404, str(exc)) from exc

    @router.patch("/groups/{chat_jid}", response_model=Group, responses={404: {"description": "no such group"}})
    def change_group(chat_jid: str, body: GroupChanges) -> Group | JSONResponse:
        """Change a group's name, trigger rule, assistant name, sandbox or quotas; only the fields given."""
        from orchestrator.sandbox.config import set_container_config

        given = body.model_fields_set
        for key in ("name", "requires_trigger"):
            if key in given and getattr(body, key) is None:
                return _bad_request(key, f"{key}: must not be null")
        get_group(db, chat_jid)  # 404 before anything changes
        if "container_config" in given:
            try:
                config = body.container_config
                set_container_config(
                    db,
                    settings,
                    chat_jid,
                    None if config is None else config.model_dump(mode="json", exclude_defaults=True),
                )
            except ContainerConfigError as exc:
                return _bad_request("container_config", str(exc))
            except MountRefused as exc:
                return _bad_request("container_config.extra_mounts", str(exc))
        changes = {k: getattr(body, k) for k in given if k != "container_config"}
        return update_group(db, chat_jid, changes) if changes else get_group(db, chat_jid)

    @router.post(
        "/groups/{chat_jid}/move",
        response_model=Moved,
        responses={
            404: {"description": "no such group"},
            409: {"description": "the host is not up (dead, stopped, draining or unknown)"},
        },
    )
    def move_group(chat_jid: str, body: MoveRequest) -> Moved:
        """Place the group on a worker host: its next runs go there (a run in progress finishes
        where it is; the old host stops the group's warm container).  Pending work is signalled there."""
        moved = move(db, chat_jid, body.host)
        if moved.pending:
            try:
                signal(chat_jid)
                moved = moved.model_copy(update={"signalled": True})
            except Exception as exc:  # noqa: BLE001 - the sweeper re-signals pending groups
                log.warning("could not signal %s on %s (%s); the sweeper will", chat_jid, body.host, exc)
        return moved

    @router.get(
        "/groups/{chat_jid}/usage", response_model=GroupUsage, responses={404: {"description": "no such group"}}
    )
    def usage(chat_jid: str) -> GroupUsage:
        """The group's runs in the last hour and tokens today against its quotas (by the database's
        clock), the sender rate limit, and, when a quota is reached, when the next run may start."""
        try:
            return group_usage(db, settings, get_group(db, chat_jid))
        except UnknownGroup as exc:
            raise HTTPException(404, str(exc)) from exc

    @router.get("/runs", response_model=list[Run])
    def runs(
        chat_jid: str | None = None,
        state: str | None = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
    ) -> list[Run]:
        return list_runs(db, chat_jid=chat_jid, state=state, limit=limit)

    @router.get("/runs/waiting", response_model=FleetSlots)
    def runs_waiting() -> FleetSlots:
        """The fleet's run slots (``ORCHESTRATOR_MAX_CONCURRENT_RUNS``; 0: no cap), how many are
        taken, and the groups waiting for one in the order they will start."""
        return fleet_slots(db, settings.max_concurrent_runs)

    @router.get("/runs/{run_id}", response_model=Run, responses={404: {"description": "no such run"}})
    def run(run_id: str) -> Run:
        try:
            return get_run(db, run_id)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc

    @router.get(
        "/runs/{run_id}/input",
        responses={
            200: {"description": "the ContainerInput JSON, byte for byte", "content": {"application/json": {}}},
            404: {"description": "no such run, or it has no recorded input"},
        },
    )
    def run_input(run_id: str) -> Response:
        """The exact ContainerInput JSON the run sent to its container."""
        try:
            data = stored_input(db, get_run(db, run_id).id)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        if data is None:
            raise HTTPException(404, f"run {run_id} has no recorded input")
        return Response(data, media_type="application/json")

    @router.post(
        "/runs/{run_id}/replay",
        status_code=202,
        response_model=Run,
        responses={
            404: {"description": "no such run"},
            409: {"description": "the run has no recorded input that decodes: nothing to replay"},
            429: {
                "description": "the group's quota (runs per hour, tokens per day) is spent: a replay counts "
                "against it. `Retry-After`: seconds until it frees",
                "headers": {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}},
            },
            503: {"description": "the task queue did not take the replay; it was ended as failed"},
        },
    )
    def replay(run_id: str, body: ReplayRequest) -> Run | JSONResponse:
        """Replay the run's exact recorded input against ``model`` on a worker, in a scratch copy of
        the group's workspace; the chat, its workspace and its session are never touched, and what the
        replay says is never a message.  Answers with the replay run, queued: poll
        ``GET /api/runs/{id}``, then compare with ``GET /api/runs/{run_id}/diff/{id}``."""
        from orchestrator.run.replay import create_replay, fail_replay  # the sandbox's modules: only here

        try:
            made = create_replay(db, settings, run_id, body.model)
        except ReplayLimited as exc:
            retry = max(1, math.ceil(exc.retry_after_s))
            return JSONResponse(
                status_code=429,
                content={"detail": str(exc), "retry_after_s": retry},
                headers={"Retry-After": str(retry)},
            )
        except ReplayRefused as exc:
            raise HTTPException(409, str(exc)) from exc
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc
        except ConfigError as exc:  # a model the pattern lets through that the settings refuse
            return _bad_request("model", f"model: {exc}")
        try:
            root.signals.replay(made.id, made.chat_jid)
        except Exception as exc:  # noqa: BLE001 - any failure to publish: the replay never runs
            failed = fail_replay(db, made.id, f"the task queue did not take the replay: {exc}")
            raise HTTPException(503, failed.error or "the task queue did not take the replay") from exc
        return made

    @router.get(
        "/runs/{run_id}/diff/{other_id}",
        response_model=RunDiff,
        responses={404: {"description": "no such run (either of them)"}},
    )
    def run_diff(run_id: str, other_id: str) -> RunDiff:
        """Two runs side by side (an original and its replay, or two replays): replies, tool calls
        with their exit codes, tokens, cost estimate, duration, stop reason, turns."""
        try:
            return diff_runs(db, run_id, other_id)
        except StoreError as exc:
            raise HTTPException(404, str(exc)) from exc

    @router.get("/hosts", response_model=list[Host])
    def hosts(window_s: Annotated[float, Query(ge=0, le=MAX_WINDOW_S)] = ALIVE_WINDOW_S) -> list[Host]:
        """The fleet's worker hosts: alive while the last heartbeat is younger than ``window_s``
        (by the database's clock), with their unfinished runs and the groups whose lease they hold."""
        return list_hosts(db, window_s=window_s)

    api.include_router(router)
    add_inbound_route(api, db, settings, signal=signal, signal_delivery=signal_delivery, max_chars=MAX_CONTENT_CHARS)
    add_slack_route(api, db, settings, signal=signal, signal_delivery=signal_delivery, max_chars=MAX_CONTENT_CHARS)
    _add_web_page(api)
    # Added last, so it is the outermost of the app's own layers: Host, cross-site requests,
    # token and size are checked before any other middleware or route sees the request.  The
    # signed routes check their own signatures: their senders are other systems, not pages.
    api.add_middleware(RequestGuard, settings=settings, signed_paths=(INBOUND_PATH, EVENTS_PATH))
    return api


def serve_app() -> FastAPI:
    """The API server's factory (``orchestrator api`` and ``up`` run ``uvicorn --factory
    orchestrator.http.api:serve_app``): :func:`create_app` from the environment, built once
    for the process's life, then the heap settled (orchestrator/core/heap.py): what start-up
    built is never scanned by the garbage collector again."""
    app = create_app()
    heap.settle()
    return app


def _add_web_page(api: FastAPI) -> None:
    """The chat page at ``/``: plain files from ``orchestrator/web`` (no build step, nothing fetched elsewhere)."""

    @api.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={**PAGE_HEADERS, "Cache-Control": "no-cache"})

    api.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    api.add_middleware(_StaticHeaders)


class _StaticHeaders:
    """The page's headers on every answer under ``/static/`` (its 404s too).

    A plain ASGI middleware: starlette's ``@app.middleware("http")``
    (BaseHTTPMiddleware), which did this before, wrapped every request of
    every route in a task and a streamed response, about a third of a
    ``GET /health`` (docs/performance.md, "The HTTP path")."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in PAGE_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
