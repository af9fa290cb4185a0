"""A deterministic model that needs no network and no key.

It makes the image usable out of the box (a demo, the host's end-to-end
tests) and, because it implements the same :class:`Provider` interface, it
drives the real agent loop, tool execution included:

* newest user message has lines starting with ``$ `` -> one ``bash`` call per
  such line;
* the newest user message carries tool results -> a text reporting each
  command's output and exit code;
* otherwise -> a short text quoting the newest user message.
"""

from __future__ import annotations

import json

from .base import (
    ProviderMessage,
    ProviderResponse,
    TextBlock,
    TokenUsage,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)

COMMAND_PREFIX = "$ "
MAX_QUOTE_CHARS = 200


def _approx_tokens(text: str) -> int:
    # Rough but non-zero, so usage accounting is exercised end to end.
    return max(1, len(text) // 4)


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > MAX_QUOTE_CHARS:
        flat = flat[: MAX_QUOTE_CHARS - 1] + "…"
    return flat


def commands_in(text: str) -> list[str]:
    """The shell commands requested by ``$ `` lines, in order."""
    return [
        line[len(COMMAND_PREFIX) :].strip()
        for line in text.splitlines()
        if line.startswith(COMMAND_PREFIX) and line[len(COMMAND_PREFIX) :].strip()
    ]


class OfflineProvider:
    """Rule-based stand-in for a real model (see module docstring)."""

    def __init__(self, assistant_name: str) -> None:
        self.assistant_name = assistant_name

    def complete(
        self, system: str, messages: list[ProviderMessage], tools: list[ToolSpec]
    ) -> ProviderResponse:
        prompt_text = system + "".join(_message_text(m) for m in messages)
        usage_in = _approx_tokens(prompt_text)
        newest = messages[-1] if messages and messages[-1].role == "user" else None
        if newest is None:
            return self._text("(offline model: there is no user message to answer)", usage_in)

        results = [b for b in newest.content if isinstance(b, ToolResultBlock)]
        if results:
            return self._text(_report(results, messages), usage_in)

        commands = commands_in(newest.text())
        if commands and any(t.name == "bash" for t in tools):
            turn = sum(1 for m in messages if m.role == "assistant")
            calls = [
                ToolUseBlock(id=f"toolu_offline_{turn}_{i}", name="bash", input={"command": c})
                for i, c in enumerate(commands)
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


def _report(results: list[ToolResultBlock], messages: list[ProviderMessage]) -> str:
    """Describe each tool result, naming the command that produced it."""
    commands: dict[str, str] = {}
    for message in messages:
        for block in message.content:
            if isinstance(block, ToolUseBlock):
                commands[block.id] = str(block.input.get("command", block.name))
    sections = []
    for result in results:
        command = commands.get(result.tool_use_id, "?")
        status = f"exit {result.exit_code}" if result.exit_code is not None else "no exit code"
        if result.is_error:
            status += ", error"
        body = result.content.rstrip("\n") or "(no output)"
        sections.append(f"Ran `{command}` ({status}):\n```\n{body}\n```")
    return "\n\n".join(sections)
