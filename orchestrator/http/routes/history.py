"""A chat's history: change it (edit, regenerate, truncate: ``orchestrator/store/history.py``)
and export it.

A change the message's state does not allow, or one while a run is in progress in
the chat, is a 409; a change that moves the cursor waits for no running agent.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema

from orchestrator.core.jsontypes import JsonBool, JsonObject
from orchestrator.http.contract import NO_NUL_PATTERN, inline_json_schema
from orchestrator.http.routes.messages import MAX_CONTENT_CHARS
from orchestrator.http.state import api_state
from orchestrator.model.context import MAX_ITEMS, ContextItem
from orchestrator.store.history import HistoryChange, edit_message, regenerate, truncate_after
from orchestrator.store.transfer import export_json, export_markdown

router = APIRouter()

# What edit, regenerate and truncate may answer besides their 200 (and the shared 400 and 401).
HISTORY_CHANGE_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such registered chat, or no such message in it"},
    409: {
        "description": "the message's state does not allow the change (superseded; not a person's "
        "message to edit; not a reply to regenerate), or a run is in progress in the chat"
    },
}

# The context items an edit may give, as the document states them; checked by
# orchestrator/model/context.py (parse_context), whose 400 names the field as in a message's metadata.
_CONTEXT_ITEMS = {**inline_json_schema(TypeAdapter(list[ContextItem])), "maxItems": MAX_ITEMS}


class EditRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    content: str = Field(max_length=MAX_CONTENT_CHARS, pattern=NO_NUL_PATTERN)
    context: Annotated[list[JsonObject] | None, WithJsonSchema({"anyOf": [_CONTEXT_ITEMS, {"type": "null"}]})] = None
    rerun: JsonBool = False


@router.post(
    "/chats/{chat_jid}/messages/{message_id}/edit", response_model=HistoryChange, responses=HISTORY_CHANGE_ERRORS
)
def edit(request: Request, chat_jid: str, message_id: str, body: EditRequest) -> HistoryChange:
    state = api_state(request)
    return edit_message(
        state.db,
        state.settings,
        chat_jid,
        message_id,
        body.content,
        context=body.context,
        rerun=body.rerun,
        signal=state.signal,
        signal_delivery=state.signal_delivery,
    )


@router.post(
    "/chats/{chat_jid}/messages/{message_id}/regenerate",
    response_model=HistoryChange,
    responses=HISTORY_CHANGE_ERRORS,
)
def regenerate_reply(request: Request, chat_jid: str, message_id: str) -> HistoryChange:
    state = api_state(request)
    return regenerate(
        state.db, state.settings, chat_jid, message_id, signal=state.signal, signal_delivery=state.signal_delivery
    )


@router.post(
    "/chats/{chat_jid}/messages/{message_id}/truncate",
    response_model=HistoryChange,
    responses=HISTORY_CHANGE_ERRORS,
)
def truncate(request: Request, chat_jid: str, message_id: str) -> HistoryChange:
    state = api_state(request)
    return truncate_after(state.db, state.settings, chat_jid, message_id, signal_delivery=state.signal_delivery)


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
def export(request: Request, chat_jid: str, format: Annotated[str, Query(pattern="^(md|json)$")] = "json") -> Response:
    state = api_state(request)
    if format == "json":
        return Response(export_json(state.db, chat_jid), media_type="application/json")
    return PlainTextResponse(
        export_markdown(state.db, chat_jid, state.settings.assistant_name), media_type="text/markdown"
    )
