"""The run's input: one :class:`ContainerInput` document the host writes on the runner's stdin.

With it: the model's view of the chat (:class:`SdkMessage`), which model answers and how the
container reaches it (:class:`ModelSettings`, never a secret), the run's :class:`Limits`,
the optional tools a group may go without, and the scheduled tasks a run may manage.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta, field

from .base import JsonObject, Model

PROTOCOL_VERSION = 1

# Where a run container finds its group's session folder (read-write; the
# claude-code provider keeps the CLI's transcripts there between runs).
SESSION_MOUNT = "/session"

SdkRole = Literal["user", "assistant", "system", "tool_result"]


class SdkToolUse(Model):
    """A tool call the model made in an earlier run, as it made it."""

    id: str
    name: str
    input: JsonObject


class ImageRef(Model):
    """An image a person's message brought, for a model that sees images: the host's file id,
    its sniffed type, and where the attempt placed it below the workspace (unset: it could
    not be placed; the model is told so in its place)."""

    file_id: str
    mime: str
    path: str | msgspec.UnsetType = msgspec.UNSET


class SdkMessage(Model):
    """One message of the model's view of the chat (host messages never appear)."""

    role: SdkRole
    content: str
    sender_name: str | None = None
    timestamp: str | None = None
    metadata: JsonObject | None = None
    # An earlier run's tool call (role "assistant"; ``content`` is its text
    # for a reader) and, on a "tool_result", the id of the call it answers:
    # the runner rebuilds real tool_use/tool_result blocks from the pair.
    # The host sends only matched pairs.  Unset, they are left out of the
    # JSON, so a recorded input that predates them reads and rebuilds the same.
    tool_use: SdkToolUse | msgspec.UnsetType = msgspec.UNSET
    tool_use_id: str | msgspec.UnsetType = msgspec.UNSET
    # The images this user message brought, sent to a model that sees images as image
    # blocks (agent_runner/images.py), the runner reading each from the workspace by its
    # path: never inline here.  Only the run's own new messages carry them; older ones
    # name their files in their text.  Unset for every other message.
    images: list[ImageRef] | msgspec.UnsetType = msgspec.UNSET


class ModelSettings(Model):
    """Which model answers and how the container reaches it.

    No secret ever appears here: a real provider is reached through a gateway
    on the host that injects the key (``socket_path``), or through
    ``base_url`` for a keyless local server.
    """

    # "openai": any OpenAI-compatible Chat Completions server (Ollama, vLLM,
    # llama.cpp's server, OpenAI).
    # "claude-code": Claude Code (the Claude Agent SDK) runs the whole turn
    # loop; only in the image variant that has it (agent_runner/claude_code).
    provider: Literal["offline", "anthropic", "openai", "claude-code"] = "offline"
    model: str = "offline"
    max_tokens: Annotated[int, Meta(ge=1)] = 1024
    base_url: str | None = None
    socket_path: str | None = None
    # Anthropic extended thinking: the tokens of each answer the model may
    # think with (the API's ``budget_tokens``: at least 1024, below
    # ``max_tokens``).  Unset (thinking off), it is left out of the JSON, so
    # a recorded input that predates the field reads and rebuilds the same.
    thinking_budget: Annotated[int, Meta(ge=1024)] | msgspec.UnsetType = msgspec.UNSET


class Limits(Model):
    # Model calls in one run: enough for a real task's dozens of tool calls;
    # the run's token budget and time limit are what bound it in practice.
    max_turns: Annotated[int, Meta(ge=1)] = 50
    bash_timeout_s: Annotated[float, Meta(gt=0)] = 60.0
    output_cap_bytes: Annotated[int, Meta(ge=256)] = 16_000


# The tools a group may go without (``ContainerInput.tools``; the host's profile of a group,
# orchestrator/run/profile.py, is checked against this list): every other tool of the
# registry (agent_runner/tools) is always offered.  Each names the tools it brings.
OPTIONAL_TOOL_NAMES: Final[dict[str, tuple[str, ...]]] = {
    "send_message": ("send_message",),
    "send_file": ("send_file",),
    "schedules": ("schedule_task", "list_tasks", "update_task", "pause_task", "resume_task", "cancel_task"),
    "questions": ("ask_user",),
    "message_changes": ("edit_message", "add_reaction"),
}
OPTIONAL_TOOLS: Final = tuple(OPTIONAL_TOOL_NAMES)

ScheduleKind = Literal["cron", "interval", "once"]
ContextMode = Literal["group", "isolated"]


class TaskInfo(Model):
    """A scheduled task as a run sees it (``ContainerInput.tasks``): what ``list_tasks`` answers."""

    id: str
    chat_jid: str
    prompt: str
    kind: ScheduleKind
    spec: str
    context_mode: ContextMode
    state: Literal["active", "paused", "cancelled", "done"]
    next_run_at: str | None = None
    made_by_agent: bool = False


class ContainerInput(Model, kw_only=True):
    protocol_version: int = PROTOCOL_VERSION
    run_id: str
    chat_jid: str
    group_folder: str
    assistant_name: str
    messages: list[SdkMessage]
    system_notices: list[str] = field(default_factory=list)
    # Other chats this run's send_message may post to (the host decides and
    # checks again; this only lets the tool refuse early and say why).
    send_targets: list[str] = field(default_factory=list)
    # The optional tools (OPTIONAL_TOOLS) this run's agent is offered; the others of that list
    # are refused like an unknown tool.  Unset: all of them, and left out of the JSON, so a
    # recorded input that predates the field reads and rebuilds the same.
    tools: list[str] | msgspec.UnsetType = msgspec.UNSET
    # The scheduled tasks this run's agent may manage (its group's; the main group's: every
    # group's), as they were when the run started: what its list_tasks answers.  Unset: left
    # out of the JSON (no schedule tools, or a runner's input that predates them).
    tasks: list[TaskInfo] | msgspec.UnsetType = msgspec.UNSET
    session_id: str | None = None
    # The host's egress proxy for this attempt (a unix socket mounted read-only), when the
    # group's network policy lets anything out: the runner relays HTTP(S)_PROXY on its
    # loopback to it.  Unset: no way out at all, and left out of the JSON.
    egress_socket: str | msgspec.UnsetType = msgspec.UNSET
    # The CA bundle to trust when the proxy ends TLS for brokered hosts (the system's CAs and
    # the installation's egress CA; certificates only).  Unset: the system's alone.
    egress_ca: str | msgspec.UnsetType = msgspec.UNSET
    model: ModelSettings = field(default_factory=ModelSettings)
    limits: Limits = field(default_factory=Limits)
    # The W3C traceparent of this attempt's "agent container" span on the host, while the host
    # traces (orchestrator/core/tracing.py); the runner exports nothing itself.  Unset,
    # it is left out of the JSON, so a runner that predates the field still takes the
    # input of a host that does not trace, and a recorded input reads the same.
    traceparent: str | msgspec.UnsetType = msgspec.UNSET
    # The host keeps the run's stream (stdin, or a warm run's connection) open for the
    # run and writes a byte at least every host_fence_s / 4 seconds; when the stream ends
    # or stays silent this long before the run's final event, the runner stops every
    # process of the container and exits (agent_runner/fence.py).  Unset: no watch, and
    # the input may end at the end of the stream, as before the field.
    host_fence_s: Annotated[float, Meta(gt=0)] | msgspec.UnsetType = msgspec.UNSET
    # The installation's and the group's instructions (host-owned), and the group's memory
    # (MEMORY.md, which the agent keeps in its workspace), appended to the system prompt
    # (agent_runner/conversation.py).  Unset when there are none: left out of the JSON.
    instructions: str | msgspec.UnsetType = msgspec.UNSET
    memory: str | msgspec.UnsetType = msgspec.UNSET


_INPUT_DECODER = msgspec.json.Decoder(ContainerInput)


def decode_input(raw: str | bytes) -> ContainerInput:
    """Validate one ContainerInput document; raises :data:`ProtocolError`."""
    return _INPUT_DECODER.decode(raw)
