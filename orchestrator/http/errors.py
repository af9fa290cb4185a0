"""One mapping from the exception tree to the API's error answers.

:data:`STATUS` is the table: an exception class and the HTTP status its
instances answer.  The most specific class of an exception's MRO that the
table names wins (a ``ReplayLimited`` is a ``ReplayRefused``: 429, not 409;
a ``ChangeRefused`` is an ``InvalidMessage``: 409, not 400); an
``OrchestratorError`` it does not name is a 500.  The handlers that
:func:`add_error_handlers` installs apply it, so a route raises and never turns
an exception into a status itself.  Every answer is an ``ErrorBody``
(``orchestrator/http/contract.py``): ``detail``; ``field`` on a 400 whose
exception names one (``InvalidMessageMetadata``, ``BadInput``);
``retry_after_s`` and ``Retry-After`` (whole seconds, at least 1) on a 429 or
503.

Also here: bad input a route names the field of (``BadInput``, raised
directly or by :func:`bad_input_in` around a call whose errors are about one
field), the 400 for what FastAPI's validation refuses (naming the field, in
place of its 422), and the 503 for a database that cannot serve for now (a
passing state, ``orchestrator.store.db.unavailable_reason``; anything else the
database raises stays a 500).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from orchestrator.core.errors import (
    BadInput,
    ChangeRefused,
    Conflict,
    DatabaseUnavailable,
    FileTooLarge,
    GroupBusy,
    HostUnavailable,
    InvalidMessage,
    NotAllowed,
    NotFound,
    OrchestratorError,
    RateLimited,
    ReplayLimited,
    ReplayRefused,
)
from orchestrator.store.db import Database, driver_message, unavailable_reason

log = logging.getLogger(__name__)

# Retry-After of a 503: a PostgreSQL restart takes seconds; a lock held elsewhere was
# already waited for (ORCHESTRATOR_API_DB_WAIT_S) before the 503.
DB_RETRY_AFTER_S = 5


STATUS: dict[type[OrchestratorError], int] = {
    InvalidMessage: 400,  # bad input; its field when the exception names one
    NotFound: 404,  # UnknownGroup (UnregisteredChatsFull too: as for any unregistered chat), MessageNotFound
    ChangeRefused: 409,  # an InvalidMessage, but well-formed: the history does not allow it
    Conflict: 409,
    NotAllowed: 403,
    GroupBusy: 409,
    HostUnavailable: 409,
    ReplayRefused: 409,
    RateLimited: 429,
    ReplayLimited: 429,
    FileTooLarge: 413,  # past ORCHESTRATOR_FILE_MAX_BYTES or the group's ORCHESTRATOR_GROUP_FILES_MAX_BYTES
    DatabaseUnavailable: 503,
}


def status_of(exc: OrchestratorError) -> int:
    """The status :data:`STATUS` gives ``exc``: its most specific class the table names, else 500."""
    return next((STATUS[kind] for kind in type(exc).__mro__ if kind in STATUS), 500)


def error_response(exc: OrchestratorError) -> JSONResponse:
    """``exc`` as the API answers it (see the module's doc)."""
    status = status_of(exc)
    body: dict[str, object] = {"detail": str(exc)}
    headers: dict[str, str] | None = None
    field = getattr(exc, "field", None)
    if status == 400 and isinstance(field, str):
        body["field"] = field
    retry_after_s = getattr(exc, "retry_after_s", None)
    if status in (429, 503) and isinstance(retry_after_s, int | float):
        seconds = max(1, math.ceil(retry_after_s))
        body["retry_after_s"] = seconds
        headers = {"Retry-After": str(seconds)}
    return JSONResponse(status_code=status, content=body, headers=headers)


@contextmanager
def bad_input_in(field: str, *kinds: type[Exception], prefix: str = "") -> Iterator[None]:
    """Inside, an exception of ``kinds`` is bad input in the request's ``field``: raised on as
    ``BadInput`` (``prefix`` before its text), which answers 400 naming that field.  For a
    call whose errors are all about one field of the request, which only the route knows."""
    try:
        yield
    except kinds as exc:
        raise BadInput(field, f"{prefix}{exc}") from exc


def _invalid_request(request: Request, exc: Exception) -> JSONResponse:
    """400 (not FastAPI's 422) with the first offending field, like every other bad input."""
    assert isinstance(exc, RequestValidationError)  # registered for it alone
    err = exc.errors()[0]
    # As the other 400s name fields: dotted, list indexes in brackets (extra_mounts[0].name).
    field = (
        "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.get("loc", ()) if p != "body").lstrip(".")
        or "body"
    )
    return error_response(BadInput(field, f"{field}: {str(err.get('msg', 'invalid')).removeprefix('Value error, ')}"))


def _orchestrator_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OrchestratorError)  # registered for it alone
    return error_response(exc)


def _database_error(request: Request, exc: Exception) -> JSONResponse:
    # A passing state of the database (restarting, locked elsewhere, disk full) is a 503 the
    # client can retry; anything else is a bug and stays a 500 (raised on, to the server's log).
    reason = unavailable_reason(exc)
    if reason is None:
        raise exc
    # The driver's words, not SQLAlchemy's text: that one quotes the statement's parameters.
    log.warning("%s %s: 503, %s: %s", request.method, request.url.path, reason, driver_message(exc))
    return error_response(DatabaseUnavailable(reason, DB_RETRY_AFTER_S))


def add_error_handlers(api: FastAPI, db: Database) -> None:
    """Install the handlers that answer with :data:`STATUS`, the validation 400 and the
    database's 503 (for every kind of error ``db`` raises: SQLAlchemy's and its driver's own,
    which the ingest path's statements raise directly)."""
    api.add_exception_handler(RequestValidationError, _invalid_request)
    api.add_exception_handler(OrchestratorError, _orchestrator_error)
    for kind in db.error_kinds:
        api.add_exception_handler(kind, _database_error)
