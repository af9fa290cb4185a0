"""How each message type and each structured envelope looks on a text channel."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.model.envelopes import build_structured_envelope
from orchestrator.model.messages import StoredMessage
from orchestrator.model.render import STRIKE, displayed, render, render_text


def _msg(
    message_type: str = "user",
    content: str = "",
    *,
    sender: str = "alice",
    sender_name: str = "Alice",
    metadata: dict[str, Any] | None = None,
    **kw: Any,
) -> StoredMessage:
    return StoredMessage(
        seq=7,
        id="m-7",
        chat_jid="team@chat",
        sender=sender,
        sender_name=sender_name,
        content=content,
        timestamp="2026-11-27T10:00:00+00:00",
        is_from_me=False,
        message_type=message_type,
        metadata=metadata,
        **kw,
    )  # type: ignore[arg-type]


def _tool(
    envelope: str, payload: dict[str, Any], content: str = "", exit_code: int = 0, tool: str = "t"
) -> StoredMessage:
    meta = build_structured_envelope(envelope, payload, extras={"exit_code": exit_code, "tool": tool})
    return _msg("tool_result", content, sender="command_output", sender_name=tool, metadata=meta)


@pytest.mark.parametrize(
    ("msg", "text"),
    [
        (_msg("user", "hello there"), "Alice: hello there"),
        (_msg("user", "hi", sender="u-42", sender_name=""), "u-42: hi"),
        (_msg("assistant", "sure", sender="bot", sender_name=""), "Andy: sure"),
        (_msg("assistant", "sure", sender="bot", sender_name="Robo"), "Robo: sure"),
        (_msg("system", "be brief", sender="system", sender_name=""), "⚙️ [system] be brief"),
        (_msg("host", "⚠️ Agent error: boom", sender="host"), "🏠 ⚠️ Agent error: boom"),
        (
            _msg("tool_result", "ok\n", sender="command_output", sender_name="bash", metadata={"exit_code": 0}),
            "🔧 ✅ exit 0 · bash\nok\n",
        ),
        (
            _msg(
                "tool_result",
                "nope",
                sender="command_output",
                sender_name="bash",
                metadata={"exit_code": 2, "tool": "bash"},
            ),
            "🔧 ❌ exit 2 · bash\nnope",
        ),
        (_msg("tool_result", "legacy", sender="command_output", sender_name=""), "🔧\nlegacy"),
        (_msg("assistant", "ls -la", sender="tool_use", sender_name="bash"), "🛠️ ls -la"),
    ],
)
def test_each_type(msg: StoredMessage, text: str) -> None:
    assert render_text(msg, "Andy") == text


def test_rendered_message_carries_its_source() -> None:
    r = render(_msg("user", "hey", metadata={"origin_channel": "phone"}), "Andy")
    assert (r.seq, r.id, r.chat_jid, r.message_type, r.structured_type) == (7, "m-7", "team@chat", "user", "TEXT")
    assert (r.sender, r.sender_name, r.content, r.origin_channel) == ("alice", "Alice", "hey", "phone")


def test_code_edit_is_a_unified_diff_per_file() -> None:
    msg = _tool(
        "CODE_EDIT",
        {
            "edits": [
                {"file_path": "src/app.py", "old_content": "a = 1\nb = 2\n", "new_content": "a = 1\nb = 3\n"},
                {"file_path": "NEW.md", "old_content": None, "new_content": "# hi\n"},
                {"file_path": "old.txt", "old_content": "bye\n", "new_content": None},
            ]
        },
        content="edited",
        tool="edit_file",
    )
    r = render(msg, "Andy")
    assert r.structured_type == "CODE_EDIT"
    assert r.text == "\n".join(
        [
            "🔧 ✅ exit 0 · edit_file",
            "--- a/src/app.py",
            "+++ b/src/app.py",
            "@@ -1,2 +1,2 @@",
            " a = 1",
            "-b = 2",
            "+b = 3",
            "--- /dev/null",
            "+++ b/NEW.md",
            "@@ -0,0 +1 @@",
            "+# hi",
            "--- a/old.txt",
            "+++ /dev/null",
            "@@ -1 +0,0 @@",
            "-bye",
        ]
    )


def test_an_unchanged_file_says_so() -> None:
    msg = _tool("CODE_EDIT", {"edits": [{"file_path": "a", "old_content": "x\n", "new_content": "x\n"}]})
    assert render_text(msg, "Andy").endswith("--- a/a\n+++ b/a\n(no changes)")


def test_todo_is_a_checklist_with_completed_items_struck_through() -> None:
    msg = _tool(
        "TODO",
        {
            "todos": [
                {"id": "1", "content": "read the code", "status": "completed"},
                {"id": "2", "content": "fix it", "status": "in_progress"},
                {"id": "3", "content": "ship", "status": "pending"},
            ]
        },
        tool="todo_write",
    )
    lines = render_text(msg, "Andy").splitlines()
    assert lines[0] == "🔧 ✅ exit 0 · todo_write"
    done = "r̶e̶a̶d̶ t̶h̶e̶ c̶o̶d̶e̶"
    assert done == "".join(c if c == " " else c + STRIKE for c in "read the code")
    assert lines[1:] == [f"● {done}", "◐ fix it", "○ ship"]


def test_tool_call_shows_name_input_and_output_or_error() -> None:
    ok = _tool(
        "TOOL_CALL",
        {"tool_name": "grep", "input": {"pattern": "x", "path": "."}, "output": "a.py:1:x\n"},
        content="a.py:1:x\n",
        tool="grep",
    )
    assert render_text(ok, "Andy") == '🔧 ✅ exit 0 · grep\ninput: {"path": ".", "pattern": "x"}\na.py:1:x'
    bad = _tool(
        "TOOL_CALL",
        {"tool_name": "read_file", "input": {"path": "nope"}, "output": "", "error": "no such file"},
        exit_code=1,
        tool="read_file",
    )
    assert render_text(bad, "Andy") == '🔧 ❌ exit 1 · read_file\ninput: {"path": "nope"}\nerror: no such file'
    structured = _tool("TOOL_CALL", {"tool_name": "calc", "input": {}, "output": {"sum": 3}})
    assert render_text(structured, "Andy").endswith('input: {}\n{"sum": 3}')


def test_envelopes_on_other_types_sit_under_the_speaker() -> None:
    todo = build_structured_envelope("TODO", {"todos": [{"id": "1", "content": "plan", "status": "pending"}]})
    assert render_text(_msg("assistant", "", sender="bot", sender_name="Robo", metadata=todo), "Andy") == "Robo: ○ plan"
    call = build_structured_envelope("TOOL_CALL", {"tool_name": "deploy", "input": {"env": "prod"}})
    assert render_text(_msg("user", "Called deploy", metadata=call), "Andy") == (
        'Alice:\n🔧 deploy\ninput: {"env": "prod"}'
    )


def test_unknown_or_broken_envelopes_fall_back_to_the_text() -> None:
    unknown = {"message_type": "CHART", "version": 1, "payload": {"points": [1, 2]}}
    r = render(_msg("user", "see chart", metadata=unknown), "Andy")
    assert (r.text, r.structured_type) == ("Alice: see chart", "CHART")
    broken = {"message_type": "TODO", "version": 1, "payload": {"todos": "nope"}}
    assert render_text(_msg("user", "old row", metadata=broken), "Andy") == "Alice: old row"


def test_what_channels_display() -> None:
    from datetime import UTC, datetime

    assert displayed(_msg("user", "x")) and displayed(_msg("host", "x", sender="host"))
    assert displayed(_msg("tool_result", "x", sender="command_output"))
    for sender in ("tool_use", "thinking", "result_meta"):
        assert not displayed(_msg("assistant", "x", sender=sender))
    assert not displayed(_msg("user", "x", superseded_at=datetime.now(UTC)))
