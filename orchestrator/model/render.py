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

Rendering is linear in the message: what the agent stored is hostile and
may be megabytes.  The one super-linear step, difflib's diff, only ever
sees the changed middle of a file (common leading and trailing lines are
cut first, in linear time) and only when that middle is small enough
(:data:`DIFF_MAX_CELLS`); a larger change is summarised.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.envelopes import (
    FILE,
    TEXT,
    CodeEditPayload,
    FileEdit,
    FilePayload,
    TodoPayload,
    ToolCallPayload,
    parse_message_metadata,
    with_file_line,
)
from orchestrator.model.messages import MessageType, StoredMessage, decode_part
from orchestrator.model.parts import RECORD_KINDS, Part

# Metadata key: the channel a message arrived on (mirroring skips it).
ORIGIN_CHANNEL_KEY = "origin_channel"

TODO_MARKS = {"pending": "○", "in_progress": "◐", "completed": "●"}
STRIKE = "\u0336"  # combining long stroke overlay
# difflib's cost grows with (old lines x new lines) and worse on adversarial
# input (2,000 x 2,000 interleaved lines: 0.6 s; 4,000: 3.3 s); above this
# many cells the change is summarised instead of diffed.
DIFF_MAX_CELLS = 1_000_000
DIFF_CONTEXT = 3
_HUNK = re.compile(r"^@@ -(\d+)(,\d+)? \+(\d+)(,\d+)? @@$")


class RenderedMessage(BaseModel):
    """What a channel is given: the text to show and the message it shows."""

    model_config = ConfigDict(frozen=True)

    text: str
    chat_jid: str
    seq: int
    id: str
    message_type: MessageType
    structured_type: str = TEXT  # the envelope's type: TEXT, CODE_EDIT, TODO, TOOL_CALL, ...
    sender: str
    sender_name: str
    content: str  # the stored text, for channels that draw their own
    origin_channel: str | None = None
    # This message on this channel, the same on every attempt (the deliveries ledger's
    # row, "<install id>-<row id>"): what a receiver deduplicates a resend by.
    delivery_id: str | None = None
    # The stored message's metadata (its structured envelope, run id, the input it
    # answers, ...), for channels that draw their own (Slack's Block Kit) or reply in
    # a thread.  Left out of dumps: the webhook's body stays what it was, and a
    # CODE_EDIT's file contents are not sent twice.
    metadata: JsonObject | None = Field(default=None, exclude=True)

    @property
    def part(self) -> Part:
        """What the message is, as ``StoredMessage.part`` says (decoded from the same type,
        sender and metadata; a property, not a field, so that no dump carries it)."""
        return decode_part(self.message_type, self.sender, self.metadata)


def displayed(msg: StoredMessage) -> bool:
    """Channels show it: not superseded, and not a stored-only record (tool_use, thinking, ...)."""
    return msg.superseded_at is None and msg.part.kind not in RECORD_KINDS


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
    # Only the changed middle goes to difflib, with its context lines; hunk
    # numbers are shifted back by what was cut in front.
    head, tail = _common_ends(old, new)
    lo = max(0, head - DIFF_CONTEXT)
    cut_tail = max(0, tail - DIFF_CONTEXT)
    old_mid, new_mid = old[lo : len(old) - cut_tail], new[lo : len(new) - cut_tail]
    if len(old_mid) * len(new_mid) > DIFF_MAX_CELLS:
        return (
            f"--- {before}\n+++ {after}\n(lines {head + 1}-{len(old) - tail} of {len(old)} replaced by "
            f"{len(new) - head - tail} lines; too large a change to show as a diff)"
        )
    diff = list(difflib.unified_diff(old_mid, new_mid, before, after, lineterm="", n=DIFF_CONTEXT))
    if not diff:
        return f"--- {before}\n+++ {after}\n(no changes)"
    return "\n".join(_shift_hunk(line, lo) for line in diff)


def _common_ends(old: list[str], new: list[str]) -> tuple[int, int]:
    """How many lines ``old`` and ``new`` share at the start, then at the end (not overlapping)."""
    shortest = min(len(old), len(new))
    head = 0
    while head < shortest and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < shortest - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    return head, tail


def _shift_hunk(line: str, by: int) -> str:
    match = _HUNK.match(line) if by and line.startswith("@@") else None
    if match is None:
        return line
    old_start, old_len, new_start, new_len = match.groups()
    return f"@@ -{int(old_start) + by}{old_len or ''} +{int(new_start) + by}{new_len or ''} @@"


def render_todos(payload: TodoPayload) -> str:
    return "\n".join(
        f"{TODO_MARKS[t.status]} {struck(t.content) if t.status == 'completed' else t.content}" for t in payload.todos
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
    if isinstance(payload, FilePayload):
        return parsed.message_type, with_file_line(msg.content, msg.metadata)
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
    part = msg.part.kind
    kind, body = _structured(msg, in_tool_result=part == "tool_result")
    # Words with their files under them read as words: they start on the name's line.
    structured = body is not None and kind != FILE
    text_body = body if body is not None else msg.content
    match part:
        case "host_note":
            text = f"🏠 {msg.content}"
        case "tool_result":
            text = _tool_header(msg) + (f"\n{text_body}" if text_body else "")
        case "tool_use":
            text = f"🛠️ {msg.content}"
        case "thinking":
            text = f"💭 {msg.content}"
        case "system_text" | "egress_log":
            text = f"⚙️ [system] {text_body}"
        case "result_meta" if msg.message_type == "system":  # the record may be stored either way
            text = f"⚙️ [system] {text_body}"
        case "assistant_text" | "result_meta":
            text = _said(msg.sender_name or assistant_name, text_body, structured)
        case "user_text":
            text = _said(msg.sender_name or msg.sender, text_body, structured)
    origin = (msg.metadata or {}).get(ORIGIN_CHANNEL_KEY)
    return RenderedMessage(
        text=text,
        chat_jid=msg.chat_jid,
        seq=msg.seq,
        id=msg.id,
        message_type=msg.message_type,
        structured_type=kind,
        sender=msg.sender,
        sender_name=msg.sender_name,
        content=msg.content,
        origin_channel=origin if isinstance(origin, str) else None,
        metadata=msg.metadata,
    )


def render_text(msg: StoredMessage, assistant_name: str) -> str:
    return render(msg, assistant_name).text
