"""Envelopes: the structured view of a tool result, kept in a message's metadata.

The one definition of the envelope schema: the runner builds these Structs
(``agent_runner.envelopes``), the host validates stored and received
metadata with them (``orchestrator.model.envelopes``).  On the wire and in
the database an envelope is ``{"message_type": T, "version": N, "payload":
{...}}``, the type as the Struct's tag, keys in that order.  The host may
add top-level extras next to those three keys; it takes them off before
validating, so the Structs refuse unknown keys like every protocol model.

Known types are validated here; an envelope of any other type decodes to an
:class:`OtherEnvelope` with its payload untouched: a newer writer must not
be rejected by an older reader.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

import msgspec
from msgspec import Meta, field

from .base import FrozenModel, JsonObject

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


class _Payload(FrozenModel, frozen=True):
    # Unknown keys refused (``FrozenModel``): a typo'd key would otherwise be dropped
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


class _Envelope(FrozenModel, tag_field="message_type", frozen=True):
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


class OtherEnvelope(FrozenModel, frozen=True):
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
