"""A real agent container asks the gateway for another model, and is refused.

CLI -> celery worker (SQLite + filesystem broker) -> pipeline -> model gateway
on a unix socket -> the agent container (no network) -> the real SDK -> fake
Messages API on loopback.  The fake model has the agent run a command that
posts its own request for a dearer model on the gateway's socket from inside
the container: the gateway answers 403 and nothing reaches the upstream.
The same run has thinking on (ORCHESTRATOR_THINKING_BUDGET): the requests
ask for it, the thinking is stored but never delivered, and the run ends
with its result_meta record, whose usage is the gateway's count.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_runner.protocol import SdkToolUse
from fakes.anthropic_api import FakeAnthropic, Recorded, message
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs

from .conftest import Stack

CHAT = "main@local"
MODEL = "claude-fake-1"
DEAR = "claude-opus-4-1"
# Run inside the container: the agent's own request, on the socket its runner uses.
ASK_FOR_ANOTHER_MODEL = (
    'python3 -c "import http.client,json,socket\n'
    "class C(http.client.HTTPConnection):\n"
    "    def connect(self):\n"
    "        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect('/run/gateway/model.sock')\n"
    "c = C('gateway')\n"
    f"body = json.dumps({{'model': '{DEAR}', 'max_tokens': 16, 'messages': [{{'role': 'user', 'content': 'hi'}}]}})\n"
    "c.request('POST', '/v1/messages', body, {'content-type': 'application/json'})\n"
    "r = c.getresponse(); e = json.loads(r.read())['error']\n"
    "print('gateway said', r.status, e['type'])\n"
    "print(e['message'])\""
)


def _final(rec: Recorded) -> tuple[int, dict[str, Any], dict[str, str]]:
    printed = next(b["content"] for b in rec.body["messages"][-1]["content"] if b["type"] == "tool_result")
    said = next(line for line in printed.splitlines() if line.startswith("gateway said"))
    return message(
        [
            {"type": "thinking", "thinking": "Refused, as it should be.", "signature": "s2"},
            {"type": "text", "text": f"done: {said}"},
        ],
        "end_turn",
        n=2,
    )


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_containers_request_for_another_model_is_refused(stack: Stack) -> None:
    fake = FakeAnthropic(
        message(
            [
                {"type": "thinking", "thinking": "Let me try the dearer model.", "signature": "s1"},
                {"type": "tool_use", "id": "toolu_p1", "name": "bash", "input": {"command": ASK_FOR_ANOTHER_MODEL}},
            ],
            "tool_use",
            n=1,
        ),
        _final,
    )
    with fake.serve() as base_url:
        stack.env.update(
            {
                "ORCHESTRATOR_MODEL": f"anthropic:{MODEL}",
                "ORCHESTRATOR_ANTHROPIC_BASE_URL": base_url,
                "ORCHESTRATOR_ANTHROPIC_API_KEY": "sk-policy-secret",
                "ORCHESTRATOR_MAX_TOKENS": "2048",
                "ORCHESTRATOR_THINKING_BUDGET": "1024",
            }
        )
        stack.start_worker()
        ensure_main_group(stack.db)
        res = stack.cli("send", CHAT, "try another model", "--wait", "120", "--json")
    logs = stack.worker_logs()
    assert res.returncode == 0, res.stdout + res.stderr + logs

    history = get_messages_after(CHAT, 0, db=stack.db)
    [tool] = [m for m in history if m.message_type == "tool_result"]
    assert tool.sender == "tool_result" and (tool.metadata or {}).get("exit_code") == 0
    assert "gateway said 403 model_not_allowed" in tool.content, tool.content
    assert f"this run may use the model '{MODEL}' only, not '{DEAR}'" in tool.content
    [reply] = [m for m in history if m.sender == "bot"]
    assert reply.content == "done: gateway said 403 model_not_allowed"

    # Only the runner's two requests reached the upstream, each for the run's model, with thinking.
    assert [c.body["model"] for c in fake.calls] == [MODEL, MODEL]
    assert all(c.body["thinking"] == {"type": "enabled", "budget_tokens": 1024} for c in fake.calls)
    assert all(c.body["max_tokens"] == 2048 for c in fake.calls)

    # Thinking stored, never delivered and never in the model's view; the run's record last.
    assert [m.content for m in history if m.sender == "thinking"] == [
        "Let me try the dearer model.",
        "Refused, as it should be.",
    ]
    assert history[-1].sender == "result_meta"
    meta = history[-1].metadata or {}
    (run,) = list_runs(stack.db, chat_jid=CHAT)
    assert run.state == "succeeded", (run.error, logs)
    assert (meta["model"], meta["state"], meta["stop_reason"], meta["num_turns"]) == (MODEL, "succeeded", "end_turn", 2)
    assert (
        (meta["usage"]["input_tokens"], meta["usage"]["output_tokens"])
        == fake.usage()
        == (run.input_tokens, run.output_tokens)
    )
    assert meta["cost_usd"] is None  # no price for a fake model: no guess
    view = format_messages_for_sdk(history)
    # The tool call comes back as the model made it (continuity); no thinking, no record.
    [call] = [m for m in history if m.sender == "tool_use"]
    assert [m.content for m in view] == ["try another model", call.content, tool.content, reply.content]
    assert isinstance(view[1].tool_use, SdkToolUse) and view[2].tool_use_id == view[1].tool_use.id
    replies = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert "sk-policy-secret" not in res.stdout + tool.content
    assert {r["sender"] for r in replies} >= {"tool_result", "bot"}
