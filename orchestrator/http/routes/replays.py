"""Replays: run a run's exact recorded input again against another model, on a worker, in a
scratch copy of the group's workspace (``orchestrator/run/replay.py``), and compare two runs.

No such run is a 404; a run with no recorded input that decodes a 409; a group whose
quota is spent, or a fleet with no run slot free, a 429 with ``Retry-After``.
"""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import ConfigError
from orchestrator.http.errors import bad_input_in
from orchestrator.http.state import api_state
from orchestrator.run.run_diff import RunDiff, diff_runs
from orchestrator.store.runs import Run

router = APIRouter()


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^(offline|(anthropic|openai):[^\x00\s]+)$",
        description="The model to replay the run with, as ORCHESTRATOR_MODEL spells it: `offline`, "
        "`anthropic:<model id>` or `openai:<model id>`.",
    )


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
def replay(request: Request, run_id: str, body: ReplayRequest) -> Run:
    """Replay the run's exact recorded input against ``model`` on a worker, in a scratch copy of
    the group's workspace; the chat, its workspace and its session are never touched, and what the
    replay says is never a message.  Answers with the replay run, queued: poll
    ``GET /api/runs/{id}``, then compare with ``GET /api/runs/{run_id}/diff/{id}``."""
    from orchestrator.run.replay import create_replay, fail_replay  # the sandbox's modules: only here

    state = api_state(request)
    # A model the pattern lets through that the settings refuse.
    with bad_input_in("model", ConfigError, prefix="model: "):
        made = create_replay(state.db, state.settings, run_id, body.model)
    try:
        state.root.signals.replay(made.id, made.chat_jid)
    except Exception as exc:  # any failure to publish: the replay never runs
        failed = fail_replay(state.db, made.id, f"the task queue did not take the replay: {exc}")
        raise HTTPException(503, failed.error or "the task queue did not take the replay") from exc
    return made


@router.get(
    "/runs/{run_id}/diff/{other_id}",
    response_model=RunDiff,
    responses={404: {"description": "no such run (either of them)"}},
)
def run_diff(request: Request, run_id: str, other_id: str) -> RunDiff:
    """Two runs side by side (an original and its replay, or two replays): replies, tool calls
    with their exit codes, tokens, cost estimate, duration, stop reason, turns."""
    return diff_runs(api_state(request).db, run_id, other_id)
