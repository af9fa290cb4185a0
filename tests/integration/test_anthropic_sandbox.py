"""The Anthropic provider end to end, with the real parts and a fake upstream.

CLI -> celery worker (embedded backend: SQLite + filesystem broker) -> pipeline -> model gateway on a
unix socket -> the agent container (no network) -> real SDK through the
socket -> gateway adds the key -> fake Messages API on loopback in this
process.  The key must reach the fake and never the container.
"""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import docker
import pytest

from fakes.anthropic_api import FakeAnthropic, Recorded, api_error, message
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs

from .conftest import Stack

SECRET = "sk-test-secret-123"
CHAT = "main@local"
COMMAND = "echo from-fake-model && id -u"


def _replies(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _configure(stack: Stack, base_url: str) -> None:
    stack.env["ORCHESTRATOR_MODEL"] = "anthropic:claude-fake-1"
    stack.env["ORCHESTRATOR_ANTHROPIC_BASE_URL"] = base_url
    stack.env["ORCHESTRATOR_ANTHROPIC_API_KEY"] = SECRET


class ContainerProbe:
    """Called while the fake serves its first request: look inside the run container."""

    def __init__(self, install_id: str) -> None:
        self.install_id = install_id  # this test's containers only: another test process may have its own
        self.seen: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def __call__(self, rec: Recorded) -> None:
        if self._done.is_set():
            return
        self._done.set()
        try:
            client = docker.from_env()
            labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.install_id}"]
            for container in client.containers.list(filters={"label": labels}):
                config = container.attrs["Config"]
                code, output = container.exec_run(["sh", "-c", "env"])
                # The runner's own environment, read from the host: nothing in the container may
                # (the runner is undumpable: container/agent_runner/undumpable.py).
                runner_env = Path(f"/proc/{container.attrs['State']['Pid']}/environ").read_bytes()
                output += runner_env.replace(b"\0", b"\n")
                self.seen.append(
                    {
                        "name": container.name,
                        "env": config.get("Env") or [],
                        "cmd": config.get("Cmd") or [],
                        "entrypoint": config.get("Entrypoint") or [],
                        "args": container.attrs.get("Args") or [],
                        "exec_code": code,
                        "exec_output": output.decode("utf-8", "replace"),
                    }
                )
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def _final_answer(rec: Recorded) -> tuple[int, dict[str, Any], dict[str, str]]:
    # The second reply quotes what the tool printed, as a real model would.
    last = rec.body["messages"][-1]["content"]
    printed = next(b["content"] for b in last if b["type"] == "tool_result")
    first_line = next(line for line in printed.splitlines() if "from-fake-model" in line)
    return message([{"type": "text", "text": f"done: {first_line.strip()}"}], "end_turn", n=2)


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_anthropic_tool_conversation_through_the_gateway(stack: Stack) -> None:
    probe = ContainerProbe(stack.settings.install_id)
    fake = FakeAnthropic(
        message(
            [{"type": "tool_use", "id": "toolu_fake_1", "name": "bash", "input": {"command": COMMAND}}],
            "tool_use",
            n=1,
        ),
        _final_answer,
        on_request=probe,
    )
    res, logs = _ask_through(fake, stack)
    assert res.returncode == 0, res.stdout + res.stderr + logs
    replies = _replies(res.stdout)

    tool_results = [r for r in replies if r["message_type"] == "tool_result"]
    assert len(tool_results) == 1, replies
    assert tool_results[0]["metadata"]["exit_code"] == 0
    out_lines = tool_results[0]["content"].splitlines()
    assert "from-fake-model" in out_lines
    uid = out_lines[out_lines.index("from-fake-model") + 1].strip()
    assert uid.isdigit() and uid != "0", tool_results[0]["content"]

    answers = [r for r in replies if r["message_type"] == "assistant" and r["sender"] == "bot"]
    assert [a["content"] for a in answers] == ["done: from-fake-model"], replies

    # What the fake upstream received.
    assert len(fake.calls) == 2, fake.calls
    assert all(c.path == "/v1/messages" and c.headers.get("x-api-key") == SECRET for c in fake.calls)
    assert all(c.body["model"] == "claude-fake-1" for c in fake.calls)
    blocks = [b for m in fake.requests[1]["messages"] for b in m["content"] if isinstance(m["content"], list)]
    results = [b for b in blocks if b["type"] == "tool_result"]
    assert len(results) == 1 and results[0]["tool_use_id"] == "toolu_fake_1"
    assert "from-fake-model" in results[0]["content"]

    # The gateway's count, not the sandbox's claim, is the run's usage.
    (run,) = list_runs(stack.db, chat_jid=CHAT)
    assert run.state == "succeeded", (run.error, logs)
    assert (run.input_tokens, run.output_tokens) == fake.usage() == (30, 3)

    # The secret never entered the container.
    assert probe.error is None, repr(probe.error)
    assert len(probe.seen) == 1, probe.seen
    (seen,) = probe.seen
    assert seen["exec_code"] == 0 and "HOME=/tmp" in seen["exec_output"], seen
    for field in ("env", "cmd", "entrypoint", "args"):
        assert "sk-test-secret" not in json.dumps(seen[field]), (field, seen[field])
    assert "sk-test-secret" not in seen["exec_output"]
    assert SECRET not in res.stdout + res.stderr


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def _ask_through(fake: FakeAnthropic, stack: Stack) -> tuple[subprocess.CompletedProcess[str], str]:
    """Send one message with the worker's model pointed at ``fake``; returns the CLI result and worker logs."""
    with fake.serve() as base_url:
        _configure(stack, base_url)
        stack.start_worker()
        ensure_main_group(stack.db)
        res = stack.cli("send", CHAT, "please list files", "--wait", "90", "--json")
    return res, stack.worker_logs()


def test_upstream_bad_request_fails_the_run_with_a_host_message(stack: Stack) -> None:
    fake = FakeAnthropic(api_error(400, "invalid_request_error", "model: claude-fake-1 is not allowed"))
    res, logs = _ask_through(fake, stack)
    assert res.returncode == 3, res.stdout + res.stderr + logs
    assert len(fake.calls) == 1  # a 400 is not retried
    assert fake.calls[0].headers.get("x-api-key") == SECRET
    (run,) = list_runs(stack.db, chat_jid=CHAT)
    assert run.state == "failed", logs
    assert "is not allowed" in (run.error or "")

    hist = stack.cli("history", CHAT, "--json")
    assert hist.returncode == 0, hist.stderr
    history = json.loads(hist.stdout)
    host = [m for m in history if m["message_type"] == "host"]
    assert len(host) == 1 and host[0]["content"].startswith("⚠️ Agent error"), history
    assert SECRET not in hist.stdout

    view = format_messages_for_sdk(get_messages_after(CHAT, 0, db=stack.db))
    assert view and all(m.role != "host" for m in view)
    assert not any("Agent error" in m.content for m in view)
