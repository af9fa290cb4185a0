"""What monitoring asks the API: ``GET /health`` and ``GET /metrics``.

``/health`` needs no token (it holds no data); ``/metrics`` (Prometheus' text
format: what this process counted, ``orchestrator/core/metrics.py``, and the
fleet's per-host gauges) takes the API token when one is set: counts of
messages and senders are the installation's business, and a scraper can send a
bearer token (``authorization`` in its scrape config).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from orchestrator.core import metrics
from orchestrator.http.auth import require_token
from orchestrator.http.fleet_metrics import fleet_exposition
from orchestrator.http.responses import model_response
from orchestrator.http.state import api_state
from orchestrator.store.db import Database

log = logging.getLogger(__name__)

router = APIRouter()


class Health(BaseModel):
    status: str
    database: str
    broker: str


def database_health(db: Database) -> str:
    """ "ok", or the error the database answered a ``SELECT 1`` with."""
    try:
        db.ping()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - a health check reports the failure, it does not raise it
        log.warning("health: the database does not answer: %s", exc)
        return f"error: {exc}"


@router.get("/health", response_model=Health)
async def health(request: Request) -> Response:
    state = api_state(request)
    db = state.db
    # SQLite answers a SELECT 1 in process, in microseconds, and a WAL reader never waits
    # for a writer: asked on the event loop, with no thread hop.  A server database is a
    # round trip (two with the pool's pre-ping): that one waits in the thread pool.
    database = database_health(db) if db.is_sqlite else await run_in_threadpool(database_health, db)
    broker = state.settings.effective_broker_url.split("://", 1)[0]
    return model_response(Health(status="ok" if database == "ok" else "degraded", database=database, broker=broker))


@router.get(
    "/metrics",
    dependencies=[Depends(require_token)],
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus' text format"}},
)
def prometheus_metrics(request: Request) -> Response:
    """This API process's Prometheus metrics (ingest) and the fleet's per-host gauges
    read from the database; the workers serve theirs on ORCHESTRATOR_METRICS_PORT.
    Needs the API token when one is set."""
    body, content_type = metrics.exposition()
    return Response(body + fleet_exposition(api_state(request).db), media_type=content_type)
