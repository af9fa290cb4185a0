"""The ``todo_write`` tool: the model's task list for this run, replaced as a whole each call."""

from __future__ import annotations

from typing import get_args

from .. import envelopes
from ..protocol import TodoStatus
from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome, bad_input

NAME = "todo_write"
STATUSES: tuple[str, ...] = get_args(TodoStatus)
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


class TodoEntry(ToolArgs):
    id: NonBlank
    content: NonBlank
    status: TodoStatus


class TodoWriteArgs(ToolArgs):
    todos: list[TodoEntry]


def _items(todos: list[TodoEntry]) -> list[dict[str, str]] | ToolOutcome:
    seen: set[str] = set()
    for i, item in enumerate(todos):
        if item.id in seen:
            return bad_input(NAME, f"todos[{i}].id {item.id!r} is used twice")
        seen.add(item.id)
    return [{"id": t.id, "content": t.content, "status": t.status} for t in todos]


def summarize(todos: list[dict[str, str]]) -> str:
    if not todos:
        return "Cleared the todo list"
    counts = {s: sum(t["status"] == s for t in todos) for s in STATUSES}
    head = (
        f"Todo list updated: {counts['completed']} completed, "
        f"{counts['in_progress']} in progress, {counts['pending']} pending"
    )
    return "\n".join([head] + [f"{MARKS[t['status']]} {t['content']}" for t in todos])


def todo_write(args: TodoWriteArgs, ctx: ToolContext) -> ToolOutcome:
    items = _items(args.todos)
    if isinstance(items, ToolOutcome):
        return items
    ctx.state.todos = items
    # The host's TODO envelope needs at least one item: clearing is a plain tool call.
    envelope = envelopes.todo(items) if items else None
    return ToolOutcome(summarize(items), 0, envelope=envelope)
