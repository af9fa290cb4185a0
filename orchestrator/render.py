"""How a stored message looks on a text channel, by type.

host 🏠, tool results 🔧 with ✅/❌ and the exit code, assistant replies
under the assistant's name, system messages set apart, user messages as
"name: text".
"""

from __future__ import annotations

from .messages import SENDER_THINKING, SENDER_TOOL_USE, StoredMessage


def render_text(msg: StoredMessage, assistant_name: str) -> str:
    meta = msg.metadata or {}
    if msg.message_type == "host":
        return f"🏠 {msg.content}"
    if msg.message_type == "tool_result":
        code = meta.get("exit_code")
        mark = "✅" if code == 0 else "❌"
        return f"🔧 {mark} exit {code}\n{msg.content}"
    if msg.message_type == "system":
        return f"⚙️ [system] {msg.content}"
    if msg.message_type == "assistant":
        if msg.sender == SENDER_TOOL_USE:
            return f"🛠️ {msg.content}"
        if msg.sender == SENDER_THINKING:
            return f"💭 {msg.content}"
        return f"{msg.sender_name or assistant_name}: {msg.content}"
    return f"{msg.sender_name or msg.sender}: {msg.content}"
