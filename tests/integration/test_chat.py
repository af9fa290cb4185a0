"""`orchestrator chat`: a terminal chat over the real stack (worker, container),
driven through piped stdin like a script would."""

from __future__ import annotations

import subprocess

from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import store_message_direct

from .conftest import BIN, Stack


def test_terminal_chat_sends_and_shows_replies_by_type(stack: Stack) -> None:
    ensure_main_group(stack.db)
    store_message_direct(
        db=stack.db,
        id="old-1",
        chat_jid="main@local",
        sender="bob",
        sender_name="Bob",
        content="earlier message",
        timestamp="2026-11-26T09:00:00+00:00",
    )
    stack.start_worker()
    script = "$ echo from-terminal\n/regenerate #999\n/frobnicate\n"
    done = subprocess.run(
        [str(BIN / "orchestrator"), "chat", "main@local", "--sender", "tess", "--linger", "90"],
        input=script,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr + stack.worker_logs()
    lines = done.stdout.splitlines()
    assert lines[0].endswith("Bob: earlier message")  # the backlog first
    assert any(line.endswith("tess: $ echo from-terminal") for line in lines)
    tool = next(i for i, line in enumerate(lines) if "🔧" in line and "✅" in line and "exit 0" in line)
    assert "from-terminal" in lines[tool + 1 : tool + 8]  # the command's output, on its own line
    assert any("Andy: Ran `echo from-terminal` (exit 0)" in line for line in lines)
    assert any("✔ done" in line for line in lines)
    assert any("[error: no message '#999'" in line for line in lines)
    assert any("unknown command /frobnicate" in line for line in lines)
    assert not any("tool_use" in line or "bash: echo" in line for line in lines)  # stored-only records hidden
