"""The web page end to end: `orchestrator api` on loopback, a real Celery
worker, the agent in its Docker container (offline model), headless Chromium.
A message typed into the composer wakes the agent; its reply, its tool calls
(TOOL_CALL, TODO, CODE_EDIT) and the run's status show up live."""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.store.groups import ensure_main_group
from orchestrator.store.runs import list_runs
from tests.conftest import wait_until
from tests.web_browser import screenshot

from .conftest import BIN, Stack

TOOLS_MESSAGE = """$ echo hi-from-the-browser
/todo
[x] plan
[~] build
[ ] ship
/end
/write notes.txt
first line
/end"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def api_url(stack: Stack) -> Iterator[str]:
    port = _free_port()
    log = stack.settings.data_dir.parent / "api.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(BIN / "orchestrator"), "api", "--port", str(port)],
            env=stack.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=stack.settings.data_dir.parent,
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(healthy, 60, "the API to answer /health", lambda: log.read_text(errors="replace"))
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.mark.docker
@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_composer_message_gets_the_agents_reply(stack: Stack, api_url: str, page: Any, tmp_path: Path) -> None:
    ensure_main_group(stack.db)
    stack.start_worker()
    page.goto(f"{api_url}/")
    page.wait_for_selector("#conn[data-state='live']")
    assert page.inner_text("#chat-title") == "main"

    page.fill("#composer-text", "hello from the browser")
    page.press("#composer-text", "Enter")
    page.wait_for_selector("#messages article.msg-user >> text=hello from the browser")
    try:
        page.wait_for_selector('article.msg-assistant >> text=received: "hello from the browser"', timeout=120_000)
    except Exception:
        print(stack.worker_logs())
        raise
    page.wait_for_selector("#run-status[data-state='succeeded']", timeout=30_000)
    assert page.inner_text("#run-status") == "done"
    assert page.locator("article.msg-assistant .who").first.inner_text() == "Andy"
    assert [r.state for r in list_runs(stack.db, chat_jid="main@local")] == ["succeeded"]

    # Tools: a command, a todo list and a new file, each rendered by its envelope.
    page.fill("#composer-text", TOOLS_MESSAGE)
    page.click("#send")
    wait_until(lambda: len(list_runs(stack.db, chat_jid="main@local")) == 2, 30, "a second run")
    page.wait_for_selector("#run-status[data-state='succeeded']", timeout=120_000)
    page.wait_for_selector("article.msg-tool:has(.code-edit)")
    bash = page.locator("article.msg-tool:has(.tool-name:text-is('bash'))")
    assert bash.locator(".exit").inner_text() == "✅ exit 0"
    bash.locator("summary").click()
    assert "echo hi-from-the-browser" in bash.locator(".tool-input").inner_text()
    assert "hi-from-the-browser" in bash.locator(".tool-output").inner_text()
    todo = page.locator("article.msg-tool:has(.todo)")
    assert [t.strip() for t in todo.locator(".todo-item .mark").all_inner_texts()] == ["●", "◐", "○"]
    edit = page.locator("article.msg-tool:has(.code-edit)")
    assert edit.locator(".file-head .verb").inner_text() == "Created"
    assert edit.locator(".file-head .path").inner_text() == "notes.txt"
    assert edit.locator(".line.add .code").all_inner_texts() == ["first line"]
    screenshot(page, tmp_path, "web-chat-agent.png")
