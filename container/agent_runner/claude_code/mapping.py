"""The Claude Agent SDK's typed messages as our protocol events.

================================  ==========================================
SDK message / block               event
================================  ==========================================
AssistantMessage TextBlock        AssistantEvent (stored as ``assistant``)
AssistantMessage ThinkingBlock    ThinkingEvent (stored, never sent)
AssistantMessage ToolUseBlock     ToolUseEvent (remembered until its result)
UserMessage ToolResultBlock       ToolResultEvent with an envelope: Write,
                                  Edit, MultiEdit -> CODE_EDIT (the file
                                  before and after), TodoWrite -> TODO, any
                                  other tool (or a failed call) -> TOOL_CALL
ResultMessage                     ResultEvent (usage, session id, turns)
StreamEvent text_delta            TextDeltaEvent, coalesced (never stored)
================================  ==========================================

The SDK's classes are read by their fields (duck typing), so this module
imports nothing of the SDK and its rules are tested without it.  Messages of
a subagent (``parent_tool_use_id`` set) are the subagent's inner work: only
the top-level conversation is the chat's.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import envelopes
from ..errors import ProviderError
from ..protocol import (
    AssistantEvent,
    Event,
    KnownEnvelope,
    ResultEvent,
    ThinkingEvent,
    ToolResultEvent,
    ToolUseEvent,
    Usage,
    envelope_to_dict,
)
from ..text_stream import DeltaCoalescer

log = logging.getLogger(__name__)

Emit = Callable[[Event], None]
# What the CLI calls the file tools whose results become CODE_EDIT envelopes.
EDIT_TOOLS = frozenset({"Write", "Edit", "MultiEdit"})
TODO_TOOL = "TodoWrite"
# At most this much of a file is kept as its before/after text.
SNAPSHOT_BYTES = envelopes.CONTENT_CAP_BYTES
MAX_TURNS_STOP_REASON = "max_turns"
# ResultMessage subtypes that end a run on a limit, not on a failure.
LIMIT_SUBTYPES = {"error_max_turns": MAX_TURNS_STOP_REASON, "error_max_budget_usd": "max_budget"}
# AssistantMessage.error values that running again may cure.
RETRYABLE_ERRORS = frozenset({"rate_limit", "server_error", "overloaded", "unknown"})


@dataclass(frozen=True)
class Snapshot:
    """A file's text when it was read (None: it did not exist) and its whole size."""

    text: str | None
    size: int = 0


def read_snapshot(path: Path) -> Snapshot:
    """The beginning of ``path`` as text, never blocking on a FIFO or device.

    The workspace is the agent's own, so this read is only bounded, not
    distrusted: a name that is not a regular file reads as absent.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return Snapshot(None)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Snapshot(None)
        data = os.read(fd, SNAPSHOT_BYTES)
        return Snapshot(data.decode("utf-8", errors="replace"), info.st_size)
    finally:
        os.close(fd)


def tool_result_text(content: Any) -> str:
    """A tool result's content as text: the SDK gives a string or a list of blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content if isinstance(content, list) else [content]:
        if isinstance(block, Mapping):
            if block.get("type") == "text":
                parts.append(str(block.get("text", "")))
            else:
                parts.append(f"[{block.get('type', 'content')}]")
        else:
            parts.append(str(block))
    return "\n".join(parts)


def _todo_items(tool_input: Mapping[str, Any]) -> list[dict[str, str]] | None:
    """The CLI's TodoWrite list (content, status, activeForm; no ids) in our shape."""
    todos = tool_input.get("todos")
    if not isinstance(todos, list) or not todos:
        return None
    items: list[dict[str, str]] = []
    for i, todo in enumerate(todos, 1):
        if not isinstance(todo, Mapping):
            return None
        status = todo.get("status")
        if status not in ("pending", "in_progress", "completed"):
            return None
        items.append({"id": str(todo.get("id") or i), "content": str(todo.get("content", "")), "status": status})
    return items


@dataclass
class EventMapper:
    """Turns the SDK's message stream into events; keeps what spans messages.

    ``workspace``: where relative paths of file tools resolve.  ``before``:
    the file snapshots the pre-tool hook took, by tool_use id.
    """

    emit: Emit
    workspace: Path
    # The streamed text's sink (``include_partial_messages``); None: not streamed.
    deltas: DeltaCoalescer | None = None
    # A tool result's text as sent to the host is capped like our own tools' output
    # (``Limits.output_cap_bytes``): one event line stays well under the host's line limit.
    output_cap: int = 16_000
    before: dict[str, Snapshot] = field(default_factory=dict)
    calls: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    result: ResultEvent | None = None
    model_calls: int = 0

    def file_path(self, tool_input: Mapping[str, Any]) -> Path | None:
        raw = tool_input.get("file_path")
        if not isinstance(raw, str) or not raw:
            return None
        path = Path(raw)
        return path if path.is_absolute() else self.workspace / path

    def shown_path(self, path: Path) -> str:
        """The path as the chat shows it: relative to the workspace when inside it."""
        try:
            return str(path.relative_to(self.workspace))
        except ValueError:
            return str(path)

    def snapshot_before(self, tool_use_id: str, tool_name: str, tool_input: Mapping[str, Any]) -> None:
        """Called by the pre-tool hook: the file as it is before an edit tool runs."""
        if tool_name in EDIT_TOOLS and (path := self.file_path(tool_input)) is not None:
            self.before[tool_use_id] = read_snapshot(path)

    def feed(self, message: Any) -> None:
        kind = type(message).__name__
        if getattr(message, "parent_tool_use_id", None):
            return  # a subagent's inner turn
        if kind == "StreamEvent":
            self._stream(message.event)
        elif kind == "AssistantMessage":
            if self.deltas is not None:
                self.deltas.flush()
            self._assistant(message)
        elif kind == "UserMessage":
            self._user(message)
        elif kind == "ResultMessage":
            self._result(message)

    def _stream(self, event: Any) -> None:
        """A raw Messages API stream event: text deltas go out as they come."""
        if self.deltas is None or not isinstance(event, Mapping):
            return
        kind = event.get("type")
        if kind == "message_start":
            self.model_calls += 1
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, Mapping) and delta.get("type") == "text_delta":
                self.deltas.add(f"{self.model_calls}.{event.get('index', 0)}", str(delta.get("text", "")))
        elif kind == "message_stop":
            self.deltas.flush()

    def _assistant(self, message: Any) -> None:
        error = getattr(message, "error", None)
        if error:
            text = " ".join(b.text for b in message.content if type(b).__name__ == "TextBlock")
            raise ProviderError(
                f"the model call failed ({error}): {text}".strip(), retryable=str(error) in RETRYABLE_ERRORS
            )
        for block in message.content:
            kind = type(block).__name__
            if kind == "TextBlock" and block.text.strip():
                self.emit(AssistantEvent(text=block.text))
            elif kind == "ThinkingBlock" and block.thinking.strip():
                self.emit(ThinkingEvent(text=block.thinking))
            elif kind == "ToolUseBlock":
                tool_input = block.input if isinstance(block.input, dict) else {}
                self.calls[block.id] = (block.name, tool_input)
                self.emit(ToolUseEvent(id=block.id, name=block.name, input=tool_input))

    def _user(self, message: Any) -> None:
        if not isinstance(message.content, list):
            return  # our own prompt echoed back
        for block in message.content:
            if type(block).__name__ == "ToolResultBlock":
                self._tool_result(block)

    def _tool_result(self, block: Any) -> None:
        name, tool_input = self.calls.pop(block.tool_use_id, ("?", {}))
        output = envelopes.cap_text(tool_result_text(block.content), cap=self.output_cap)
        is_error = bool(block.is_error)
        self.emit(
            ToolResultEvent(
                tool_use_id=block.tool_use_id,
                name=name,
                output=output,
                exit_code=1 if is_error else 0,
                is_error=is_error,
                envelope=envelope_to_dict(self.envelope(block.tool_use_id, name, tool_input, output, is_error)),
            )
        )

    def envelope(
        self, tool_use_id: str, name: str, tool_input: Mapping[str, Any], output: str, is_error: bool
    ) -> KnownEnvelope:
        before = self.before.pop(tool_use_id, None)
        if not is_error and name in EDIT_TOOLS and (path := self.file_path(tool_input)) is not None:
            after = read_snapshot(path)
            if after.text is not None:
                old = before.text if before is not None else None
                return envelopes.code_edit(
                    self.shown_path(path), old, after.text, old_total_bytes=before.size if before is not None else None
                )
        if not is_error and name == TODO_TOOL and (items := _todo_items(tool_input)) is not None:
            return envelopes.todo(items)
        return envelopes.tool_call(name, tool_input, output, is_error=is_error)

    def _result(self, message: Any) -> None:
        subtype = str(getattr(message, "subtype", ""))
        stop_reason = getattr(message, "stop_reason", None)
        if getattr(message, "is_error", False):
            if subtype in LIMIT_SUBTYPES:
                stop_reason = LIMIT_SUBTYPES[subtype]
            else:
                detail = getattr(message, "result", None) or subtype
                raise ProviderError(f"Claude Code ended with an error: {detail}", retryable=False)
        usage = getattr(message, "usage", None) or {}
        cache_read = int(usage.get("cache_read_input_tokens") or 0)
        cache_creation = int(usage.get("cache_creation_input_tokens") or 0)
        self.result = ResultEvent(
            usage=Usage(
                # Ours counts every prompt token; the API's input_tokens leaves the cache out.
                input_tokens=int(usage.get("input_tokens") or 0) + cache_read + cache_creation,
                output_tokens=int(usage.get("output_tokens") or 0),
                cache_read_input_tokens=cache_read,
                cache_creation_input_tokens=cache_creation,
            ),
            session_id=getattr(message, "session_id", None),
            stop_reason=stop_reason,
            num_turns=int(getattr(message, "num_turns", 0) or 0),
        )
