"""The typed message model end to end: real worker, real container, the CLI.

One conversation produces user, assistant, tool_result (with exit codes),
structured CODE_EDIT / TODO / TOOL_CALL metadata and a host message; the
model's recorded input for the next run holds no host message and exactly
the context blocks the messages asked for; regenerate answers the same input
again and leaves one reply in the display view.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import list_runs

from .conftest import Stack

JID = "main@local"

FIRST = """please keep notes
/write notes.md
hello notes
/end
/todo
[x] write notes
[~] check notes
[ ] ship
/end
$ cat notes.md"""


def _send(stack: Stack, text: str, metadata: dict | None = None) -> list[dict]:
    args = ["send", JID, text, "--wait", "90", "--json"]
    if metadata is not None:
        args += ["--metadata", json.dumps(metadata)]
    res = stack.cli(*args)
    assert res.returncode == 0, res.stderr + stack.worker_logs()
    return [json.loads(line) for line in res.stdout.splitlines() if line.strip()]


def _input_of(stack: Stack, run_id: str) -> dict:
    res = stack.cli("runs", "show", run_id, "--input")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_typed_history_and_what_the_model_saw(stack: Stack) -> None:
    ensure_main_group(stack.db)
    workspace = stack.settings.groups_dir / "main"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "seed.txt").write_text("seed facts\n")
    stack.start_worker()

    replies = _send(
        stack,
        FIRST,
        {
            "context": [
                {"type": "file", "path": "seed.txt"},
                {"type": "selection", "text": "a picked line", "path": "x.py"},
            ]
        },
    )
    results = [r for r in replies if r["message_type"] == "tool_result"]
    kinds = [(r["metadata"]["message_type"], r["metadata"]["exit_code"]) for r in results]
    assert kinds == [("CODE_EDIT", 0), ("TODO", 0), ("TOOL_CALL", 0)]
    edit = results[0]["metadata"]["payload"]["edits"][0]
    assert (edit["file_path"], edit["old_content"], edit["new_content"], edit["language"]) == (
        "notes.md",
        None,
        "hello notes\n",
        "markdown",
    )
    assert [t["status"] for t in results[1]["metadata"]["payload"]["todos"]] == ["completed", "in_progress", "pending"]
    call = results[2]["metadata"]["payload"]
    assert call["tool_name"] == "bash" and call["input"] == {"command": "cat notes.md"}
    assert "hello notes" in call["output"] and call["error"] is None
    assert (workspace / "notes.md").read_text() == "hello notes\n"  # the agent really wrote it

    # An operational message for people, between the runs.
    store_message_direct(
        db=stack.db,
        id="host-1",
        chat_jid=JID,
        sender="host",
        sender_name="host",
        content="⚠️ maintenance at noon",
        timestamp=datetime.now(UTC).isoformat(),
        is_from_me=True,
        message_type="host",
    )
    _send(stack, "what is in the notes?", {"context": [{"type": "file", "path": "notes.md"}]})

    runs = list_runs(stack.db, chat_jid=JID)
    assert [r.state for r in runs] == ["succeeded", "succeeded"]
    second = _input_of(stack, runs[0].id)
    roles = [m["role"] for m in second["messages"]]
    # The first run's three tool calls come back as the model made them, each answered by its id.
    assert roles == ["user", *["assistant"] * 3, *["tool_result"] * 3, "assistant", "user"]
    calls = [m["tool_use"]["id"] for m in second["messages"] if "tool_use" in m]
    assert len(calls) == 3 and calls == [m["tool_use_id"] for m in second["messages"] if m["role"] == "tool_result"]
    text = json.dumps(second)
    assert "maintenance at noon" not in text  # host messages never reach the model
    assert all(m["role"] != "host" for m in second["messages"])
    first_user, last_user = second["messages"][0]["content"], second["messages"][-1]["content"]
    assert first_user.startswith("please keep notes\n")
    assert first_user.count("<file_context>") == 1 and "<path>seed.txt</path>" in first_user
    assert first_user.count("<selected_text>") == 1 and "a picked line" in first_user
    assert last_user.count("<file_context>") == 1 and "hello notes" in last_user  # read fresh, after the agent wrote it
    assert "_error>" not in text
    assert [m["metadata"] for m in second["messages"] if m["role"] == "tool_result"] == [{"exit_code": 0}] * 3
    # What people typed is stored as typed.
    stored = get_messages_after(JID, 0, db=stack.db)
    assert [m.content for m in stored if m.message_type == "user"] == [FIRST, "what is in the notes?"]
    verify = stack.cli("runs", "show", runs[0].id, "--verify")
    assert verify.returncode == 0, verify.stderr

    # Regenerate the last reply: the same input is answered again, once.
    reply = [m for m in stored if m.sender == "bot"][-1]
    regen = stack.cli("regenerate", JID, f"#{reply.seq}")
    assert regen.returncode == 0, regen.stderr
    from tests.conftest import wait_until

    wait_until(
        lambda: (
            len(list_runs(stack.db, chat_jid=JID)) == 3 and list_runs(stack.db, chat_jid=JID)[0].state == "succeeded"
        ),
        90,
        "the regenerated run",
        stack.worker_logs,
    )
    third = _input_of(stack, list_runs(stack.db, chat_jid=JID)[0].id)
    assert third["messages"] == second["messages"]
    shown = get_messages_after(JID, 0, db=stack.db)
    assert [m.sender for m in shown if m.sender == "bot"] == ["bot", "bot"]  # one reply per question
    assert reply.seq not in [m.seq for m in shown]
