"""Groups: register, list, read and change them (name, trigger rule, assistant, sandbox,
quotas, and the group's own model, output cap, thinking budget, trigger names and optional
tools), move one to a worker host, and read its use of its quotas.  Reading one gives its
profile: the group as stored, what is in effect, and its scheduled tasks counted by state.
A change is checked and made by ``orchestrator/run/profile.py``, as the command line's,
with a host message in the chat saying what changed.

A chat or folder registered already, or a second main group, is a 409; a host
that is not up a 409 (``orchestrator/store/placement.py``).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from agent_runner.protocol import OPTIONAL_TOOLS
from orchestrator.core.errors import BadInput, InvalidMessage
from orchestrator.core.jsontypes import WHOLE_NUMBER, JsonBool
from orchestrator.http.contract import NO_NUL_PATTERN
from orchestrator.http.errors import bad_input_in
from orchestrator.http.state import api_state
from orchestrator.run.model_choice import MIN_THINKING_BUDGET
from orchestrator.run.profile import (
    IDENTITY_PATTERN,
    MAX_APPROVERS,
    MAX_TRIGGER_NAMES,
    MODEL_PATTERN,
    NAME_PATTERN,
    SPACE_OR_CONTROL,
    ProfileView,
    change_profile,
    profile_view,
)
from orchestrator.sandbox.config import ContainerConfig
from orchestrator.store.groups import (
    FOLDER_PATTERN,
    MAX_QUOTA,
    Group,
    add_group,
    get_group,
    list_groups,
)
from orchestrator.store.placement import Moved, move
from orchestrator.store.usage import GroupUsage, group_usage

log = logging.getLogger(__name__)

router = APIRouter()

# A chat id: no whitespace or control characters (SPACE_OR_CONTROL: spelled out for JSON Schema).
JID_PATTERN = rf"^[^{SPACE_OR_CONTROL}]+$"
# An assistant name is the trigger word after "@": no spaces or control characters, no "@".
ASSISTANT_NAME_PATTERN = NAME_PATTERN
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
    """Only the fields given change; ``null`` goes back to the installation's setting
    (``assistant_name``, ``container_config``, the quotas and the profile's own model,
    ``max_tokens``, ``thinking_budget``, ``trigger_names`` and ``tools``).  A change is
    stated in the group's chat as a host message (old -> new)."""

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
    model: str | None = Field(
        default=None,
        pattern=MODEL_PATTERN,
        description="The group's model, spelled as ORCHESTRATOR_MODEL ('offline', 'anthropic:<model id>', "
        "'openai:<model id>', 'claude-code:<model id>'); null: ORCHESTRATOR_MODEL.  Refused (400) for a provider "
        "this installation is not configured for (ORCHESTRATOR_ANTHROPIC_API_KEY for anthropic and claude-code, "
        "ORCHESTRATOR_OPENAI_BASE_URL for openai) and, for claude-code, while its image is not built on the "
        "API's host (`orchestrator image build --variant claude-code`).  A change of model starts the group's "
        "session afresh.",
    )
    max_tokens: Annotated[int, Field(ge=1, le=MAX_QUOTA), WHOLE_NUMBER] | None = Field(
        default=None, description="Output tokens of one model answer; null: ORCHESTRATOR_MAX_TOKENS."
    )
    thinking_budget: Annotated[int, Field(ge=0, le=MAX_QUOTA), WHOLE_NUMBER] | None = Field(
        default=None,
        description=f"Tokens each answer may think with, for a model that thinks (anthropic, claude-code): 0 (off), "
        f"or at least {MIN_THINKING_BUDGET} and below the max tokens in effect (else 400); null: "
        "ORCHESTRATOR_THINKING_BUDGET.",
    )
    trigger_names: (
        Annotated[list[Annotated[str, Field(pattern=NAME_PATTERN)]], Field(min_length=1, max_length=MAX_TRIGGER_NAMES)]
        | None
    ) = Field(
        default=None,
        description="The names whose @Name wakes the group (besides its assistant_name), replacing the "
        "installation's (ORCHESTRATOR_ASSISTANT_NAME and ORCHESTRATOR_TRIGGER_ALIASES); null: the installation's.",
    )
    tools: list[Annotated[str, Field(json_schema_extra={"enum": list(OPTIONAL_TOOLS)})]] | None = Field(
        default=None,
        description=f"The optional tools the group's agent has (of {', '.join(OPTIONAL_TOOLS)}); null: all of them.",
    )
    approvers: (
        Annotated[list[Annotated[str, Field(pattern=IDENTITY_PATTERN)]], Field(min_length=1, max_length=MAX_APPROVERS)]
        | None
    ) = Field(
        default=None,
        description="Who may answer the agent's questions: sender ids as the group's channels give them "
        "(slack:U123 for a Slack user, tg:42 for a Telegram user); null: anyone in the chat.  The API answers as the operator.",
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


@router.get("/groups/{chat_jid}", response_model=ProfileView, responses=_NO_GROUP)
def group(request: Request, chat_jid: str) -> ProfileView:
    """The group's profile: its registration, its sandbox (``container_config``), quotas, model,
    output cap, thinking budget, trigger names and tools as stored (null: the installation's),
    what its runs get (``in_effect``), what each null gives (``installation``), and its
    scheduled tasks counted by state."""
    state = api_state(request)
    return profile_view(state.db, state.settings, chat_jid)


@router.patch("/groups/{chat_jid}", response_model=Group, responses=_NO_GROUP)
def change_group(request: Request, chat_jid: str, body: GroupChanges) -> Group:
    """Change a group's name, trigger rule, assistant name, sandbox, quotas, model, output cap,
    thinking budget, trigger names or tools; only the fields given, all or none of them.  What
    changed is stated in the group's chat as a host message; a change of model starts the
    group's session afresh (as ``orchestrator groups reset``)."""
    state = api_state(request)
    given = body.model_fields_set
    for key in ("name", "requires_trigger"):
        if key in given and getattr(body, key) is None:
            raise BadInput(key, f"{key}: must not be null")
    changes: dict[str, object] = {k: getattr(body, k) for k in given}
    if body.container_config is not None:
        changes["container_config"] = body.container_config.model_dump(mode="json", exclude_defaults=True)
    return change_profile(state.db, state.settings, chat_jid, changes, signal_delivery=state.signal_delivery).group


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
