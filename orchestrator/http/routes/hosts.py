"""``GET /api/hosts``: the fleet's worker hosts, alive or not, with their work."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from orchestrator.http.state import api_state
from orchestrator.store.hosts import ALIVE_WINDOW_S, Host, list_hosts

router = APIRouter()

# A liveness window of a year is already meaningless; timedelta refuses far larger ones.
MAX_WINDOW_S = 366 * 86400.0


@router.get("/hosts", response_model=list[Host])
def hosts(request: Request, window_s: Annotated[float, Query(ge=0, le=MAX_WINDOW_S)] = ALIVE_WINDOW_S) -> list[Host]:
    """The fleet's worker hosts: alive while the last heartbeat is younger than ``window_s``
    (by the database's clock), with their unfinished runs and the groups whose lease they hold."""
    return list_hosts(api_state(request).db, window_s=window_s)
