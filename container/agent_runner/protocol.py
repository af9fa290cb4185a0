"""The host <-> container protocol: the one contract both sides share.

The host writes one :class:`ContainerInput` JSON document on the container's
stdin, as one line; it then keeps stdin open for the run when the input has
``host_fence_s`` (its beats, ``agent_runner/fence.py``) and closes it
otherwise.  The container writes one :data:`Event` JSON object per
line on stdout (logs go to stderr).  A line that does not parse as an event is
reported by the host and skipped, never fatal.

This module is imported by the host (``orchestrator``) and by the runner in
the image, so it depends on msgspec alone.  msgspec, not pydantic: every cold
run starts a fresh interpreter in a fresh container, and importing pydantic
and building these models cost about 230 ms of that start (msgspec: ~15 ms;
docs/performance.md).  Structs validate when decoded (:func:`decode_input`,
:func:`parse_event`), not when constructed in code.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import UnionType
from typing import Annotated, Any, Final, Literal, NamedTuple, TypeAlias, TypeVar, Union, get_args, get_origin

import msgspec
from msgspec import Meta, field

PROTOCOL_VERSION = 1

# Where a run container finds its group's session folder (read-write; the
# claude-code provider keeps the CLI's transcripts there between runs).
SESSION_MOUNT = "/session"

# A JSON object whose keys are open: a message's metadata (legacy keys and
# extras ride along), a tool call's input (each tool reads its own), an
# envelope on the wire (checked by the host on its own, see ToolResultEvent).
# Everything with a fixed set of keys has a Struct (or a TypedDict) of its own.
JsonObject: TypeAlias = dict[str, Any]

# Raised by the decoders below on malformed JSON or a document that does not
# fit the model (msgspec.ValidationError is a DecodeError).
ProtocolError = msgspec.DecodeError

_S = TypeVar("_S", bound="_Model")
_F = TypeVar("_F", bound="_FrozenModel")


class _Model(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Unknown fields are a protocol error, not something to silently drop.

    def to_json(self) -> bytes:
        return _ENCODER.encode(self)

    def replace(self: _S, **changes: Any) -> _S:
        return msgspec.structs.replace(self, **changes)


class _FrozenModel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    # _Model, immutable.  A root of its own, not a subclass of _Model: msgspec
    # would allow that, but type checkers hold Structs to the dataclass rule
    # (a frozen class under a mutable one is an error).  Its subclasses say
    # frozen=True again for the same reason (msgspec inherits it anyway).

    def to_json(self) -> bytes:
        return _ENCODER.encode(self)

    def replace(self: _F, **changes: Any) -> _F:
        return msgspec.structs.replace(self, **changes)


_ENCODER = msgspec.json.Encoder()


# ---------------------------------------------------------------------------
# Input
# ---------------------------------------------------------------------------

SdkRole = Literal["user", "assistant", "system", "tool_result"]


class SdkToolUse(_Model):
    """A tool call the model made in an earlier run, as it made it."""

    id: str
    name: str
    input: JsonObject


class ImageRef(_Model):
    """An image a person's message brought, for a model that sees images: the host's file id,
    its sniffed type, and where the attempt placed it below the workspace (unset: it could
    not be placed; the model is told so in its place)."""

    file_id: str
    mime: str
    path: str | msgspec.UnsetType = msgspec.UNSET


class SdkMessage(_Model):
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


class ModelSettings(_Model):
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


class Limits(_Model):
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
TaskAction = Literal["create", "update", "pause", "resume", "cancel"]


class TaskInfo(_Model):
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


class ContainerInput(_Model, kw_only=True):
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


# ---------------------------------------------------------------------------
# Envelopes: the structured view of a tool result, kept in a message's metadata
# ---------------------------------------------------------------------------
#
# The one definition of the envelope schema: the runner builds these Structs
# (``agent_runner.envelopes``), the host validates stored and received
# metadata with them (``orchestrator.model.envelopes``).  On the wire and in
# the database an envelope is ``{"message_type": T, "version": N, "payload":
# {...}}``, the type as the Struct's tag, keys in that order.  The host may
# add top-level extras next to those three keys; it takes them off before
# validating, so the Structs refuse unknown keys like every protocol model.
#
# Known types are validated here; an envelope of any other type decodes to an
# :class:`OtherEnvelope` with its payload untouched: a newer writer must not
# be rejected by an older reader.

ENVELOPE_VERSION = 1
ENVELOPE_KEYS = ("message_type", "version", "payload")
# Plain text: the words are the message's content, the payload is empty.
# Only the host writes TEXT envelopes (and checks them itself).
TEXT = "TEXT"
CODE_EDIT = "CODE_EDIT"
TODO = "TODO"
TOOL_CALL = "TOOL_CALL"
# Files a message carries (a person's attachments, or what the agent sent with send_file):
# each named by the host's file id; the bytes live in the host's file store.
FILE = "FILE"
# The files one message may carry.
MAX_FILES_PER_MESSAGE = 20
# A question the agent asked its group, with its options (``ask_user``).  Only the host
# writes APPROVAL envelopes: a sender or an import posting one is refused.
APPROVAL = "APPROVAL"
# A question's options: at least two, at most ten; each a button's label, within Slack's
# 75 characters.  The question itself within a Slack section's text and then some room.
MIN_OPTIONS = 2
MAX_OPTIONS = 10
MAX_OPTION_CHARS = 75
MAX_QUESTION_CHARS = 2000


class _Payload(_FrozenModel, frozen=True):
    # Unknown keys refused (``_FrozenModel``): a typo'd key would otherwise be dropped
    # silently and the data lost.
    pass


class FileEdit(_Payload, frozen=True):
    file_path: Annotated[str, Meta(min_length=1)]
    old_content: str | None = None  # None: the file did not exist before
    new_content: str | None = None  # None: the file was deleted
    language: str | None = None


class CodeEditPayload(_Payload, frozen=True):
    edits: Annotated[list[FileEdit], Meta(min_length=1)]


TodoStatus = Literal["pending", "in_progress", "completed"]


class TodoItem(_Payload, frozen=True):
    id: str
    content: str
    status: TodoStatus


class TodoPayload(_Payload, frozen=True):
    todos: Annotated[list[TodoItem], Meta(min_length=1)]


class ToolCallPayload(_Payload, frozen=True):
    tool_name: Annotated[str, Meta(min_length=1)]
    input: JsonObject = field(default_factory=dict)
    output: Any = None
    error: str | None = None


class FileRef(_Payload, frozen=True):
    """One file of a message: the host's id for it, and what the host sniffed and counted
    (a sender's or an import's name, type and size are replaced by the stored ones)."""

    id: Annotated[str, Meta(min_length=1, max_length=64)]
    name: Annotated[str, Meta(min_length=1)]
    mime: Annotated[str, Meta(min_length=1)]
    size: Annotated[int, Meta(ge=0)]
    # Raster images: the picture's size in pixels, read from its header (a preview's shape).
    width: Annotated[int, Meta(ge=1)] | None = None
    height: Annotated[int, Meta(ge=1)] | None = None


class FilePayload(_Payload, frozen=True):
    files: Annotated[list[FileRef], Meta(min_length=1, max_length=MAX_FILES_PER_MESSAGE)]


class ApprovalPayload(_Payload, frozen=True):
    """A question with options: single or multiple choice, with free text or without."""

    question_id: Annotated[str, Meta(min_length=1, max_length=16)]
    question: Annotated[str, Meta(min_length=1, max_length=MAX_QUESTION_CHARS)]
    options: Annotated[
        list[Annotated[str, Meta(min_length=1, max_length=MAX_OPTION_CHARS)]],
        Meta(min_length=MIN_OPTIONS, max_length=MAX_OPTIONS),
    ]
    multiple: bool = False
    allow_other: bool = False


class _Envelope(_FrozenModel, tag_field="message_type", frozen=True):
    # The type is the struct's tag, written first as "message_type".

    @property
    def message_type(self) -> str:
        return str(self.__struct_config__.tag)


class CodeEditEnvelope(_Envelope, tag=CODE_EDIT, kw_only=True, frozen=True):
    """A file tool's successful write or edit: each file's text before and after."""

    version: Annotated[int, Meta(ge=1)] = ENVELOPE_VERSION
    payload: CodeEditPayload


class TodoEnvelope(_Envelope, tag=TODO, kw_only=True, frozen=True):
    """The agent's whole todo list after a ``todo_write``."""

    version: Annotated[int, Meta(ge=1)] = ENVELOPE_VERSION
    payload: TodoPayload


class ToolCallEnvelope(_Envelope, tag=TOOL_CALL, kw_only=True, frozen=True):
    """Any other call (failed file tool calls included): name, input, output or error."""

    version: Annotated[int, Meta(ge=1)] = ENVELOPE_VERSION
    payload: ToolCallPayload


class FileEnvelope(_Envelope, tag=FILE, kw_only=True, frozen=True):
    """A message's files (its words stay in the message's content, as TEXT's do)."""

    version: Annotated[int, Meta(ge=1)] = ENVELOPE_VERSION
    payload: FilePayload


class ApprovalEnvelope(_Envelope, tag=APPROVAL, kw_only=True, frozen=True):
    """The agent's question to its group (stored by the host alone; orchestrator/run/questions.py)."""

    version: Annotated[int, Meta(ge=1)] = ENVELOPE_VERSION
    payload: ApprovalPayload


class OtherEnvelope(_FrozenModel, frozen=True):
    """An envelope of a type this side does not know (or TEXT): its payload unchecked."""

    message_type: Annotated[str, Meta(min_length=1)]
    version: Annotated[int, Meta(ge=1)] = ENVELOPE_VERSION
    payload: Any = field(default_factory=dict)


KnownEnvelope = Union[CodeEditEnvelope, TodoEnvelope, ToolCallEnvelope, FileEnvelope, ApprovalEnvelope]
Envelope = Union[CodeEditEnvelope, TodoEnvelope, ToolCallEnvelope, FileEnvelope, ApprovalEnvelope, OtherEnvelope]
ENVELOPE_TYPES: dict[
    str,
    type[CodeEditEnvelope] | type[TodoEnvelope] | type[ToolCallEnvelope] | type[FileEnvelope] | type[ApprovalEnvelope],
] = {
    CODE_EDIT: CodeEditEnvelope,
    TODO: TodoEnvelope,
    TOOL_CALL: ToolCallEnvelope,
    FILE: FileEnvelope,
    APPROVAL: ApprovalEnvelope,
}


def envelope_from_dict(data: Mapping[str, Any]) -> Envelope:
    """Validate one envelope (its three keys, no extras) into its Struct; raises :data:`ProtocolError`.

    A type not in :data:`ENVELOPE_TYPES` comes back as an :class:`OtherEnvelope`.
    The error's message names the offending path (``... - at `$.payload.edits[0]```).
    """
    message_type = data.get("message_type")
    known = ENVELOPE_TYPES.get(message_type) if isinstance(message_type, str) else None
    target: type[Envelope] = known or OtherEnvelope
    return msgspec.convert(data, target)


def envelope_to_dict(envelope: Envelope) -> JsonObject:
    """The wire (and stored) form: ``{"message_type", "version", "payload"}``, in that order.

    A plain object, not a TypedDict: it fills :attr:`ToolResultEvent.envelope`,
    open on purpose (see there)."""
    out: JsonObject = msgspec.to_builtins(envelope)
    return out


_LOC_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def literal_choices(root: Any, loc: str) -> tuple[Any, ...] | None:
    """The values, in their declared order, of the ``Literal`` at ``loc`` in ``root``.

    ``loc`` names a place as msgspec's errors do (``$.payload.edits[0].status``), so both
    sides can say which words a refused one may be (envelopes on the host, tool arguments
    in the runner).  None when no Literal is there.
    """
    return _literal_at(root, _LOC_STEP.findall(loc))


def _literal_at(hint: Any, steps: list[tuple[str, str]]) -> tuple[Any, ...] | None:
    origin = get_origin(hint)
    if origin is Annotated:
        return _literal_at(get_args(hint)[0], steps)
    if origin in (Union, UnionType):  # ``X | None``: the member that has the place
        return next((found for arg in get_args(hint) if (found := _literal_at(arg, steps)) is not None), None)
    if not steps:
        return get_args(hint) if origin is Literal else None
    (name, index), rest = steps[0], steps[1:]
    if name and isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        named = next((f for f in msgspec.structs.fields(hint) if f.encode_name == name), None)
        return None if named is None else _literal_at(named.type, rest)
    if index and origin is list:
        return _literal_at(get_args(hint)[0], rest)
    return None


# ---------------------------------------------------------------------------
# Output events (one JSON object per stdout line)
# ---------------------------------------------------------------------------


class Usage(_Model):
    input_tokens: int = 0  # every prompt token, cache reads and writes included
    output_tokens: int = 0
    # The part of ``input_tokens`` read from or written to Anthropic's prompt
    # cache (priced apart: orchestrator/model/pricing.py); 0 when not reported.
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


class _Event(_Model, tag_field="type"):
    # Each event's JSON carries its kind in "type" (the struct's tag).

    @property
    def type(self) -> str:
        return str(self.__struct_config__.tag)


class AssistantEvent(_Event, tag="assistant"):
    """Text the model says to the chat."""

    text: str


class TextDeltaEvent(_Event, tag="text_delta"):
    """Text of the answer being written, for people to watch (never stored).

    ``block`` names the text block within the run (the model call and the
    block's place in its answer, e.g. ``"3.0"``); ``text`` continues what
    the block's earlier deltas said.  The block's :class:`AssistantEvent`
    follows with the whole text, and that is what the host keeps.
    """

    block: str
    text: str


class ThinkingEvent(_Event, tag="thinking"):
    text: str


class ToolUseEvent(_Event, tag="tool_use"):
    id: str
    name: str
    input: JsonObject


class ToolResultEvent(_Event, tag="tool_result"):
    tool_use_id: str
    name: str
    output: str
    exit_code: int
    is_error: bool = False
    # A structured view of the call for the host to keep in the stored
    # message's metadata: an envelope above (built by ``agent_runner.envelopes``)
    # in its wire form (:func:`envelope_to_dict`).  A plain object on
    # purpose: the host validates it with :func:`envelope_from_dict` on its
    # own, so an envelope that is malformed, or of a newer type, costs the
    # envelope, never the tool result (a typed field would refuse the whole
    # line).  None from runners that predate envelopes.
    envelope: JsonObject | None = None


class SendMessageEvent(_Event, tag="send_message"):
    """The agent posts ``text`` into ``chat_jid`` during the run (its own chat,
    or, for the main group, any registered chat).  The host authorizes it."""

    chat_jid: str
    text: str


class SendFileEvent(_Event, tag="send_file"):
    """The agent hands its chat the workspace file at ``path`` (relative to the workspace),
    with an optional ``caption``.  The host reads the file by its hostile-folder rules (no
    link followed, a regular file, bounded), stores it and posts it as a FILE message."""

    path: Annotated[str, Meta(min_length=1, max_length=4096)]
    caption: str = ""


class TaskEvent(_Event, tag="task"):
    """The agent asks the host to create, change, pause, resume or cancel a scheduled task.
    The host decides (its group's tasks only, the main group's any group's; the schedule
    checked; the group's cap and the minimum interval) and says in the chat what it did."""

    action: TaskAction
    task_id: str | None = None  # update, pause, resume, cancel: the task (an id or its prefix)
    chat_jid: str | None = None  # create: the group it is for (None: the run's own)
    prompt: str | None = None
    kind: ScheduleKind | None = None
    spec: str | None = None
    context_mode: ContextMode | None = None


class QuestionEvent(_Event, tag="question"):
    """The agent asks its group (``ask_user``) and its run ends: the answer comes back as the
    result of the call ``tool_use_id`` (the built-in loop's next run), or as the next message
    (Claude Code).  The host checks the question and its options again (the limits above)."""

    tool_use_id: str
    question: str
    options: list[str]
    multiple: bool = False
    allow_other: bool = False


class EditEvent(_Event, tag="edit"):
    """The agent asks the host to change the words of one of its own earlier messages in this
    chat (``nth_last``: 1 for its latest), on every channel that shows it.  The host finds the
    message itself (the agent's own, in this group, not superseded) and says in the chat when
    it cannot."""

    text: str
    nth_last: int = 1


class ReactEvent(_Event, tag="react"):
    """The agent puts ``emoji`` (one of :data:`REACTIONS`) on a person's message of this chat
    (``nth_last``: 1 for the latest), on every channel that shows it.  The host finds the
    message itself and says in the chat when it cannot."""

    emoji: str
    nth_last: int = 1


class KeepEvent(_Event, tag="keep"):
    """The runner's own process that a warm container keeps between runs (the Claude Code CLI
    of the group's live session): its ``pid`` in the container and its ``started`` time (field
    22 of ``/proc/PID/stat``, clock ticks after boot).  The host's clean-up after the run spares
    it only if it is still that process (that pid, started then), and never under gVisor,
    where the agent can write to the runner's streams."""

    pid: Annotated[int, Meta(ge=2)]
    started: Annotated[int, Meta(ge=0)]


class Reaction(NamedTuple):
    """A reaction every channel can be asked for: its emoji, Slack's name for it, and the
    emoji Telegram's bots may set (None: not in Telegram's allowed set)."""

    emoji: str
    slack: str
    telegram: str | None


# The reactions the agent may use (docs/messages.md shows this table; a test keeps them
# the same).  Telegram lets bots set only a fixed set of emoji, without the variation
# selector (``❤``, not ``❤️``); Slack names each by its short name.
REACTIONS: Final[tuple[Reaction, ...]] = (
    Reaction("👍", "+1", "👍"),
    Reaction("👎", "-1", "👎"),
    Reaction("❤️", "heart", "❤"),
    Reaction("🔥", "fire", "🔥"),
    Reaction("🎉", "tada", "🎉"),
    Reaction("👏", "clap", "👏"),
    Reaction("😁", "grin", "😁"),
    Reaction("🤔", "thinking_face", "🤔"),
    Reaction("😢", "cry", "😢"),
    Reaction("🙏", "pray", "🙏"),
    Reaction("👌", "ok_hand", "👌"),
    Reaction("💯", "100", "💯"),
    Reaction("🤣", "rolling_on_the_floor_laughing", "🤣"),
    Reaction("⚡", "zap", "⚡"),
    Reaction("🏆", "trophy", "🏆"),
    Reaction("👀", "eyes", "👀"),
    Reaction("🤝", "handshake", "🤝"),
    Reaction("✍️", "writing_hand", "✍"),
    Reaction("😎", "sunglasses", "😎"),
    Reaction("🤯", "exploding_head", "🤯"),
    Reaction("😍", "heart_eyes", "😍"),
    Reaction("🫡", "saluting_face", "🫡"),
    Reaction("✅", "white_check_mark", None),
    Reaction("❌", "x", None),
    Reaction("⏳", "hourglass_flowing_sand", None),
    Reaction("🚀", "rocket", None),
    Reaction("⚠️", "warning", None),
    Reaction("🐛", "bug", None),
)
_BY_EMOJI: Final = {r.emoji.replace("\ufe0f", ""): r for r in REACTIONS}


def reaction_of(emoji: str) -> Reaction | None:
    """The reaction ``emoji`` names (with or without its variation selector), or None."""
    return _BY_EMOJI.get(emoji.strip().replace("\ufe0f", ""))


class ResultEvent(_Event, tag="result"):
    """Always the last event of a successful run."""

    usage: Usage = field(default_factory=Usage)
    session_id: str | None = None
    stop_reason: str | None = None
    num_turns: int = 0


class ErrorEvent(_Event, tag="error"):
    """The run failed inside the container; ``retryable`` marks transient causes."""

    message: str
    retryable: bool = False


Event = Union[
    AssistantEvent,
    TextDeltaEvent,
    ThinkingEvent,
    ToolUseEvent,
    ToolResultEvent,
    SendMessageEvent,
    SendFileEvent,
    TaskEvent,
    QuestionEvent,
    EditEvent,
    ReactEvent,
    KeepEvent,
    ResultEvent,
    ErrorEvent,
]
_EVENT_DECODER: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)


def parse_event(line: str | bytes) -> Event:
    """Parse one stdout line; raises :data:`ProtocolError` on garbage."""
    return _EVENT_DECODER.decode(line)


def dump_event(event: Event) -> str:
    """Serialize one event as a single line (no trailing newline)."""
    return _ENCODER.encode(event).decode()
