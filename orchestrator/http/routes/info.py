"""``GET /api/info``: what a client (the web page) needs to know about this server."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from orchestrator.http.state import api_state

router = APIRouter()


class Info(BaseModel):
    """What the web page needs to know about this server."""

    assistant_name: str
    trigger_names: list[str]
    require_registered_chat: bool
    token_required: bool
    # The largest file an upload takes (ORCHESTRATOR_FILE_MAX_BYTES): the page says so before sending.
    file_max_bytes: int


@router.get("/info", response_model=Info)
def info(request: Request) -> Info:
    settings = api_state(request).settings
    return Info(
        assistant_name=settings.assistant_name,
        trigger_names=settings.trigger_names,
        require_registered_chat=settings.api.require_registered_chat,
        token_required=bool(settings.api.token),
        file_max_bytes=settings.files.max_bytes,
    )
