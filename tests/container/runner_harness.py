"""Helpers for the agent runner's tests: build inputs, run the real runner process.

A plain module (not conftest.py) so tests can import its helpers by name;
``conftest.py`` re-exports the fixtures.

The runner is run exactly as the image runs it (``python -m agent_runner``,
stdin JSON in, JSON lines out), but on the host: PYTHONPATH points at
``container/`` and AGENT_WORKSPACE at a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

CONTAINER_DIR = Path(__file__).resolve().parents[2] / "container"


def make_input(*messages: str | dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A ContainerInput document; plain strings become user messages."""
    doc: dict[str, Any] = {
        "run_id": "run-test",
        "chat_jid": "chat@test",
        "group_folder": "test-group",
        "assistant_name": "Andy",
        "messages": [{"role": "user", "content": m} if isinstance(m, str) else m for m in messages],
    }
    doc.update(fields)
    return doc


@dataclass
class RunnerResult:
    returncode: int
    events: list[dict[str, Any]]
    stderr: str

    @property
    def types(self) -> list[str]:
        """The events' types in order; the streamed text (``text_delta``: test_streaming.py) left out."""
        return [e["type"] for e in self.events if e["type"] != "text_delta"]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]


RunRunner = Callable[..., RunnerResult]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def run_runner(workspace: Path) -> RunRunner:
    """Run ``python -m agent_runner`` with the given stdin (a dict is JSON-encoded)."""

    def run(stdin: dict[str, Any] | str | bytes, timeout: float = 15.0) -> RunnerResult:
        if isinstance(stdin, dict):
            stdin = json.dumps(stdin)
        if isinstance(stdin, str):
            stdin = stdin.encode()
        env = {
            **os.environ,
            "PYTHONPATH": str(CONTAINER_DIR),
            "AGENT_WORKSPACE": str(workspace),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        proc = subprocess.run(
            [sys.executable, "-m", "agent_runner"],
            input=stdin,
            capture_output=True,
            env=env,
            cwd=workspace,
            timeout=timeout,
        )
        lines = proc.stdout.decode().splitlines()
        # Every stdout line must be one JSON event: that is the protocol.
        events = [json.loads(line) for line in lines]
        return RunnerResult(proc.returncode, events, proc.stderr.decode())

    return run


def in_own_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a thread of its own, its exception raised here: code that
    calls ``asyncio.run`` (the Claude Code runner) needs a thread with no event loop running,
    and a session-wide fixture (Playwright's) may keep one running in the tests' own thread."""
    result: list[T] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            result.append(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=call, name="own-loop")
    thread.start()
    thread.join(120)
    if errors:
        raise errors[0]
    assert result, "the call did not end within 120 s"
    return result[0]
