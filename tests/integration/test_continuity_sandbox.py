"""Continuity end to end: a second run sees the first run's tool calls as tool blocks.

CLI -> celery worker -> pipeline -> gateway -> the agent container (real SDK)
-> the fake Messages API, twice in one chat.  The first run calls bash; the
second run's recorded input (``runs.input_json``) must carry that call and its
result with matching ids, the fake must receive them as real tool_use and
tool_result content blocks (not text), the repeated prefix must be read from
the prompt cache, and ``runs show --verify`` must rebuild the input byte for byte.
"""

from __future__ import annotations

import json
from typing import Any

from agent_runner.protocol import decode_input
from fakes.anthropic_api import FakeAnthropic, PromptCache, message
from orchestrator.run.assembly import stored_input
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.runs import list_runs

from .conftest import Stack

SECRET = "sk-test-secret-123"
CHAT = "main@local"
COMMAND = "echo remembered > note.txt && cat note.txt"


def test_the_second_runs_input_carries_the_first_runs_tool_blocks(stack: Stack) -> None:
    fake = FakeAnthropic(
        message(
            [
                {"type": "text", "text": "Writing it down."},
                {"type": "tool_use", "id": "toolu_cont_1", "name": "bash", "input": {"command": COMMAND}},
            ],
            "tool_use",
            n=1,
        ),
        message([{"type": "text", "text": "Noted."}], "end_turn", n=2),
        message([{"type": "text", "text": "You asked me to note something."}], "end_turn", n=3),
        prompt_cache=PromptCache(min_tokens=1),
    )
    with fake.serve() as base_url:
        stack.env["ORCHESTRATOR_MODEL"] = "anthropic:claude-fake-1"
        stack.env["ORCHESTRATOR_ANTHROPIC_BASE_URL"] = base_url
        stack.env["ORCHESTRATOR_ANTHROPIC_API_KEY"] = SECRET
        stack.start_worker()
        ensure_main_group(stack.db)
        first = stack.cli("send", CHAT, "note: remembered", "--wait", "90", "--json")
        assert first.returncode == 0, first.stdout + first.stderr + stack.worker_logs()
        second = stack.cli("send", CHAT, "what did I ask?", "--wait", "90", "--json")
        assert second.returncode == 0, second.stdout + second.stderr + stack.worker_logs()
    assert len(fake.requests) == 3, fake.requests

    runs = sorted(list_runs(stack.db, chat_jid=CHAT), key=lambda r: r.created_at)
    assert [r.state for r in runs] == ["succeeded", "succeeded"]
    recorded = stored_input(stack.db, runs[1].id)
    assert recorded is not None
    messages = decode_input(recorded).messages
    calls = [m for m in messages if m.tool_use]
    results = [m for m in messages if isinstance(m.tool_use_id, str)]
    assert [(c.role, c.tool_use.id, c.tool_use.name, c.tool_use.input) for c in calls] == [  # type: ignore[union-attr]
        ("assistant", "toolu_cont_1", "bash", {"command": COMMAND})
    ]
    assert [(r.role, r.tool_use_id) for r in results] == [("tool_result", "toolu_cont_1")]
    assert "remembered" in results[0].content
    doc = json.loads(recorded)
    assert [m.get("tool_use", {}).get("id") for m in doc["messages"] if "tool_use" in m] == ["toolu_cont_1"]

    # What the model API received in the second run: real blocks, the call answered right after it.
    sent: list[dict[str, Any]] = fake.requests[2]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user", "assistant", "user"]
    assert sent[1]["content"][0] == {"type": "text", "text": "Writing it down."}
    assert sent[1]["content"][1] == {
        "type": "tool_use",
        "id": "toolu_cont_1",
        "name": "bash",
        "input": {"command": COMMAND},
    }
    (result,) = sent[2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_cont_1"
    assert "remembered" in result["content"]
    assert sent[3]["content"] == [{"type": "text", "text": "Noted."}]
    assert sent[4]["content"][-1]["text"] == "what did I ask?"

    # The prefix the first run sent is read back from the cache in the second.
    usage = [reply[1]["usage"] for reply in fake.sent]
    assert usage[2]["cache_read_input_tokens"] >= usage[1]["cache_creation_input_tokens"] > 0

    verified = stack.cli("runs", "show", runs[1].id, "--verify")
    assert verified.returncode == 0 and "verified" in verified.stderr, verified.stdout + verified.stderr
