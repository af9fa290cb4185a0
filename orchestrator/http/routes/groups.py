"""Groups: register, list, read and change them (name, trigger rule, assistant, sandbox,
quotas), move one to a worker host, and read its use of its quotas.  Reading one gives its
profile: the group with its scheduled tasks counted by state.

A chat or folder registered already, or a second main group, is a 409; a host
that is not up a 409 (``orchestrator/store/placement.py``).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from orchestrator.core.errors import BadInput, ContainerConfigError, InvalidMessage, MountRefused
from orchestrator.core.jsontypes import WHOLE_NUMBER, JsonBool
from orchestrator.http.contract import NO_NUL_PATTERN
from orchestrator.http.errors import bad_input_in
from orchestrator.http.state import api_state
from orchestrator.sandbox.config import ContainerConfig
from orchestrator.store.groups import (
    FOLDER_PATTERN,
    MAX_QUOTA,
    Group,
    GroupProfile,
    add_group,
    get_group,
    group_profile,
    list_groups,
    update_group,
)
from orchestrator.store.placement import Moved, move
from orchestrator.store.usage import GroupUsage, group_usage

log = logging.getLogger(__name__)

router = APIRouter()

# No whitespace or control character, spelled out: "\s" is another set in JSON Schema's ECMA
# regexes than in Python's and pydantic's Rust ones (U+0085, U+FEFF), so a client (or a fuzzer)
# reading the document would send what the server refuses.
SPACE_OR_CONTROL = r"\x00-\x20\x7f-\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
# A chat id: no whitespace or control characters.
JID_PATTERN = rf"^[^{SPACE_OR_CONTROL}]+$"
# An assistant name is the trigger word after "@": no spaces or control characters, no "@".
ASSISTANT_NAME_PATTERN = rf"^[^@{SPACE_OR_CONTROL}]{{1,64}}$"
_NO_GROUP: dict[int | str, dict[str, Any]] = {404: {"description": "no such group"}}


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


class MoveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    host: str = Field(
        min_length=1,
        max_length=256,
        pattern=NO_NUL_PATTERN,
        description="The worker host (ORCHESTRATOR_HOST_ID) to place the group on; it must be up (GET /api/hosts).",
    )


@router.get("/groups", response_model=list[Group])
def groups(request: Request) -> list[Group]:
    return list_groups(api_state(request).db)


@router.post(
    "/groups",
    status_code=201,
    response_model=Group,
    responses={
        409: {"description": "the chat or the folder is already registered, or is_main and another group is main"}
    },
)
def register_group(request: Request, body: NewGroup) -> Group:
    """Register a chat as a group; with ``is_main`` the main group (``orchestrator up`` and
    ORCHESTRATOR_MAIN_GROUP make one on start)."""
    # The body's pattern is the store's folder rule: a refusal of the store's is the folder's.
    with bad_input_in("folder", InvalidMessage):
        return add_group(
            api_state(request).db,
            chat_jid=body.chat_jid,
            name=body.name,
            folder=body.folder,
            is_main=body.is_main,
            requires_trigger=body.requires_trigger,
            assistant_name=body.assistant_name,
        )


@router.get("/groups/{chat_jid}", response_model=GroupProfile, responses=_NO_GROUP)
def group(request: Request, chat_jid: str) -> GroupProfile:
    """The group's profile: its registration, its sandbox (``container_config``) and quotas as
    stored (null: the settings'), and its scheduled tasks counted by state."""
    return group_profile(api_state(request).db, chat_jid)


@router.patch("/groups/{chat_jid}", response_model=Group, responses=_NO_GROUP)
def change_group(request: Request, chat_jid: str, body: GroupChanges) -> Group:
    """Change a group's name, trigger rule, assistant name, sandbox or quotas; only the fields given."""
    from orchestrator.sandbox.config import set_container_config

    state = api_state(request)
    db = state.db
    given = body.model_fields_set
    for key in ("name", "requires_trigger"):
        if key in given and getattr(body, key) is None:
            raise BadInput(key, f"{key}: must not be null")
    get_group(db, chat_jid)  # 404 before anything changes
    if "container_config" in given:
        config = body.container_config
        with (
            bad_input_in("container_config", ContainerConfigError),
            bad_input_in("container_config.extra_mounts", MountRefused),
        ):
            set_container_config(
                db,
                state.settings,
                chat_jid,
                None if config is None else config.model_dump(mode="json", exclude_defaults=True),
            )
    changes = {k: getattr(body, k) for k in given if k != "container_config"}
    return update_group(db, chat_jid, changes) if changes else get_group(db, chat_jid)


@router.post(
    "/groups/{chat_jid}/move",
    response_model=Moved,
    responses={
        **_NO_GROUP,
        409: {"description": "the host is not up (dead, stopped, draining or unknown)"},
    },
)
def move_group(request: Request, chat_jid: str, body: MoveRequest) -> Moved:
    """Place the group on a worker host: its next runs go there (a run in progress finishes
    where it is; the old host stops the group's warm container).  Pending work is signalled there."""
    state = api_state(request)
    moved = move(state.db, chat_jid, body.host)
    if moved.pending:
        try:
            state.signal(chat_jid)
            moved = moved.model_copy(update={"signalled": True})
        except Exception as exc:  # noqa: BLE001 - the sweeper re-signals pending groups
            log.warning("could not signal %s on %s (%s); the sweeper will", chat_jid, body.host, exc)
    return moved


@router.get("/groups/{chat_jid}/usage", response_model=GroupUsage, responses=_NO_GROUP)
def usage(request: Request, chat_jid: str) -> GroupUsage:
    """The group's runs in the last hour and tokens today against its quotas (by the database's
    clock), the sender rate limit, and, when a quota is reached, when the next run may start."""
    state = api_state(request)
    return group_usage(state.db, state.settings, get_group(state.db, chat_jid))
