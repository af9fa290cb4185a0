"""How a stored message looks on a text channel, by type.

host 🏠, tool results 🔧 with ✅/❌ and the exit code, assistant replies
under the assistant's name, system messages set apart, user messages as
"name: text".  Structured envelopes in the metadata are drawn for plain
text: CODE_EDIT as a unified diff per file, TODO as a checklist (○ pending,
◐ in progress, ● completed and struck through), TOOL_CALL as the tool's
name, its input JSON and its output or error.

``render`` gives the :class:`RenderedMessage` channels receive: the text
plus the facts of the message it came from.  ``displayed`` says which
stored messages channels show at all.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from .envelopes import (
    TEXT,
    CodeEditPayload,
    FileEdit,
    InvalidMessageMetadata,
    TodoPayload,
    ToolCallPayload,
    parse_message_metadata,
)
from .messages import SENDER_THINKING, SENDER_TOOL_USE, STORED_ONLY_SENDERS, StoredMessage

# Metadata key: the channel a message arrived on (mirroring skips it).
ORIGIN_CHANNEL_KEY = "origin_channel"

TODO_MARKS = {"pending": "○", "in_progress": "◐", "completed": "●"}
STRIKE = "\u0336"  # combining long stroke overlay


class RenderedMessage(BaseModel):
    """What a channel is given: the text to show and the message it shows."""

    model_config = ConfigDict(frozen=True)

    text: str
    chat_jid: str
    seq: int
    id: str
    message_type: str  # user | assistant | system | tool_result | host
    structured_type: str = TEXT  # the envelope's type: TEXT, CODE_EDIT, TODO, TOOL_CALL, ...
    sender: str
    sender_name: str
    content: str  # the stored text, for channels that draw their own
    origin_channel: str | None = None


def displayed(msg: StoredMessage) -> bool:
    """Channels show it: not superseded, and not a stored-only record (tool_use, thinking, ...)."""
    return msg.superseded_at is None and msg.sender not in STORED_ONLY_SENDERS


def struck(text: str) -> str:
    return "".join(c if c.isspace() else c + STRIKE for c in text)


def render_code_edit(payload: CodeEditPayload) -> str:
    return "\n".join(_file_diff(edit) for edit in payload.edits)


def _file_diff(edit: FileEdit) -> str:
    path = edit.file_path
    old = (edit.old_content or "").splitlines()
    new = (edit.new_content or "").splitlines()
    before = "/dev/null" if edit.old_content is None else f"a/{path}"
    after = "/dev/null" if edit.new_content is None else f"b/{path}"
    diff = list(difflib.unified_diff(old, new, before, after, lineterm=""))
    if not diff:
        return f"--- {before}\n+++ {after}\n(no changes)"
    return "\n".join(diff)


def render_todos(payload: TodoPayload) -> str:
    return "\n".join(
        f"{TODO_MARKS[t.status]} {struck(t.content) if t.status == 'completed' else t.content}"
        for t in payload.todos
    )


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render_tool_call(payload: ToolCallPayload, *, with_name: bool = True) -> str:
    lines = [f"🔧 {payload.tool_name}"] if with_name else []
    lines.append(f"input: {_json(payload.input)}")
    if payload.error:
        lines.append(f"error: {payload.error}")
    elif payload.output not in (None, ""):
        out = payload.output if isinstance(payload.output, str) else _json(payload.output)
        lines.append(out.rstrip("\n"))
    return "\n".join(lines)


def _structured(msg: StoredMessage, *, in_tool_result: bool) -> tuple[str, str | None]:
    """(envelope type, its text) or (type, None) when the stored content is what to show."""
    try:
        parsed = parse_message_metadata(msg.metadata)
    except InvalidMessageMetadata:
        return TEXT, None  # a legacy row that no longer validates: show its text
    payload = parsed.payload
    if isinstance(payload, CodeEditPayload):
        return parsed.message_type, render_code_edit(payload)
    if isinstance(payload, TodoPayload):
        return parsed.message_type, render_todos(payload)
    if isinstance(payload, ToolCallPayload):
        return parsed.message_type, render_tool_call(payload, with_name=not in_tool_result)
    return parsed.message_type, None


def _tool_header(msg: StoredMessage) -> str:
    meta = msg.metadata or {}
    code = meta.get("exit_code")
    name = meta.get("tool") or msg.sender_name
    head = "🔧" if code is None else f"🔧 {'✅' if code == 0 else '❌'} exit {code}"
    return f"{head} · {name}" if name else head


def _said(name: str, body: str, structured: bool) -> str:
    # A multi-line structured body (a diff, a checklist) starts on its own line.
    sep = "\n" if structured and "\n" in body else " "
    return f"{name}:{sep}{body}"


def render(msg: StoredMessage, assistant_name: str) -> RenderedMessage:
    kind, body = _structured(msg, in_tool_result=msg.message_type == "tool_result")
    structured = body is not None
    text_body = body if structured else msg.content
    if msg.message_type == "host":
        text = f"🏠 {msg.content}"
    elif msg.message_type == "tool_result":
        text = _tool_header(msg) + (f"\n{text_body}" if text_body else "")
    elif msg.message_type == "system":
        text = f"⚙️ [system] {text_body}"
    elif msg.message_type == "assistant" and msg.sender == SENDER_TOOL_USE:
        text = f"🛠️ {msg.content}"
    elif msg.message_type == "assistant" and msg.sender == SENDER_THINKING:
        text = f"💭 {msg.content}"
    elif msg.message_type == "assistant":
        text = _said(msg.sender_name or assistant_name, text_body, structured)
    else:
        text = _said(msg.sender_name or msg.sender, text_body, structured)
    origin = (msg.metadata or {}).get(ORIGIN_CHANNEL_KEY)
    return RenderedMessage(
        text=text, chat_jid=msg.chat_jid, seq=msg.seq, id=msg.id, message_type=msg.message_type,
        structured_type=kind, sender=msg.sender, sender_name=msg.sender_name, content=msg.content,
        origin_channel=origin if isinstance(origin, str) else None,
    )


def render_text(msg: StoredMessage, assistant_name: str) -> str:
    return render(msg, assistant_name).text
