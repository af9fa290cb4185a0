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

The schema is not written here: the envelope types are the protocol's msgspec
Structs (``agent_runner.protocol``: ``CodeEditEnvelope``, ``TodoEnvelope``,
``ToolCallEnvelope``, ``OtherEnvelope`` for any other type), the very ones the
agent runner builds, so what a runner writes is what the host accepts.  This
module adds the host's rules around them (legacy metadata, TEXT, extras, the
version check) and turns msgspec's errors into :class:`InvalidMessageMetadata`
naming the field, in the words API clients see.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

from agent_runner.protocol import APPROVAL as APPROVAL
from agent_runner.protocol import CODE_EDIT as CODE_EDIT
from agent_runner.protocol import ENVELOPE_KEYS as ENVELOPE_KEYS
from agent_runner.protocol import ENVELOPE_TYPES as ENVELOPE_TYPES
from agent_runner.protocol import FILE as FILE
from agent_runner.protocol import TEXT as TEXT
from agent_runner.protocol import TODO as TODO
from agent_runner.protocol import TOOL_CALL as TOOL_CALL
from agent_runner.protocol import CodeEditPayload as CodeEditPayload
from agent_runner.protocol import Envelope as Envelope
from agent_runner.protocol import FileEdit as FileEdit
from agent_runner.protocol import FilePayload as FilePayload
from agent_runner.protocol import FileRef as FileRef
from agent_runner.protocol import OtherEnvelope as OtherEnvelope
from agent_runner.protocol import ProtocolError, envelope_from_dict, literal_choices
from agent_runner.protocol import TodoItem as TodoItem
from agent_runner.protocol import TodoPayload as TodoPayload
from agent_runner.protocol import TodoStatus as TodoStatus
from agent_runner.protocol import ToolCallPayload as ToolCallPayload
from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.sizes import human_size

# msgspec's validation errors are one line: "<what> - at `$.payload.edits[0]`"
# ("$" is the envelope); they are turned into the host's field paths and words.
_AT = re.compile(r"^(?P<what>.*?)(?: - at `(?P<loc>.*)`)?$", re.S)
_FIELD = re.compile(r"^Object (?P<kind>missing required|contains unknown) field `(?P<name>.*)`$", re.S)
_EXPECTED = re.compile(r"^Expected `(?P<type>[^`]*)`(?P<rest>.*)$", re.S)
_KEY_IN = "key` in `"
_MUST_BE = {
    "str": "must be a string",
    "array": "must be a list",
    "object": "must be a JSON object",
    "int": "must be an integer",
    "bool": "must be true or false",
}


def _from_protocol_error(exc: ProtocolError, envelope_type: type) -> InvalidMessageMetadata:
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    what, loc = match["what"], match["loc"] or "$"
    if loc.startswith(_KEY_IN):
        return InvalidMessageMetadata("metadata" + loc[len(_KEY_IN) :][1:], "keys must be strings")
    path = "metadata" + loc[1:]
    choices = literal_choices(envelope_type, loc)
    if choices is not None:
        return InvalidMessageMetadata(path, "must be one of " + ", ".join(map(str, choices)))
    if field := _FIELD.match(what):
        problem = "is required" if field["kind"] == "missing required" else "unknown field"
        return InvalidMessageMetadata(f"{path}.{field['name']}", problem)
    if expected := _EXPECTED.match(what):
        if expected["rest"].startswith(" of length >= "):
            return InvalidMessageMetadata(path, "must not be empty")
        # "str | null" is a string that may be missing: name the type, not null.
        wanted = expected["type"].split(" | ")[0]
        if wanted in _MUST_BE:
            return InvalidMessageMetadata(path, _MUST_BE[wanted])
    return InvalidMessageMetadata(path, what)


def _check_envelope(meta: JsonObject) -> tuple[Envelope, JsonObject]:
    """The envelope as its protocol Struct (an OtherEnvelope for TEXT and unknown types) and the extras."""
    message_type = meta["message_type"]
    if not isinstance(message_type, str) or not message_type.strip():
        raise InvalidMessageMetadata("metadata.message_type", "must be a non-empty string")
    version = meta.get("version", 1)
    # bool is an int subclass, but ``true`` is never a meaningful version.
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise InvalidMessageMetadata("metadata.version", "must be an integer >= 1")
    payload = meta.get("payload", {})
    extras = {k: v for k, v in meta.items() if k not in ENVELOPE_KEYS}
    if message_type == TEXT:
        # TEXT carries its words in ``content``; anything here would be ignored unseen.
        if payload != {}:
            raise InvalidMessageMetadata("metadata.payload", "must be empty for TEXT messages")
        return OtherEnvelope(message_type=TEXT, version=version, payload={}), extras
    try:
        envelope = envelope_from_dict({"message_type": message_type, "version": version, "payload": payload})
    except ProtocolError as exc:
        # Only the first problem: one precise field is more useful to a client than a wall of them.
        raise _from_protocol_error(exc, ENVELOPE_TYPES.get(message_type, OtherEnvelope)) from None
    return envelope, extras


def _unpack(meta: Any) -> tuple[Envelope, JsonObject] | None:
    """The checked envelope and extras, or None when there is none (null or legacy metadata)."""
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise InvalidMessageMetadata("metadata", "must be a JSON object or null")
    if "message_type" not in meta:
        return None
    return _check_envelope(meta)


def _dump(envelope: Envelope, extras: JsonObject) -> JsonObject:
    # An unknown type's payload is stored as it came, not re-encoded.
    payload = envelope.payload if isinstance(envelope, OtherEnvelope) else msgspec.to_builtins(envelope.payload)
    return {"message_type": envelope.message_type, "version": envelope.version, "payload": payload, **extras}


def refuse_host_envelope(meta: Any) -> None:
    """A sender's or an import's message may not carry an APPROVAL envelope (only the host
    stores one, for a question the agent asked: orchestrator/run/questions.py): a forged one
    would put a question in the agent's mouth, with buttons that answer it."""
    if isinstance(meta, dict) and meta.get("message_type") == APPROVAL:
        raise InvalidMessageMetadata(
            "metadata.message_type", "APPROVAL envelopes are the host's own (the agent asks with its ask_user tool)"
        )


def normalize_message_metadata(meta: Any) -> JsonObject | None:
    """Validate ``meta`` and return it in canonical form; raises InvalidMessageMetadata."""
    unpacked = _unpack(meta)
    if unpacked is None:
        return None if meta is None else dict(meta)
    return _dump(*unpacked)


@dataclass(frozen=True)
class ParsedMessageMetadata:
    """``payload`` is the protocol's Struct for known types, raw for unknown ones, None for TEXT.

    ``is_legacy`` means there was no envelope at all (null or a dict without
    ``message_type``); the legacy dict's keys are then the ``extras``.
    """

    message_type: str
    version: int
    payload: CodeEditPayload | TodoPayload | ToolCallPayload | FilePayload | Any
    extras: JsonObject
    is_legacy: bool


def parse_message_metadata(meta: Any) -> ParsedMessageMetadata:
    unpacked = _unpack(meta)
    if unpacked is None:
        return ParsedMessageMetadata(TEXT, 1, None, dict(meta or {}), is_legacy=True)
    envelope, extras = unpacked
    payload = None if envelope.message_type == TEXT else envelope.payload
    return ParsedMessageMetadata(envelope.message_type, envelope.version, payload, extras, is_legacy=False)


def build_structured_envelope(
    message_type: str, payload: Any, *, extras: JsonObject | None = None, version: int = 1
) -> JsonObject:
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


def file_label(ref: FileRef) -> str:
    """``notes.txt (text/plain, 1.2 KB)``: one file as people and the model read it."""
    return f"{ref.name} ({ref.mime}, {human_size(ref.size)})"


def file_line(payload: FilePayload) -> str:
    """One line naming a message's files."""
    return "📎 " + ", ".join(file_label(f) for f in payload.files)


def files_of(meta: Any) -> FilePayload | None:
    """The files a message's metadata carries (its FILE envelope), or None: no envelope, another
    type, or metadata that no longer validates (a legacy row shows its text alone)."""
    if not isinstance(meta, dict) or meta.get("message_type") != FILE:
        return None
    try:
        payload = parse_message_metadata(meta).payload
    except InvalidMessageMetadata:
        return None
    return payload if isinstance(payload, FilePayload) else None


def with_file_line(content: str, meta: Any) -> str:
    """``content`` followed by the line naming the message's files, if it carries any."""
    files = files_of(meta)
    if files is None:
        return content
    return f"{content}\n{file_line(files)}" if content else file_line(files)


def preview_for(metadata_envelope: JsonObject | None) -> str:
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
