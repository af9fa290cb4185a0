"""The OpenAI-compatible provider end to end, with the real parts and a fake upstream.

CLI -> celery worker (embedded backend) -> pipeline -> model gateway on a
unix socket -> the agent container (no network) -> OpenAICompatProvider
through the socket -> gateway adds ``Authorization: Bearer`` -> fake Chat
Completions server on loopback in this process.  The key must reach the
fake and never the container.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import docker
import pytest

from fakes.openai_api import FakeOpenAI, Recorded, api_error, chat, tool_call
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.runs import list_runs

from .conftest import Stack

SECRET = "sk-test-openai-secret-456"
CHAT = "main@local"
COMMAND = "echo from-fake-model && id -u"


class ContainerProbe:
    """Called while the fake serves its first request: look inside this install's run container."""

    def __init__(self, install_id: str) -> None:
        self.install_id = install_id
        self.seen: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self._done = threading.Event()

    def __call__(self, rec: Recorded) -> None:
        if self._done.is_set():
            return
        self._done.set()
        try:
            labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={self.install_id}"]
            for container in docker.from_env().containers.list(filters={"label": labels}):
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


def _replies(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _final_answer(rec: Recorded) -> tuple[int, Any, dict[str, str]]:
    # The second reply quotes what the tool printed, as a real model would.
    tool_msg = rec.body["messages"][-1]
    assert tool_msg["role"] == "tool", rec.body
    first_line = next(line for line in tool_msg["content"].splitlines() if "from-fake-model" in line)
    return chat(f"done: {first_line.strip()}", n=2)


def _ask_through(fake: FakeOpenAI, stack: Stack) -> tuple[Any, str]:
    with fake.serve() as base_url:
        stack.env["ORCHESTRATOR_MODEL"] = "openai:llama-fake:8b"
        stack.env["ORCHESTRATOR_OPENAI_BASE_URL"] = base_url + "/v1"
        stack.env["ORCHESTRATOR_OPENAI_API_KEY"] = SECRET
        stack.start_worker()
        ensure_main_group(stack.db)
        res = stack.cli("send", CHAT, "please list files", "--wait", "90", "--json")
    return res, stack.worker_logs()


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_openai_tool_conversation_through_the_gateway(stack: Stack) -> None:
    probe = ContainerProbe(stack.settings.install_id)
    fake = FakeOpenAI(
        # A 503 first: the runner retries inside the container, the run is not retried.
        api_error(503, "loading model", "server_error", {"retry-after": "0"}),
        chat(None, [tool_call("call_fake_1", "bash", {"command": COMMAND})], n=1),
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
    uid = out_lines[out_lines.index("from-fake-model") + 1].strip()
    assert uid.isdigit() and uid != "0", tool_results[0]["content"]
    answers = [r for r in replies if r["message_type"] == "assistant" and r["sender"] == "bot"]
    assert [a["content"] for a in answers] == ["done: from-fake-model"], replies

    # What the fake upstream received: the key from the gateway, the tool result by id.
    assert len(fake.calls) == 3, fake.calls
    assert all(c.path == "/v1/chat/completions" for c in fake.calls)
    assert all(c.headers.get("authorization") == f"Bearer {SECRET}" for c in fake.calls)
    assert all(c.body["model"] == "llama-fake:8b" for c in fake.calls)
    tool_msgs = [m for m in fake.requests[2]["messages"] if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and tool_msgs[0]["tool_call_id"] == "call_fake_1"
    assert "from-fake-model" in tool_msgs[0]["content"]

    # The gateway's count (OpenAI usage shape) is the run's usage; one attempt.
    (run,) = list_runs(stack.db, chat_jid=CHAT)
    assert run.state == "succeeded", (run.error, logs)
    assert run.attempts == 1
    assert (run.input_tokens, run.output_tokens) == fake.usage() == (30, 3)

    # The secret never entered the container.
    assert probe.error is None, repr(probe.error)
    assert len(probe.seen) == 1, probe.seen
    (seen,) = probe.seen
    assert seen["exec_code"] == 0 and "HOME=/tmp" in seen["exec_output"], seen
    for field in ("env", "cmd", "entrypoint", "args"):
        assert "openai-secret" not in json.dumps(seen[field]), (field, seen[field])
    assert "openai-secret" not in seen["exec_output"]
    assert SECRET not in res.stdout + res.stderr
