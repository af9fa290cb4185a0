"""Turn a ``ContainerInput`` into what a provider takes: a system prompt and messages.

Providers only know two roles, user and assistant, and (for Anthropic) need
them to alternate and to start with the user.  The host's history has four
roles, so ``system`` and ``tool_result`` history messages become user-role
text with a visible marker, and neighbours of the same role are merged.
"""

from __future__ import annotations

from pathlib import Path

from .errors import InputError
from .protocol import ContainerInput, JsonObject, SdkMessage
from .providers.base import ProviderMessage, Role, TextBlock

BASE_PROMPT = (
    "You are {name}, an assistant taking part in a chat. You run inside a "
    "sandboxed Linux container without network access. Your working directory is "
    "{workspace}; files you create there are kept between conversations. Use your "
    "tools (bash, file reading, writing and editing, glob, grep, a todo list) when "
    "they help you answer, then reply to the chat "
    "concisely. Your text replies are sent to the chat as they are."
)

# Placeholder for a history that starts with the assistant (providers reject that).
HISTORY_START = "[earlier conversation omitted]"


def build_system_prompt(inp: ContainerInput, workspace: Path, extra_notices: list[str] | None = None) -> str:
    """The base prompt, then each system notice (ephemeral context for this run only):
    the host's, then the runner's own about the workspace (``workspace_notices``)."""
    parts = [BASE_PROMPT.format(name=inp.assistant_name, workspace=workspace)]
    notices = [*inp.system_notices, *(extra_notices or [])]
    parts.extend(notice.strip() for notice in notices if notice.strip())
    return "\n\n".join(parts)


def _tool_result_text(message: SdkMessage) -> str:
    meta: JsonObject = message.metadata or {}
    header = "[tool_result"
    if meta.get("name"):
        header += f" name={meta['name']}"
    if meta.get("exit_code") is not None:
        header += f" exit_code={meta['exit_code']}"
    return f"{header}]\n{message.content}"


def _as_provider_turn(message: SdkMessage) -> tuple[Role, str]:
    if message.role == "assistant":
        return "assistant", message.content
    if message.role == "system":
        return "user", f"[system]\n{message.content}"
    if message.role == "tool_result":
        return "user", _tool_result_text(message)
    return "user", message.content


def build_messages(history: list[SdkMessage]) -> list[ProviderMessage]:
    """Provider messages from the host's history: roles mapped, same-role runs merged.

    Raises :class:`InputError` when there is nothing for the model to answer.
    """
    if not history:
        raise InputError("ContainerInput.messages is empty: nothing to answer")
    merged: list[tuple[Role, list[str]]] = []
    for message in history:
        role, text = _as_provider_turn(message)
        if merged and merged[-1][0] == role:
            merged[-1][1].append(text)
        else:
            merged.append((role, [text]))
    if merged[0][0] == "assistant":
        merged.insert(0, ("user", [HISTORY_START]))
    return [ProviderMessage(role, [TextBlock("\n\n".join(texts))]) for role, texts in merged]
