"""A deterministic model that needs no network and no key.

It makes the image usable out of the box (a demo, the host's end-to-end
tests) and, because it implements the same :class:`Provider` interface, it
drives the real agent loop, tool execution included:

* the newest user message has tool requests (below) -> one assistant turn
  calling those tools, in message order;
* the newest user message carries tool results -> a text reporting each
  call's output and exit code (``Ran `echo hi` (exit 0):`` for bash,
  ``Ran `write_file src/a.py` (exit 0):`` for other tools);
* the newest user message is exactly ``/system`` -> the system prompt this
  run was given (the base prompt and every system notice), verbatim;
* the newest user message is ``/images`` (its files named after it) -> one line per
  image block it carries (``image/png 40x30``), and the text of any image that is
  not shown;
* otherwise -> a short text quoting the newest user message.

Tool requests are lines of the newest user message, starting in column 0::

    $ echo hi            bash {"command": "echo hi"}
    /read PATH           read_file {"path": PATH}
    /send TEXT           send_message {"text": TEXT} (this chat)
    /send-to JID TEXT    send_message {"chat_jid": JID, "text": TEXT}
    /send-file PATH [C]  send_file {"path": PATH, "caption": C} (PATH ends at
                         the first space; without C, no caption)
    /schedule every 60s: TEXT    schedule_task {"prompt": TEXT, "kind":
    /schedule cron 0 9 * * 1-5: TEXT   "interval" | "cron" | "once", "spec": ...}
    /schedule once 2026-12-01T09:00Z: TEXT
    /tasks               list_tasks {}
    /ask Q | A | B ...   ask_user {"question": Q, "options": [A, B, ...]}
    /edit-last TEXT      edit_message {"text": TEXT} (its latest message)
    /react EMOJI         add_reaction {"emoji": EMOJI} (the latest message from a person)
    /pause-task ID       pause_task {"task_id": ID} (also /resume-task, /cancel-task)
    /write PATH          write_file {"path": PATH, "content": the lines up to
    line 1               /end, each ending in a newline}
    /end
    /edit PATH           edit_file {"path": PATH, "old_string": the lines up to
    old line(s)          /with, "new_string": the lines up to /end; both joined
    /with                with newlines, without a final one}
    new line(s)
    /end
    /todo                todo_write {"todos": [{"id": "1", "content": "a",
    [ ] a                "status": "pending"}, {"id": "2", ... "in_progress"},
    [~] b                {"id": "3", ... "completed"}]}; other lines in the
    [x] c                block are ignored
    /end

Lines inside a block are content, never requests.  A block without its
closing ``/end`` runs to the end of the message; an ``/edit`` block without
a ``/with`` line is ignored.  Requests for tools the loop does not offer
are dropped.
"""

from __future__ import annotations

import json
import re

from ..protocol import JsonObject
from .base import (
    ImageBlock,
    ProviderMessage,
    ProviderResponse,
    TextBlock,
    TextSink,
    TokenUsage,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)

COMMAND_PREFIX = "$ "
SHOW_SYSTEM = "/system"
SHOW_IMAGES = "/images"
MAX_QUOTE_CHARS = 200
END, WITH = "/end", "/with"
TODO_STATUS_BY_MARK = {"[ ]": "pending", "[~]": "in_progress", "[x]": "completed"}
TODO_LINE = re.compile(r"^(\[[ ~xX]\])\s+(.*\S)\s*$")


def _approx_tokens(text: str) -> int:
    # Rough but non-zero, so usage accounting is exercised end to end.
    return max(1, len(text) // 4)


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > MAX_QUOTE_CHARS:
        flat = flat[: MAX_QUOTE_CHARS - 1] + "…"
    return flat


def _directive(line: str, name: str) -> str | None:
    """The argument of ``/name ARG`` (stripped, non-empty), else None."""
    if not line.startswith(name + " "):
        return None
    return line[len(name) + 1 :].strip() or None


def _block(lines: list[str], start: int, stops: tuple[str, ...]) -> tuple[list[str], int, str | None]:
    """Lines from ``start`` up to the first stop line: (body, index of the stop, stop)."""
    for i in range(start, len(lines)):
        if lines[i].rstrip() in stops:
            return lines[start:i], i, lines[i].rstrip()
    return lines[start:], len(lines), None


def _todos(body: list[str]) -> list[dict[str, str]]:
    todos: list[dict[str, str]] = []
    for line in body:
        match = TODO_LINE.match(line.strip())
        if match:
            status = TODO_STATUS_BY_MARK[match.group(1).lower()]
            todos.append({"id": str(len(todos) + 1), "content": match.group(2), "status": status})
    return todos


_WHEN_WORDS = {"every": "interval", "cron": "cron", "once": "once"}


def _schedule(rest: str) -> JsonObject | None:
    """``every 60s: TEXT``, ``cron 0 9 * * 1-5: TEXT``, ``once 2026-12-01T09:00Z: TEXT`` -> the
    schedule_task input (None: not that shape)."""
    when, sep, prompt = rest.partition(": ")
    word, _, spec = when.strip().partition(" ")
    if not sep or word not in _WHEN_WORDS or not spec.strip() or not prompt.strip():
        return None
    return {"prompt": prompt.strip(), "kind": _WHEN_WORDS[word], "spec": spec.strip()}


def tool_requests_in(text: str) -> list[tuple[str, JsonObject]]:  # noqa: C901 - the offline model's command table, one branch a command
    """The (tool name, input) pairs requested by a message, in order (see module docstring)."""
    lines = text.splitlines()
    requests: list[tuple[str, JsonObject]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(COMMAND_PREFIX) and line[len(COMMAND_PREFIX) :].strip():
            requests.append(("bash", {"command": line[len(COMMAND_PREFIX) :].strip()}))
        elif (rest := _directive(line, "/send")) is not None:
            requests.append(("send_message", {"text": rest}))
        elif (rest := _directive(line, "/send-to")) is not None and " " in rest:
            target, text = rest.split(" ", 1)
            requests.append(("send_message", {"chat_jid": target, "text": text}))
        elif (rest := _directive(line, "/send-file")) is not None:
            file_path, _, caption = rest.partition(" ")
            send: JsonObject = {"path": file_path}
            if caption.strip():
                send["caption"] = caption.strip()
            requests.append(("send_file", send))
        elif (rest := _directive(line, "/schedule")) is not None and (task := _schedule(rest)) is not None:
            requests.append(("schedule_task", task))
        elif (rest := _directive(line, "/edit-last")) is not None:
            requests.append(("edit_message", {"text": rest}))
        elif (rest := _directive(line, "/react")) is not None:
            requests.append(("add_reaction", {"emoji": rest}))
        elif (rest := _directive(line, "/ask")) is not None and "|" in rest:
            question, *options = (part.strip() for part in rest.split("|"))
            requests.append(("ask_user", {"question": question, "options": options}))
        elif line.rstrip() == "/tasks":
            requests.append(("list_tasks", {}))
        elif (rest := _directive(line, "/pause-task")) is not None:
            requests.append(("pause_task", {"task_id": rest}))
        elif (rest := _directive(line, "/resume-task")) is not None:
            requests.append(("resume_task", {"task_id": rest}))
        elif (rest := _directive(line, "/cancel-task")) is not None:
            requests.append(("cancel_task", {"task_id": rest}))
        elif (path := _directive(line, "/read")) is not None:
            requests.append(("read_file", {"path": path}))
        elif (path := _directive(line, "/write")) is not None:
            body, i, _ = _block(lines, i + 1, (END,))
            requests.append(("write_file", {"path": path, "content": "".join(f"{b}\n" for b in body)}))
        elif (path := _directive(line, "/edit")) is not None:
            old, i, stop = _block(lines, i + 1, (WITH, END))
            if stop == WITH:
                new, i, _ = _block(lines, i + 1, (END,))
                requests.append(
                    ("edit_file", {"path": path, "old_string": "\n".join(old), "new_string": "\n".join(new)})
                )
        elif line.rstrip() == "/todo":
            body, i, _ = _block(lines, i + 1, (END,))
            requests.append(("todo_write", {"todos": _todos(body)}))
        i += 1
    return requests


class OfflineProvider:
    """Rule-based stand-in for a real model (see module docstring)."""

    def __init__(self, assistant_name: str) -> None:
        self.assistant_name = assistant_name

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec], on_text: TextSink | None = None
    ) -> ProviderResponse:
        # ``on_text`` is not called: the answer exists at once, nothing to show before it.
        prompt_text = system + "".join(_message_text(m) for m in messages)
        usage_in = _approx_tokens(prompt_text)
        newest = messages[-1] if messages and messages[-1].role == "user" else None
        if newest is None:
            return self._text("(offline model: there is no user message to answer)", usage_in)

        results = [b for b in newest.content if isinstance(b, ToolResultBlock)]
        # Results with text after them: an earlier run's last results, then a new message to answer.
        if results and not newest.text().strip():
            return self._text(_report(results, messages), usage_in)

        if newest.text().strip() == SHOW_SYSTEM:
            return self._text(system, usage_in)
        if newest.text().strip().split("\n", 1)[0] == SHOW_IMAGES:
            return self._text(_images(newest), usage_in)

        offered = {t.name for t in tools}
        requests = [(name, args) for name, args in tool_requests_in(newest.text()) if name in offered]
        if requests:
            turn = sum(1 for m in messages if m.role == "assistant")
            calls = [
                ToolUseBlock(id=f"toolu_offline_{turn}_{i}", name=name, input=args)
                for i, (name, args) in enumerate(requests)
            ]
            out = sum(_approx_tokens(json.dumps(c.input)) for c in calls)
            return ProviderResponse(
                content=list(calls),
                stop_reason="tool_use",
                usage=TokenUsage(input_tokens=usage_in, output_tokens=out),
            )

        reply = f'{self.assistant_name} (offline model) received: "{_quote(newest.text())}"'
        return self._text(reply, usage_in)

    @staticmethod
    def _text(text: str, usage_in: int) -> ProviderResponse:
        return ProviderResponse(
            content=[TextBlock(text=text)],
            stop_reason="end_turn",
            usage=TokenUsage(input_tokens=usage_in, output_tokens=_approx_tokens(text)),
        )


def _images(message: ProviderMessage) -> str:
    """What ``/images`` answers: each image block's type and size, and each image not shown."""
    lines = [f"{b.media_type} {b.width}x{b.height}" for b in message.content if isinstance(b, ImageBlock)]
    lines += [line for line in message.text().splitlines() if line.startswith("[image ")]
    return "\n".join(lines) or "(no images)"


def _message_text(message: ProviderMessage) -> str:
    parts: list[str] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            parts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            parts.append(block.content)
        elif isinstance(block, ToolUseBlock):
            parts.append(json.dumps(block.input))
    return "\n".join(parts)


def _label(call: ToolUseBlock) -> str:
    """How a report names a call: the command for bash, else the tool and its main argument."""
    if call.name == "bash":
        return str(call.input.get("command", call.name))
    for key in ("path", "pattern"):
        value = call.input.get(key)
        if isinstance(value, str) and value:
            return f"{call.name} {value}"
    return call.name


def _report(results: list[ToolResultBlock], messages: list[ProviderMessage]) -> str:
    """Describe each tool result, naming the call that produced it."""
    labels: dict[str, str] = {}
    for message in messages:
        for block in message.content:
            if isinstance(block, ToolUseBlock):
                labels[block.id] = _label(block)
    sections = []
    for result in results:
        label = labels.get(result.tool_use_id, "?")
        status = f"exit {result.exit_code}" if result.exit_code is not None else "no exit code"
        if result.is_error:
            status += ", error"
        body = result.content.rstrip("\n") or "(no output)"
        sections.append(f"Ran `{label}` ({status}):\n```\n{body}\n```")
    return "\n\n".join(sections)
