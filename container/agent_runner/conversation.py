"""Turn a ``ContainerInput`` into what a provider takes: a system prompt and messages.

Providers only know two roles, user and assistant, and (for Anthropic) need
them to alternate and to start with the user.  The host's history has four
roles.  Earlier runs' tool calls come back as the model made them: an
assistant message carrying ``tool_use`` becomes a tool_use block in the
assistant turn (after that turn's text), a ``tool_result`` naming its call
(``tool_use_id``) a tool_result block at the head of the next user turn.
Everything else becomes text: ``system`` messages and tool results that name
no call are user-role text with a visible marker.  Neighbours of the same
role are merged.

A provider refuses a call without its result right after it, or a result
without its call right before it (Anthropic and OpenAI alike).  The host
sends only matched pairs, but the input is checked again here: an unanswered
call is left out, an orphaned result becomes text, and an id used twice is
renamed (ids are unique within a run only).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from .errors import InputError
from .images import image_block
from .protocol import ContainerInput, JsonObject, SdkMessage, SdkToolUse
from .providers.base import (
    ContentBlock,
    ImageBlock,
    ProviderMessage,
    Role,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

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


MEMORY_HEADER = (
    "## Your memory\n"
    "This is MEMORY.md in your workspace, as it was when this run started. Keep it up to date: "
    "write there what you should remember in later conversations (it is shown to you every time)."
)


def build_system_prompt(inp: ContainerInput, workspace: Path, extra_notices: list[str] | None = None) -> str:
    """The base prompt, the instructions (the installation's and the group's), the group's
    memory, then each system notice (ephemeral context for this run only): the host's, then
    the runner's own about the workspace (``workspace_notices``)."""
    parts = [BASE_PROMPT.format(name=inp.assistant_name, workspace=workspace)]
    if isinstance(inp.instructions, str) and inp.instructions.strip():
        parts.append(inp.instructions.strip())
    if isinstance(inp.memory, str) and inp.memory.strip():
        parts.append(f"{MEMORY_HEADER}\n\n{inp.memory.strip()}")
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


def _as_block(message: SdkMessage) -> tuple[Role, ContentBlock]:
    if message.role == "assistant":
        if isinstance(message.tool_use, SdkToolUse):
            call = message.tool_use
            return "assistant", ToolUseBlock(id=call.id, name=call.name, input=call.input)
        return "assistant", TextBlock(message.content)
    if message.role == "system":
        return "user", TextBlock(f"[system]\n{message.content}")
    if message.role == "tool_result":
        if isinstance(message.tool_use_id, str):
            code = (message.metadata or {}).get("exit_code")
            return "user", ToolResultBlock(
                tool_use_id=message.tool_use_id,
                content=message.content,
                exit_code=code if isinstance(code, int) else None,
            )
        return "user", TextBlock(_tool_result_text(message))
    return "user", TextBlock(message.content)


def _as_blocks(message: SdkMessage, workspace: Path | None) -> tuple[Role, list[ContentBlock]]:
    """``message``'s role and blocks: one block, then a user message's images after its text."""
    role, block = _as_block(message)
    if role != "user" or not isinstance(message.images, list) or not message.images:
        return role, [block]
    if workspace is None:
        return role, [block, *(TextBlock(f"[image {i.file_id} is not shown]") for i in message.images)]
    return role, [block, *(image_block(workspace, ref) for ref in message.images)]


def _result_as_text(block: ToolResultBlock) -> TextBlock:
    code = "" if block.exit_code is None else f" exit_code={block.exit_code}"
    return TextBlock(f"[tool_result{code}]\n{block.content}")


def _turn(role: Role, blocks: list[ContentBlock]) -> ProviderMessage:
    """One provider message: tool results first (the API wants them right
    after the calls), then the text as one block, then the images, then the calls."""
    results = [b for b in blocks if isinstance(b, ToolResultBlock)]
    calls = [b for b in blocks if isinstance(b, ToolUseBlock)]
    images = [b for b in blocks if isinstance(b, ImageBlock)]
    texts = [b.text for b in blocks if isinstance(b, TextBlock)]
    text: list[ContentBlock] = [TextBlock("\n\n".join(texts))] if texts else []
    return ProviderMessage(role, [*results, *text, *images, *calls])


def _grouped(pieces: list[tuple[Role, list[ContentBlock]]]) -> list[tuple[Role, list[ContentBlock]]]:
    """Neighbours of the same role as one turn, blocks in their order; empty pieces dropped."""
    out: list[tuple[Role, list[ContentBlock]]] = []
    for role, blocks in pieces:
        if not blocks:
            continue
        if out and out[-1][0] == role:
            out[-1][1].extend(blocks)
        else:
            out.append((role, list(blocks)))
    return out


def _paired(messages: list[tuple[Role, list[ContentBlock]]]) -> list[tuple[Role, list[ContentBlock]]]:
    """Each call answered in the very next message and each result after its call;
    what is not is left out (a call) or made text (a result); ids made unique."""
    used: set[str] = set()
    asked: dict[str, str] = {}  # the previous assistant turn's calls: id -> id sent
    out: list[tuple[Role, list[ContentBlock]]] = []
    for i, (role, content) in enumerate(messages):
        blocks: list[ContentBlock] = []
        if role == "assistant":
            following = messages[i + 1][1] if i + 1 < len(messages) else []
            answered = {b.tool_use_id for b in following if isinstance(b, ToolResultBlock)}
            asked = {}
            for block in content:
                if not isinstance(block, ToolUseBlock):
                    blocks.append(block)
                elif block.id in answered and block.id not in asked:
                    asked[block.id] = _unique(block.id, used)
                    blocks.append(replace(block, id=asked[block.id]))
        else:
            for block in content:
                if not isinstance(block, ToolResultBlock):
                    blocks.append(block)
                elif block.tool_use_id in asked:
                    blocks.append(replace(block, tool_use_id=asked.pop(block.tool_use_id)))
                else:
                    blocks.append(_result_as_text(block))
            asked = {}
        out.append((role, blocks))
    return out


def _unique(call_id: str, used: set[str]) -> str:
    new, n = call_id, 1
    while new in used:
        n += 1
        new = f"{call_id}_{n}"
    used.add(new)
    return new


def build_messages(history: list[SdkMessage], workspace: Path | None = None) -> list[ProviderMessage]:
    """Provider messages from the host's history: roles mapped, earlier tool calls
    as tool blocks, same-role runs merged, every call paired with its result; a
    user message's images read from ``workspace`` as image blocks after its text.

    Raises :class:`InputError` when there is nothing for the model to answer.
    """
    if not history:
        raise InputError("ContainerInput.messages is empty: nothing to answer")
    pieces: list[tuple[Role, list[ContentBlock]]] = []
    for message in history:
        pieces.append(_as_blocks(message, workspace))
    messages = [_turn(role, blocks) for role, blocks in _grouped(_paired(_grouped(pieces)))]
    if messages[0].role == "assistant":
        messages.insert(0, ProviderMessage("user", [TextBlock(HISTORY_START)]))
    return messages
