"""Structured envelopes for tool results: ``{"message_type", "version", "payload"}``.

The host stores each tool result as a chat message and keeps the envelope
in that message's ``metadata``.  The envelope Structs are the protocol's
(``agent_runner.protocol``), the same ones the host validates with; this
module only builds them.  They go on the wire as plain objects
(:func:`agent_runner.protocol.envelope_to_dict`) and the host checks them
again: a Struct built in code is not validated.

* ``CODE_EDIT`` - a successful ``write_file`` or ``edit_file``: the file's
  full text before (None when the call created it) and after;
* ``TODO`` - a successful, non-empty ``todo_write``: the whole list;
* ``TOOL_CALL`` - everything else, failed calls of the tools above included:
  tool name, input, output and error text.

Every text is capped at :data:`CONTENT_CAP_BYTES` of UTF-8, with a note in
the text itself when it was cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, cast

from .protocol import CODE_EDIT as CODE_EDIT
from .protocol import ENVELOPE_VERSION as ENVELOPE_VERSION
from .protocol import TODO as TODO
from .protocol import TOOL_CALL as TOOL_CALL
from .protocol import (
    CodeEditEnvelope,
    CodeEditPayload,
    FileEdit,
    TodoEnvelope,
    TodoItem,
    TodoPayload,
    TodoStatus,
    ToolCallEnvelope,
    ToolCallPayload,
)

CONTENT_CAP_BYTES = 64 * 1024

_LANGUAGE_BY_SUFFIX = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".md": "markdown",
    ".markdown": "markdown",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".sh": "shell",
    ".bash": "shell",
    ".toml": "toml",
    ".html": "html",
    ".htm": "html",
    ".css": "css",
    ".sql": "sql",
    ".rs": "rust",
    ".go": "go",
    ".java": "java",
    ".c": "c",
    ".h": "c",
    ".cc": "cpp",
    ".cpp": "cpp",
    ".hpp": "cpp",
    ".rb": "ruby",
}
_LANGUAGE_BY_NAME = {"dockerfile": "dockerfile", "makefile": "makefile"}


def guess_language(file_path: str) -> str | None:
    """A language name from the file's extension (or well-known name), else None."""
    path = PurePosixPath(file_path)
    return _LANGUAGE_BY_SUFFIX.get(path.suffix.lower()) or _LANGUAGE_BY_NAME.get(path.name.lower())


def cap_text(text: str, total_bytes: int | None = None, cap: int = CONTENT_CAP_BYTES) -> str:
    """``text`` cut to ``cap`` bytes of UTF-8, with a note when anything was left out.

    ``total_bytes`` is the size of the whole original when ``text`` is
    already only its beginning (e.g. a prefix read from a large file).
    """
    encoded = text.encode("utf-8")
    total = max(total_bytes or 0, len(encoded))
    if total <= cap:
        return text
    kept = encoded[:cap].decode("utf-8", errors="ignore")
    return f"{kept}\n[truncated: showing the first {cap} of {total} bytes]"


def code_edit(
    file_path: str, old_content: str | None, new_content: str, *, old_total_bytes: int | None = None
) -> CodeEditEnvelope:
    """One file's edit; ``old_content`` None means the file was created.

    ``old_total_bytes``: the old file's size when ``old_content`` is only its beginning.
    """
    edit = FileEdit(
        file_path=file_path,
        old_content=None if old_content is None else cap_text(old_content, old_total_bytes),
        new_content=cap_text(new_content),
        language=guess_language(file_path),
    )
    return CodeEditEnvelope(payload=CodeEditPayload(edits=[edit]))


def todo(todos: Sequence[Mapping[str, str]]) -> TodoEnvelope:
    """The whole list; ``todos`` is already checked (``todo_write``), statuses included."""
    items = [TodoItem(id=t["id"], content=cap_text(t["content"]), status=cast(TodoStatus, t["status"])) for t in todos]
    return TodoEnvelope(payload=TodoPayload(todos=items))


def _cap_value(value: Any) -> Any:
    if isinstance(value, str):
        return cap_text(value)
    if isinstance(value, Mapping):
        return {str(k): _cap_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cap_value(v) for v in value]
    return value


def tool_call(tool_name: str, tool_input: Mapping[str, Any], output: str, *, is_error: bool) -> ToolCallEnvelope:
    """A generic call: a failed call's text is its ``error`` and its ``output`` is empty."""
    payload = ToolCallPayload(
        tool_name=tool_name or "?",
        input=_cap_value(tool_input) if isinstance(tool_input, Mapping) else {},
        output="" if is_error else cap_text(output),
        error=cap_text(output) if is_error else None,
    )
    return ToolCallEnvelope(payload=payload)
