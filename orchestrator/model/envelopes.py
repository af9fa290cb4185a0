"""Structured message envelopes, stored in a message's ``metadata`` JSON object.

An envelope is ``{"message_type": T, "version": N, "payload": ..., **extras}``.
A dict without ``message_type`` is legacy metadata and passes through untouched,
so rows written before envelopes existed still read back as plain TEXT.
Known types get their payload validated and re-serialized in one canonical form
(defaults filled in), so readers never have to guess at missing keys.  Unknown
types pass through unvalidated (only ``version`` is checked): a newer writer must
not be rejected by an older reader.  Extras stay at the top level, not in the
payload, because payload schemas forbid unknown keys; message-level data (trace
ids, provenance, legacy keys) can ride along without loosening those schemas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.core.errors import InvalidMessage

TEXT = "TEXT"
CODE_EDIT = "CODE_EDIT"
TODO = "TODO"
TOOL_CALL = "TOOL_CALL"
ENVELOPE_KEYS = ("message_type", "version", "payload")


class InvalidMessageMetadata(InvalidMessage, ValueError):
    """Metadata that cannot be stored; ``field`` is the offending path (for API error bodies)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class _Payload(BaseModel):
    # A typo'd key would otherwise be dropped silently and the data lost.
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEdit(_Payload):
    file_path: str = Field(min_length=1)
    old_content: str | None = None  # None: the file did not exist before
    new_content: str | None = None  # None: the file was deleted
    language: str | None = None


class CodeEditPayload(_Payload):
    edits: list[FileEdit] = Field(min_length=1)


TodoStatus = Literal["pending", "in_progress", "completed"]


class TodoItem(_Payload):
    id: str
    content: str
    status: TodoStatus


class TodoPayload(_Payload):
    todos: list[TodoItem] = Field(min_length=1)


class ToolCallPayload(_Payload):
    tool_name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)
    output: Any = None
    error: str | None = None


PAYLOAD_MODELS: dict[str, type[_Payload]] = {
    CODE_EDIT: CodeEditPayload,
    TODO: TodoPayload,
    TOOL_CALL: ToolCallPayload,
}

_PROBLEMS = {
    "missing": "is required",
    "extra_forbidden": "unknown field",
    "too_short": "must not be empty",
    "string_too_short": "must not be empty",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
}


def _from_validation_error(exc: ValidationError) -> InvalidMessageMetadata:
    # Only the first error: one precise field is more useful to a client than a wall of them.
    err = exc.errors()[0]
    path = "metadata.payload" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
    if err["type"] == "literal_error":
        # pydantic renders the choices as "'a', 'b' or 'c'"; list them plainly.
        problem = "must be one of " + ", ".join(re.findall(r"'([^']*)'", err["ctx"]["expected"]))
    else:
        problem = _PROBLEMS.get(err["type"], err["msg"])
    return InvalidMessageMetadata(path, problem)


def _validate_payload(message_type: str, payload: Any) -> Any:
    if message_type == TEXT:
        # TEXT carries its words in ``content``; anything here would be ignored unseen.
        if payload != {}:
            raise InvalidMessageMetadata("metadata.payload", "must be empty for TEXT messages")
        return {}
    model = PAYLOAD_MODELS.get(message_type)
    if model is None:
        return payload
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise _from_validation_error(exc) from None


def _check_envelope(meta: dict[str, Any]) -> tuple[str, int, Any, dict[str, Any]]:
    message_type = meta["message_type"]
    if not isinstance(message_type, str) or not message_type.strip():
        raise InvalidMessageMetadata("metadata.message_type", "must be a non-empty string")
    version = meta.get("version", 1)
    # bool is an int subclass, but ``true`` is never a meaningful version.
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidMessageMetadata("metadata.version", "must be an integer >= 1")
    payload = _validate_payload(message_type, meta.get("payload", {}))
    extras = {k: v for k, v in meta.items() if k not in ENVELOPE_KEYS}
    return message_type, version, payload, extras


def _unpack(meta: Any) -> tuple[str, int, Any, dict[str, Any]] | None:
    """The checked envelope, or None when there is none (null or legacy metadata)."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise InvalidMessageMetadata("metadata", "must be a JSON object or null")
    if "message_type" not in meta:
        return None
    return _check_envelope(meta)


def _dump(message_type: str, version: int, payload: Any, extras: dict[str, Any]) -> dict[str, Any]:
    if isinstance(payload, BaseModel):
        payload = payload.model_dump()
    return {"message_type": message_type, "version": version, "payload": payload, **extras}


def normalize_message_metadata(meta: Any) -> dict[str, Any] | None:
    """Validate ``meta`` and return it in canonical form; raises InvalidMessageMetadata."""
    unpacked = _unpack(meta)
    if unpacked is None:
        return None if meta is None else dict(meta)
    return _dump(*unpacked)


@dataclass(frozen=True)
class ParsedMessageMetadata:
    """``payload`` is a typed model for known types, raw for unknown ones, None for TEXT.

    ``is_legacy`` means there was no envelope at all (null or a dict without
    ``message_type``); the legacy dict's keys are then the ``extras``.
    """

    message_type: str
    version: int
    payload: CodeEditPayload | TodoPayload | ToolCallPayload | Any
    extras: dict[str, Any]
    is_legacy: bool


def parse_message_metadata(meta: Any) -> ParsedMessageMetadata:
    unpacked = _unpack(meta)
    if unpacked is None:
        return ParsedMessageMetadata(TEXT, 1, None, dict(meta or {}), is_legacy=True)
    message_type, version, payload, extras = unpacked
    payload = None if message_type == TEXT else payload
    return ParsedMessageMetadata(message_type, version, payload, extras, is_legacy=False)


def build_structured_envelope(
    message_type: str, payload: Any, *, extras: dict[str, Any] | None = None, version: int = 1
) -> dict[str, Any]:
    extras = extras or {}
    for key in ENVELOPE_KEYS:
        if key in extras:
            raise InvalidMessageMetadata(f"extras.{key}", "is reserved for the envelope itself")
    meta = {"message_type": message_type, "version": version, "payload": payload, **extras}
    return _dump(*_check_envelope(meta))


_PREVIEW_WIDTH = 60
_MAX_NAMED_FILES = 3


def _clip(text: str) -> str:
    # Previews sit on one line in chat lists; a multi-line traceback would swamp them.
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= _PREVIEW_WIDTH else line[: _PREVIEW_WIDTH - 1] + "…"


def _edit_verb(edit: FileEdit) -> str:
    if edit.old_content is None and edit.new_content is not None:
        return "Created"
    if edit.new_content is None and edit.old_content is not None:
        return "Deleted"
    return "Edited"


def _preview_code_edit(payload: CodeEditPayload) -> str:
    paths = list(dict.fromkeys(e.file_path for e in payload.edits))
    if len(paths) == 1:
        verbs = {_edit_verb(e) for e in payload.edits}
        return f"{verbs.pop() if len(verbs) == 1 else 'Edited'} {paths[0]}"
    named = ", ".join(paths[:_MAX_NAMED_FILES])
    more = len(paths) - _MAX_NAMED_FILES
    return f"Edited {len(paths)} files: {named}" + (f", +{more} more" if more > 0 else "")


def preview_for(metadata_envelope: dict[str, Any] | None) -> str:
    """One-line text to show when a structured message's ``content`` is empty."""
    parsed = parse_message_metadata(metadata_envelope)
    payload = parsed.payload
    if isinstance(payload, CodeEditPayload):
        return _preview_code_edit(payload)
    if isinstance(payload, TodoPayload):
        done = sum(t.status == "completed" for t in payload.todos)
        current = next((t for t in payload.todos if t.status == "in_progress"), None)
        now = f" · now: {_clip(current.content)}" if current else ""
        return f"Todos {done}/{len(payload.todos)} done{now}"
    if isinstance(payload, ToolCallPayload):
        return f"Called {payload.tool_name}" + (f" (error: {_clip(payload.error)})" if payload.error else "")
    return "" if parsed.message_type == TEXT else f"[{parsed.message_type} message]"
