"""The ``todo_write`` tool: the model's task list for this run, replaced as a whole each call."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import envelopes
from ..providers.base import ToolSpec
from .base import ToolContext, ToolOutcome, bad_input

NAME = "todo_write"
STATUSES = ("pending", "in_progress", "completed")
MARKS = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}

SPEC = ToolSpec(
    name=NAME,
    description=(
        "Keep a task list for the current work. Each call replaces the whole list: send "
        "every item with its current status (pending, in_progress or completed). Use it "
        "for multi-step tasks, with at most one item in_progress at a time."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "todos": {
                "type": "array",
                "description": "The complete list, in order.",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string", "description": "Stable id of the item, unique in the list."},
                        "content": {"type": "string", "description": "What is to be done."},
                        "status": {"type": "string", "enum": list(STATUSES)},
                    },
                    "required": ["id", "content", "status"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["todos"],
        "additionalProperties": False,
    },
)


def _parse(todos: Any) -> list[dict[str, str]] | ToolOutcome:
    if not isinstance(todos, list):
        return bad_input(NAME, "input needs a list 'todos'")
    items: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, item in enumerate(todos):
        where = f"todos[{i}]"
        if not isinstance(item, Mapping):
            return bad_input(NAME, f"{where} must be an object with id, content and status")
        todo_id, content, status = item.get("id"), item.get("content"), item.get("status")
        if not isinstance(todo_id, str) or not todo_id.strip():
            return bad_input(NAME, f"{where}.id must be a non-empty string")
        if todo_id in seen:
            return bad_input(NAME, f"{where}.id {todo_id!r} is used twice")
        if not isinstance(content, str) or not content.strip():
            return bad_input(NAME, f"{where}.content must be a non-empty string")
        if status not in STATUSES:
            return bad_input(NAME, f"{where}.status must be one of {', '.join(STATUSES)}, got {status!r}")
        seen.add(todo_id)
        items.append({"id": todo_id, "content": content, "status": status})
    return items


def summarize(todos: list[dict[str, str]]) -> str:
    if not todos:
        return "Cleared the todo list"
    counts = {s: sum(t["status"] == s for t in todos) for s in STATUSES}
    head = (
        f"Todo list updated: {counts['completed']} completed, "
        f"{counts['in_progress']} in progress, {counts['pending']} pending"
    )
    return "\n".join([head] + [f"{MARKS[t['status']]} {t['content']}" for t in todos])


def todo_write(args: Mapping[str, Any], ctx: ToolContext) -> ToolOutcome:
    items = _parse(args.get("todos"))
    if isinstance(items, ToolOutcome):
        return items
    ctx.state.todos = items
    # The host's TODO envelope needs at least one item: clearing is a plain tool call.
    envelope = envelopes.todo(items) if items else None
    return ToolOutcome(summarize(items), 0, envelope=envelope)
