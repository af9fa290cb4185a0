"""The claude-code provider end to end: Claude Code in the sandbox, through the gateway.

CLI -> celery worker -> pipeline -> model gateway on a unix socket -> the
claude-code image variant (no network, non-root, read-only root) -> the
runner's loopback relay -> Claude Code's streaming Messages API requests ->
gateway adds the key -> the fake Messages API in this process, which plays
the model: a to-do list, a file write, a shell command and our send_message
tool in the first run; an edit of that file in a second, resumed run.  The key
never enters the container; the session's transcript stays in the group's
session folder, and `groups reset` forgets it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import docker
import pytest

from fakes.anthropic_api import FakeAnthropic, Recorded, Reply, message
from orchestrator.model.messages import SENDER_TOOL_RESULT
from orchestrator.sandbox import quota
from orchestrator.sandbox.containers import LABEL_INSTALL
from orchestrator.sandbox.sessions import session_dir, session_volume
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from tests.quota_support import mounts_under, release_everything, require_volumes

from .conftest import Stack

SECRET = "sk-claude-code-secret-42"
CHAT = "main@local"
MODEL = "claude-sonnet-4-5"  # a name the CLI knows: its tool set depends on it
FIRST, SECOND, THIRD = "please write the notes", "now fix the notes", "are you still there"
NOTES = "/workspace/notes.md"

# The agent tries to read each of its ancestors' environment, up to the runner (PID 1): the
# Claude Code CLI that started it and the runner, both of its uid, are undumpable
# (agent_runner/undumpable.py), so refused; the shells between, the agent's own, are not.
REACH = (
    "p=$$; while [ $p -gt 1 ]; do p=$(cut -d' ' -f4 /proc/$p/stat); "
    "if cat /proc/$p/environ > /dev/null 2>&1; then r=reached; else r=refused; fi; "
    "echo \"$r $p $(tr '\\0' ' ' < /proc/$p/cmdline | cut -c1-60)\"; done;"
)

# A process the first run leaves behind (out of its session, its parent gone: the runner's
# child now), and the second run's count of it: the clean-up between runs kills it, while
# the CLI, kept with the session open, lives on.
LINGER = "(setsid sleep 1007 >/dev/null 2>&1 </dev/null &);"
LINGERING = (
    "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
    " | grep -c '^sleep 1007' | sed 's/^/lingering: /'"
)

# The model's moves, by the request's last message: a tool call answers the
# result of the one before it; a fresh prompt starts its run's list.
FIRST_RUN: list[tuple[str, str, dict[str, Any]]] = [
    (
        "toolu_cc_todo",
        "TodoWrite",
        {
            "todos": [
                {"content": "write the notes", "status": "in_progress", "activeForm": "Writing the notes"},
                {"content": "check them", "status": "pending", "activeForm": "Checking them"},
            ]
        },
    ),
    ("toolu_cc_write", "Write", {"file_path": NOTES, "content": "# Notes\nfirst draft\n"}),
    (
        "toolu_cc_bash",
        "Bash",
        {"command": f"{LINGER} cat notes.md && {REACH} id -u", "description": "Show the notes"},
    ),
    ("toolu_cc_send", "mcp__chat__send_message", {"text": "progress: the notes are written"}),
]
SECOND_RUN: list[tuple[str, str, dict[str, Any]]] = [
    ("toolu_cc_edit", "Edit", {"file_path": NOTES, "old_string": "first draft", "new_string": "final text"}),
    ("toolu_cc_look", "Bash", {"command": f"{REACH} {LINGERING}", "description": "Look around"}),
]


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


class Model:
    """Plays the model for every request Claude Code makes, whatever their number."""

    def __init__(self) -> None:
        self.n = 0
        self.lock = threading.Lock()

    def __call__(self, rec: Recorded) -> Reply:
        with self.lock:
            self.n += 1
            n = self.n
        last = rec.body["messages"][-1]
        answered = [b["tool_use_id"] for b in _blocks(last) if b.get("type") == "tool_result"]
        for moves, final in ((FIRST_RUN, "done: the notes are written"), (SECOND_RUN, "edited: final text")):
            ids = [m[0] for m in moves]
            if answered and answered[-1] in ids:
                i = ids.index(answered[-1]) + 1
                if i < len(moves):
                    return self._call(moves[i], n)
                return message([{"type": "text", "text": final}], "end_turn", n)
        text = json.dumps(last)
        if SECOND in text:
            return self._call(SECOND_RUN[0], n)
        if FIRST in text:
            return self._call(FIRST_RUN[0], n)
        return message([{"type": "text", "text": "(not scripted)"}], "end_turn", n)

    @staticmethod
    def _call(move: tuple[str, str, dict[str, Any]], n: int) -> Reply:
        tool_id, name, tool_input = move
        return message(
            [
                {"type": "text", "text": f"calling {name}"},
                {"type": "tool_use", "id": tool_id, "name": name, "input": tool_input},
            ],
            "tool_use",
            n,
        )


class KeyProbe:
    """On every request: does any process of the run's container see the key?"""

    def __init__(self, install_id: str) -> None:
        self.install_id = install_id
        self.looked = 0
        self.leaks: list[str] = []
        self.errors: list[BaseException] = []

    def __call__(self, rec: Recorded) -> None:
        try:
            for container in docker.from_env().containers.list(filters={"label": f"{LABEL_INSTALL}={self.install_id}"}):
                code, out = container.exec_run(["sh", "-c", "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'"])
                # The runner and the CLI are undumpable: nothing in the container reads their
                # environment, so every process's is read from the host too.
                top = container.top()
                column = top["Titles"].index("PID")
                for row in top["Processes"]:
                    with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # gone since
                        out += Path(f"/proc/{row[column]}/environ").read_bytes()
                self.looked += 1
                text = out.decode("utf-8", "replace")
                if SECRET in text or SECRET in json.dumps(container.attrs["Config"]):
                    self.leaks.append(container.name)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)


def _send(stack: Stack, text: str) -> subprocess.CompletedProcess[str]:
    return stack.cli("send", CHAT, text, "--wait", "180", "--json", timeout=240)


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_claude_code_edits_files_keeps_a_todo_list_and_resumes_its_session(
    stack: Stack, claude_code_image: str
) -> None:
    model = Model()
    probe = KeyProbe(stack.settings.install_id)
    fake = FakeAnthropic(*([model] * 30), on_request=probe)
    with fake.serve() as base_url:
        stack.env.update(
            {
                "ORCHESTRATOR_MODEL": f"claude-code:{MODEL}",
                "ORCHESTRATOR_ANTHROPIC_BASE_URL": base_url,
                "ORCHESTRATOR_ANTHROPIC_API_KEY": SECRET,
                "ORCHESTRATOR_MAX_TOKENS": "4096",
                # Each run's turns (5, then 3) within it, both runs' not: a CLI kept between
                # runs counts each run's turns afresh.
                "ORCHESTRATOR_MAX_TURNS": "6",
                "ORCHESTRATOR_CONTAINER_MEMORY": "1g",
                # Warm: the CLI is kept between the runs of a warm container (the tests' own
                # default is cold, where every run has a container and a CLI of its own).
                "ORCHESTRATOR_WARM_IDLE_S": "300",
            }
        )
        stack.start_worker()
        ensure_main_group(stack.db)
        first = _send(stack, FIRST)
        logs = stack.worker_logs()
        assert first.returncode == 0, first.stdout + first.stderr + logs
        session_id = get_group(stack.db, CHAT).session_id
        calls_first = len(fake.calls)
        second = _send(stack, SECOND)
        logs = stack.worker_logs()
        assert second.returncode == 0, second.stdout + second.stderr + logs
        # The kept CLI killed between runs (as the agent could, or gVisor's clean-up does): the
        # next run sees it gone and starts a new one that resumes the session from disk.
        [warm] = docker.from_env().containers.list(filters={"label": f"{LABEL_INSTALL}={stack.settings.install_id}"})
        stored = get_messages_after(CHAT, 0, db=stack.db)
        look = next(m.content for m in stored if m.message_type == "tool_result" and "lingering:" in m.content)
        kept_pid = next(line.split()[1] for line in look.splitlines() if "_bundled/claude" in line)
        assert warm.exec_run(["sh", "-c", f"kill -9 {kept_pid}"]).exit_code == 0
        calls_second = len(fake.calls)
        third = _send(stack, THIRD)
        assert third.returncode == 0, third.stdout + third.stderr + stack.worker_logs()
        assert "restarting Claude Code: the CLI is gone" in warm.logs(stderr=True, stdout=False).decode()
        resumed_again = json.dumps(fake.calls[calls_second].body["messages"])
        assert "toolu_cc_look" in resumed_again and THIRD in resumed_again

    runs = sorted(list_runs(stack.db, chat_jid=CHAT), key=lambda r: r.created_at)
    assert [r.state for r in runs] == ["succeeded"] * 3, [(r.state, r.error) for r in runs]
    stored = get_messages_after(CHAT, 0, db=stack.db)
    folder = get_group(stack.db, CHAT).folder

    # Every request went through the gateway with the key, for the run's model only.
    assert fake.calls and all(c.headers.get("x-api-key") == SECRET for c in fake.calls)
    assert {c.body["model"] for c in fake.calls} == {MODEL}
    assert all(c.body.get("stream") is True for c in fake.calls)
    assert all(c.body["max_tokens"] <= 4096 for c in fake.calls)
    tools = {t["name"] for t in fake.calls[0].body["tools"]}
    assert {"Bash", "Write", "Edit", "TodoWrite", "mcp__chat__send_message", "mcp__chat__send_file"} <= tools, tools
    assert not tools & {"WebFetch", "WebSearch", "CronCreate"}, tools

    # The first run's tool results, stored with their envelopes.
    results = {
        m.metadata["tool_use_id"]: m
        for m in stored
        if m.message_type == "tool_result" and m.metadata and "tool_use_id" in m.metadata
    }
    assert all(m.sender == SENDER_TOOL_RESULT for m in results.values())
    todo = results["toolu_cc_todo"].metadata
    assert todo["message_type"] == "TODO", todo
    assert [(t["content"], t["status"]) for t in todo["payload"]["todos"]] == [
        ("write the notes", "in_progress"),
        ("check them", "pending"),
    ]
    write = results["toolu_cc_write"].metadata
    assert write["message_type"] == "CODE_EDIT", write
    (edit,) = write["payload"]["edits"]
    assert (edit["file_path"], edit["old_content"], edit["new_content"]) == ("notes.md", None, "# Notes\nfirst draft\n")
    bash = results["toolu_cc_bash"]
    assert bash.metadata["message_type"] == "TOOL_CALL" and bash.metadata["exit_code"] == 0
    lines = bash.content.splitlines()
    assert "first draft" in lines, bash.content
    assert lines[-1].strip().isdigit() and lines[-1].strip() != "0", bash.content  # not root
    ancestors = [line.split(maxsplit=2) for line in lines if line.startswith(("reached ", "refused "))]
    assert ancestors[-1][:2] == ["refused", "1"], bash.content  # the runner
    cli = [a for a in ancestors if "_bundled/claude" in a[-1]]
    assert cli and all(a[0] == "refused" for a in cli), bash.content
    # The second run went on in the same CLI (the session kept open in the warm container),
    # and what the first left running was killed between the runs all the same.
    look = results["toolu_cc_look"].content
    again = [line.split(maxsplit=2) for line in look.splitlines() if line.startswith(("reached ", "refused "))]
    assert [a[1] for a in again if "_bundled/claude" in a[-1]] == [a[1] for a in cli], (bash.content, look)
    assert "lingering: 0" in look, look
    sent = [m for m in stored if m.content == "progress: the notes are written" and m.message_type == "assistant"]
    assert len(sent) == 1, [(m.sender, m.content) for m in stored]
    answers = [m.content for m in stored if m.message_type == "assistant" and m.sender == "bot"]
    assert "done: the notes are written" in answers and "edited: final text" in answers, answers

    # The second run resumed the first's session: its first request carries the
    # first run's own tool calls and results as blocks, and only the new prompt after them.
    assert session_id and get_group(stack.db, CHAT).session_id == session_id
    resumed = fake.calls[calls_first].body["messages"]
    used = {b["id"] for m in resumed for b in _blocks(m) if b.get("type") == "tool_use"}
    assert {"toolu_cc_todo", "toolu_cc_write", "toolu_cc_bash", "toolu_cc_send"} <= used, used
    assert FIRST not in json.dumps(resumed[-1]) and SECOND in json.dumps(resumed[-1])
    change = results["toolu_cc_edit"].metadata
    assert change["message_type"] == "CODE_EDIT", change
    (edit,) = change["payload"]["edits"]
    assert (edit["old_content"], edit["new_content"]) == ("# Notes\nfirst draft\n", "# Notes\nfinal text\n")
    assert (stack.settings.groups_dir / folder / "notes.md").read_text() == "# Notes\nfinal text\n"

    # The key never entered the container, and never reached the chat.
    assert probe.looked and not probe.errors and not probe.leaks, (probe.looked, probe.errors, probe.leaks)
    assert not any(SECRET in m.content for m in stored)

    # The transcript is in the group's session folder; a reset forgets both.
    sessions = session_dir(stack.settings, folder)
    assert list(sessions.rglob(f"{session_id}.jsonl")), list(sessions.rglob("*"))[:20]
    reset = stack.cli("groups", "reset", CHAT)
    assert reset.returncode == 0, reset.stderr
    assert get_group(stack.db, CHAT).session_id is None
    assert not sessions.exists()


FILL = (
    "dd if=/dev/zero of=/session/fill bs=1M count=64 2>&1 | grep -o 'No space left on device' | head -1; "
    "rm -f /session/fill; df -k /session | tail -1"
)


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_full_session_folder_is_enospc_inside_the_sandbox_not_a_full_host_disk(
    stack: Stack, claude_code_image: str
) -> None:
    """The session folder sits on the data dir's filesystem, beside the database and the
    broker: an agent that writes 64 MiB there meets its 16 MiB quota, not the host's disk."""
    require_volumes()

    def model(rec: Recorded) -> Reply:
        answered = [b for b in _blocks(rec.body["messages"][-1]) if b.get("type") == "tool_result"]
        if answered:
            return message([{"type": "text", "text": "filled"}], "end_turn", 2)
        return message(
            [
                {
                    "type": "tool_use",
                    "id": "toolu_fill",
                    "name": "Bash",
                    "input": {"command": FILL, "description": "Fill the session folder"},
                }
            ],
            "tool_use",
            1,
        )

    fake = FakeAnthropic(*([model] * 10))
    try:
        with fake.serve() as base_url:
            stack.env.update(
                {
                    "ORCHESTRATOR_MODEL": f"claude-code:{MODEL}",
                    "ORCHESTRATOR_ANTHROPIC_BASE_URL": base_url,
                    "ORCHESTRATOR_ANTHROPIC_API_KEY": SECRET,
                    "ORCHESTRATOR_CONTAINER_MEMORY": "1g",
                    "ORCHESTRATOR_SESSION_QUOTA": "16m",
                }
            )
            stack.start_worker()
            ensure_main_group(stack.db)
            sent = _send(stack, "fill the session folder")
            assert sent.returncode == 0, sent.stdout + sent.stderr + stack.worker_logs()
        folder = get_group(stack.db, CHAT).folder
        (result,) = [
            m
            for m in get_messages_after(CHAT, 0, db=stack.db)
            if m.message_type == "tool_result" and (m.metadata or {}).get("tool_use_id") == "toolu_fill"
        ]
        assert "No space left on device" in result.content, result.content
        total_kib = int(result.content.strip().splitlines()[-1].split()[1])
        assert total_kib <= 16 * 1024, result.content  # /session is the 16 MiB volume, not the host's disk
        assert session_volume(stack.settings, folder).mounted() == "ours"
        reset = stack.cli("groups", "reset", CHAT)
        assert reset.returncode == 0, reset.stderr
        assert not session_volume(stack.settings, folder).image.exists()
        assert not mounts_under(stack.settings.data_dir)
    finally:
        quota.unmount_all(stack.settings)
        release_everything(stack.settings.data_dir)
