"""The host <-> container protocol: the one contract both sides share.

The host writes one :class:`ContainerInput` JSON document on the container's
stdin, as one line; it then keeps stdin open for the run when the input has
``host_fence_s`` (its beats, ``agent_runner/fence.py``) and closes it
otherwise.  The container writes one :data:`Event` JSON object per
line on stdout (logs go to stderr).  A line that does not parse as an event is
reported by the host and skipped, never fatal.

This package is imported by the host (``orchestrator``) and by the runner in
the image, so it depends on msgspec alone; the host imports nothing else of the
runner (the import-linter contracts in pyproject.toml).  This module is its
public face: every name below is imported from here.  The modules, one concept each:

* ``base``: what every Struct shares (unknown fields refused), ``JsonObject``, ``ProtocolError``;
* ``input``: the run's input (:class:`ContainerInput`), the model's view and settings, limits;
* ``envelopes``: the structured view of a tool result kept in a message's metadata;
* ``literals``: which words a refused ``Literal`` may be (:func:`literal_choices`);
* ``events``: the events the runner writes, one per line (:data:`Event`);
* ``reactions``: the reactions the agent may use, as each channel names them.
"""

from __future__ import annotations

from .base import JsonObject, ProtocolError
from .envelopes import (
    APPROVAL,
    CODE_EDIT,
    ENVELOPE_KEYS,
    ENVELOPE_TYPES,
    ENVELOPE_VERSION,
    FILE,
    MAX_FILES_PER_MESSAGE,
    MAX_OPTION_CHARS,
    MAX_OPTIONS,
    MAX_QUESTION_CHARS,
    MIN_OPTIONS,
    TEXT,
    TODO,
    TOOL_CALL,
    ApprovalEnvelope,
    ApprovalPayload,
    CodeEditEnvelope,
    CodeEditPayload,
    Envelope,
    FileEdit,
    FileEnvelope,
    FilePayload,
    FileRef,
    KnownEnvelope,
    OtherEnvelope,
    TodoEnvelope,
    TodoItem,
    TodoPayload,
    TodoStatus,
    ToolCallEnvelope,
    ToolCallPayload,
    envelope_from_dict,
    envelope_to_dict,
)
from .events import (
    AssistantEvent,
    EditEvent,
    ErrorEvent,
    Event,
    KeepEvent,
    QuestionEvent,
    ReactEvent,
    ResultEvent,
    SendFileEvent,
    SendMessageEvent,
    TaskAction,
    TaskEvent,
    TextDeltaEvent,
    ThinkingEvent,
    ToolResultEvent,
    ToolUseEvent,
    Usage,
    dump_event,
    parse_event,
)
from .input import (
    OPTIONAL_TOOL_NAMES,
    OPTIONAL_TOOLS,
    PROTOCOL_VERSION,
    SESSION_MOUNT,
    ContainerInput,
    ContextMode,
    ImageRef,
    Limits,
    ModelSettings,
    ScheduleKind,
    SdkMessage,
    SdkRole,
    SdkToolUse,
    TaskInfo,
    decode_input,
)
from .literals import literal_choices
from .reactions import REACTIONS, Reaction, reaction_of

__all__ = [
    # base
    "JsonObject",
    "ProtocolError",
    # input
    "PROTOCOL_VERSION",
    "SESSION_MOUNT",
    "SdkRole",
    "SdkToolUse",
    "ImageRef",
    "SdkMessage",
    "ModelSettings",
    "Limits",
    "OPTIONAL_TOOL_NAMES",
    "OPTIONAL_TOOLS",
    "ScheduleKind",
    "ContextMode",
    "TaskInfo",
    "ContainerInput",
    "decode_input",
    # envelopes
    "ENVELOPE_VERSION",
    "ENVELOPE_KEYS",
    "TEXT",
    "CODE_EDIT",
    "TODO",
    "TOOL_CALL",
    "FILE",
    "MAX_FILES_PER_MESSAGE",
    "APPROVAL",
    "MIN_OPTIONS",
    "MAX_OPTIONS",
    "MAX_OPTION_CHARS",
    "MAX_QUESTION_CHARS",
    "FileEdit",
    "CodeEditPayload",
    "TodoStatus",
    "TodoItem",
    "TodoPayload",
    "ToolCallPayload",
    "FileRef",
    "FilePayload",
    "ApprovalPayload",
    "CodeEditEnvelope",
    "TodoEnvelope",
    "ToolCallEnvelope",
    "FileEnvelope",
    "ApprovalEnvelope",
    "OtherEnvelope",
    "KnownEnvelope",
    "Envelope",
    "ENVELOPE_TYPES",
    "envelope_from_dict",
    "envelope_to_dict",
    # literals
    "literal_choices",
    # events
    "Usage",
    "AssistantEvent",
    "TextDeltaEvent",
    "ThinkingEvent",
    "ToolUseEvent",
    "ToolResultEvent",
    "SendMessageEvent",
    "SendFileEvent",
    "TaskAction",
    "TaskEvent",
    "QuestionEvent",
    "EditEvent",
    "ReactEvent",
    "KeepEvent",
    "ResultEvent",
    "ErrorEvent",
    "Event",
    "parse_event",
    "dump_event",
    # reactions
    "Reaction",
    "REACTIONS",
    "reaction_of",
]
