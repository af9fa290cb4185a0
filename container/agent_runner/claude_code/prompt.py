"""What the Claude Code CLI is asked: the chat's messages as one prompt.

With a session to resume, the CLI already holds the earlier turns (its own
tool calls and results included), so the prompt is only what arrived since
the last answer: the messages after the history's last assistant or tool
result message.  Without one (a first run, a reset group, a session file
that is gone), the prompt is the whole history the host sent, as a
transcript, so the model still knows the conversation.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..protocol import SdkMessage

AGENT_ROLES = frozenset({"assistant", "tool_result"})
# The CLI's session ids are UUIDs; anything else is not looked up.
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,99}")


def since_last_answer(history: list[SdkMessage]) -> list[SdkMessage]:
    """The messages after the last one the agent produced (all when it produced none)."""
    last = max((i for i, m in enumerate(history) if m.role in AGENT_ROLES), default=-1)
    return history[last + 1 :]


def _line(message: SdkMessage, assistant_name: str) -> str:
    if message.role == "assistant":
        return f"{assistant_name} (you): {message.content}"
    if message.role == "tool_result":
        return f"[an earlier tool result]\n{message.content}"
    if message.role == "system":
        return f"[system] {message.content}"
    who = message.sender_name or "someone"
    when = f" at {message.timestamp}" if message.timestamp else ""
    return f"{who}{when}: {message.content}"


def transcript(messages: list[SdkMessage], assistant_name: str) -> str:
    return "\n\n".join(_line(m, assistant_name) for m in messages)


def build_prompt(history: list[SdkMessage], assistant_name: str, *, resuming: bool) -> str:
    """The prompt for this run; a resumed session gets only what is new."""
    if resuming:
        new = since_last_answer(history) or history[-1:]
        return transcript(new, assistant_name)
    earlier, new = history[: len(history) - len(since_last_answer(history))], since_last_answer(history)
    if not earlier or not new:
        return transcript(history, assistant_name)
    return (
        f"The conversation so far:\n\n{transcript(earlier, assistant_name)}\n\n"
        f"New since your last answer:\n\n{transcript(new, assistant_name)}"
    )


def session_file(config_dir: Path, session_id: str) -> Path | None:
    """The CLI's transcript of ``session_id`` under its config dir, if it is there."""
    if not _SESSION_ID.fullmatch(session_id):  # a glob pattern or a path is no session id
        return None
    return next((config_dir / "projects").glob(f"*/{session_id}.jsonl"), None)
