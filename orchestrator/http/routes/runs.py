"""Runs: list them, read one and the exact input it sent to its container, and the line for
a run slot (the fleet's cap, ``ORCHESTRATOR_MAX_CONCURRENT_RUNS``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from orchestrator.core.errors import NotFound
from orchestrator.http.state import api_state
from orchestrator.run.assembly import stored_input
from orchestrator.run.egress_log import EgressLog, run_egress
from orchestrator.store.runs import Run, get_run, list_runs
from orchestrator.store.slots import FleetSlots, fleet_slots

router = APIRouter()


@router.get("/runs", response_model=list[Run])
def runs(
    request: Request,
    chat_jid: str | None = None,
    state: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[Run]:
    return list_runs(api_state(request).db, chat_jid=chat_jid, state=state, limit=limit)


# Before /runs/{run_id}, which would take "waiting" for a run's id.
@router.get("/runs/waiting", response_model=FleetSlots)
def runs_waiting(request: Request) -> FleetSlots:
    """The fleet's run slots (``ORCHESTRATOR_MAX_CONCURRENT_RUNS``; 0: no cap), how many are
    taken, and the groups waiting for one in the order they will start."""
    state = api_state(request)
    return fleet_slots(state.db, state.settings.fleet.max_concurrent_runs)


@router.get("/runs/{run_id}", response_model=Run, responses={404: {"description": "no such run"}})
def run(request: Request, run_id: str) -> Run:
    return get_run(api_state(request).db, run_id)


@router.get(
    "/runs/{run_id}/input",
    responses={
        200: {"description": "the ContainerInput JSON, byte for byte", "content": {"application/json": {}}},
        404: {"description": "no such run, or it has no recorded input"},
    },
)
def run_input(request: Request, run_id: str) -> Response:
    """The exact ContainerInput JSON the run sent to its container."""
    db = api_state(request).db
    data = stored_input(db, get_run(db, run_id).id)
    if data is None:
        raise NotFound(f"run {run_id} has no recorded input")
    return Response(data, media_type="application/json")


@router.get("/runs/{run_id}/egress", response_model=EgressLog, responses={404: {"description": "no such run"}})
def run_egress_log(request: Request, run_id: str) -> EgressLog:
    """Every egress decision of the run's sandbox (its group's network policy, the egress
    proxy's verdict and why, bytes each way), up to the log's cap, with a count of the rest."""
    return run_egress(api_state(request).db, run_id)
