"""A replay and its diff, with the real parts: a real worker answers a message with the
offline model in a real agent container; then ``orchestrator runs replay RUN --model
openai:...`` runs that run's recorded input in another real container, through the model
gateway, against the fake Chat Completions server on loopback.

The fake must receive the original run's exact messages; the chat (its messages, cursor
and session) and the group's workspace must be unchanged afterwards (a file the replay
writes is not there); ``runs diff`` must show both runs' outputs side by side.
"""

from __future__ import annotations

import json

import pytest

from agent_runner.protocol import decode_input
from fakes.openai_api import FakeOpenAI, chat, tool_call
from orchestrator.run.assembly import stored_input
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs

from .conftest import Stack

CHAT = "main@local"
SECRET = "sk-test-replay-789"
REPLAY_COMMAND = "echo replayed > replay-file.txt && ls"


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_replay_against_another_model_and_its_diff(stack: Stack) -> None:
    stack.start_worker()
    ensure_main_group(stack.db)
    sent = stack.cli("send", CHAT, "$ echo original > made-by-original.txt && ls", "--wait", "90", "--json")
    assert sent.returncode == 0, sent.stdout + sent.stderr + stack.worker_logs()
    (original,) = list_runs(stack.db, chat_jid=CHAT)
    assert original.state == "succeeded", (original.error, stack.worker_logs())
    group = get_group(stack.db, CHAT)
    workspace = stack.settings.groups_dir / group.folder
    messages_before = get_messages_after(CHAT, 0, db=stack.db)
    files_before = sorted(p.name for p in workspace.iterdir())
    assert "made-by-original.txt" in files_before

    fake = FakeOpenAI(
        chat(None, [tool_call("call_r1", "bash", {"command": REPLAY_COMMAND})], n=1),
        chat("replayed: replay-file.txt written", n=2),
    )
    with fake.serve() as base_url:
        stack.env["ORCHESTRATOR_OPENAI_BASE_URL"] = base_url + "/v1"
        stack.env["ORCHESTRATOR_OPENAI_API_KEY"] = SECRET
        replayed = stack.cli("runs", "replay", original.id[:8], "--model", "openai:gpt-fake", "--json", timeout=240)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    diff = json.loads(replayed.stdout)
    a, b = diff["a"], diff["b"]
    assert diff["same_input_messages"] is True

    # The fake got the original run's exact messages, for the model asked, with the key from the gateway.
    recorded = decode_input(stored_input(stack.db, original.id) or b"")
    assert len(fake.calls) == 2, fake.calls
    first = fake.requests[0]
    assert first["model"] == "gpt-fake"
    assert [m["content"] for m in first["messages"] if m["role"] == "user"] == [
        m.content for m in recorded.messages if m.role == "user"
    ]
    assert recorded.messages[-1].content == "$ echo original > made-by-original.txt && ls"
    assert all(c.headers.get("authorization") == f"Bearer {SECRET}" for c in fake.calls)

    # Both runs side by side.
    assert (a["run_id"], a["model"], a["state"]) == (original.id, "offline", "succeeded")
    assert a["replies"] and a["tool_calls"][0]["exit_code"] == 0
    assert (b["replay_of"], b["model"], b["state"]) == (original.id, "openai:gpt-fake", "succeeded")
    assert b["replies"] == ["replayed: replay-file.txt written"]
    assert [(c["name"], c["input"], c["exit_code"]) for c in b["tool_calls"]] == [("bash", REPLAY_COMMAND, 0)]
    assert (b["input_tokens"], b["output_tokens"]) == fake.usage()
    assert b["num_turns"] == 2 and b["stop_reason"] and b["duration_s"] > 0

    # The chat and the workspace are as they were: the replay's file lives only in its scratch copy.
    assert get_messages_after(CHAT, 0, db=stack.db) == messages_before
    after = get_group(stack.db, CHAT)
    assert (after.cursor_seq, after.pending_seq, after.session_id) == (
        group.cursor_seq,
        group.pending_seq,
        group.session_id,
    )
    assert sorted(p.name for p in workspace.iterdir()) == files_before
    assert not (workspace / "replay-file.txt").exists()
    assert not any(p.name.startswith(b["run_id"]) for p in stack.settings.runs_dir.iterdir())

    # The diff on the command line, as a table.
    shown = stack.cli("runs", "diff", original.id, b["run_id"])
    assert shown.returncode == 0, shown.stderr
    for text in (
        "replayed: replay-file.txt written",
        REPLAY_COMMAND,
        "openai:gpt-fake",
        "offline",
        a["replies"][0].splitlines()[0][:40],
    ):
        assert text in shown.stdout, (text, shown.stdout)
