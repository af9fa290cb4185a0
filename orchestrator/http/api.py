"""The HTTP API (FastAPI; OpenAPI docs at /docs) and the web chat page at ``/``: the app, composed.

:func:`create_app` builds the app of an installation and composes it: the
shared parts on the app's state (``orchestrator/http/state.py``), the routers
of ``orchestrator/http/routes/`` (a module per topic: health and metrics, info,
messages, the event stream, history and export, files, groups, runs, replays, scheduled tasks, questions,
hosts,
the signed channel routes, the page), the exception handlers that map the
exception tree to statuses (``orchestrator/http/errors.py``) and the request
guard.  What each route answers is in its module and in the OpenAPI document
(``orchestrator/http/contract.py`` adds what all routes share;
``tests/host/test_api_contract.py`` holds the server to it).

Every ``/api`` route takes ``Authorization: Bearer <ORCHESTRATOR_API_TOKEN>``
when a token is set (compared in constant time; 401 otherwise:
``orchestrator/http/auth.py``); without one (loopback only), a POST, PUT, PATCH
or DELETE needs ``X-Orchestrator-Client`` and no sign of another site's page
(``orchestrator/http/guards.py``).  Serving beyond loopback without a token is
refused at start-up (:func:`check_exposure`).  ``/health``, the page and its
static files need no token (they hold no data); ``GET /metrics`` takes the same
token as ``/api`` when one is set; the inbound webhook and Slack's events carry
their own signatures.
"""

from __future__ import annotations

import ipaddress

from fastapi import Depends, FastAPI

from orchestrator.channels.slack_clicks import INTERACTIONS_PATH
from orchestrator.channels.slack_inbound import EVENTS_PATH, SlackEvents
from orchestrator.channels.webhook import INBOUND_PATH, InboundWebhook
from orchestrator.core import heap
from orchestrator.core.errors import ConfigError
from orchestrator.core.process import set_up_process
from orchestrator.http.auth import WRONG_INSTALL, api_checks
from orchestrator.http.contract import allow_every_method, document_shared_errors
from orchestrator.http.errors import DB_RETRY_AFTER_S, add_error_handlers
from orchestrator.http.guards import RequestGuard
from orchestrator.http.routes import (
    chat_stream,
    files,
    groups,
    history,
    hosts,
    info,
    messages,
    monitoring,
    page,
    questions,
    replays,
    runs,
    slack,
    tasks,
    webhooks,
)
from orchestrator.http.routes.messages import MAX_CONTENT_CHARS
from orchestrator.http.state import ApiState, keep_state
from orchestrator.root import Orchestrator

__all__ = ["DB_RETRY_AFTER_S", "MAX_CONTENT_CHARS", "check_exposure", "create_app", "is_loopback", "serve_app"]

# The /api routers, in the order of the document's paths (and of matching: /runs/waiting
# before /runs/{run_id}).
API_ROUTERS = (info, messages, chat_stream, history, files, groups, runs, replays, tasks, questions, hosts)


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


def create_app(root: Orchestrator | None = None) -> FastAPI:
    """The API of the installation ``root`` (default: built from the environment, as
    :func:`serve_app` builds it for the server)."""
    root = root or Orchestrator.from_environment()
    settings = root.settings
    check_exposure(settings.api.host, settings.api.token)
    settings.ensure_dirs()
    db = root.db
    db.limit_wait(settings.api.db_wait_s)  # a caller waits: 503 after a few seconds, not the workers' 60
    signal, signal_delivery = root.signals.group, root.signals.delivery
    api = FastAPI(title="Agent orchestrator", version="0.1.0")
    keep_state(
        api,
        ApiState(
            root=root,
            settings=settings,
            db=db,
            signal=signal,
            signal_delivery=signal_delivery,
            posts=messages.post_batches(db, settings, signal=signal, signal_delivery=signal_delivery),
            webhook=InboundWebhook(
                db, settings, signal=signal, signal_delivery=signal_delivery, max_chars=MAX_CONTENT_CHARS
            ),
            slack=SlackEvents(
                db, settings, signal=signal, signal_delivery=signal_delivery, max_chars=MAX_CONTENT_CHARS
            ),
        ),
    )
    document_shared_errors(api)  # the 400, 401 and error bodies every route shares
    allow_every_method(api)
    add_error_handlers(api, db)

    api.include_router(monitoring.router)
    for topic in API_ROUTERS:  # each behind the token, the install header and the NUL check
        api.include_router(topic.router, prefix="/api", dependencies=[Depends(api_checks)], responses=WRONG_INSTALL)
    api.include_router(webhooks.router)
    api.include_router(files.link_router)
    api.include_router(slack.router)
    api.include_router(page.router)
    page.mount_static(api)
    # Added last, so it is the outermost of the app's own layers: Host, cross-site requests,
    # token and size are checked before any other middleware or route sees the request.  The
    # signed routes check their own signatures: their senders are other systems, not pages.
    # The file upload streams its body, with a limit of its own (orchestrator/http/routes/files.py).
    api.add_middleware(
        RequestGuard,
        settings=settings,
        signed_paths=(INBOUND_PATH, EVENTS_PATH, INTERACTIONS_PATH),
        streamed=(files.upload_body_limit(settings),),
    )
    return api


def serve_app() -> FastAPI:
    """The API server's factory (``orchestrator api`` and ``up`` run ``uvicorn --factory
    orchestrator.http.api:serve_app``): :func:`create_app` from the environment, built once
    for the process's life, then the heap settled (orchestrator/core/heap.py): what start-up
    built is never scanned by the garbage collector again."""
    root = Orchestrator.from_environment()
    # The server's process: its secrets hidden in every log line, its trace exporters
    # (a root sets nothing process-wide: orchestrator/core/process.py).
    set_up_process(root.settings)
    app = create_app(root)
    heap.settle()
    return app
