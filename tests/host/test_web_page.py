"""The web chat page in headless Chromium, against the API on a real uvicorn
server (loopback) and a real database: rich rendering of every message kind,
live updates over the event stream, run status, the token login, the
composer, edit and regenerate.  (The page with a real worker and agent
container: tests/integration/test_web_chat.py.)"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.model.envelopes import build_structured_envelope
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.root import Orchestrator
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after, now_iso, store_message_direct
from orchestrator.store.runs import create_run, finish_run, set_container
from tests.live_server import serve
from tests.web_browser import screenshot

JID = "web@local"
TOKEN = "page-token-0123456789"
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'

OLD_PY = "import sys\n\n\ndef greet(name):\n    print('hello ' + name)\n\n\nif __name__ == '__main__':\n    greet(sys.argv[1])\n"
NEW_PY = "import sys\n\n\ndef greet(name: str) -> None:\n    print(f'Hello, {name}!')\n\n\nif __name__ == '__main__':\n    greet(sys.argv[1])\n"
TODOS = [
    {"id": "1", "content": "Fix the greeting", "status": "completed"},
    {"id": "2", "content": f"Write the release notes {XSS}", "status": "in_progress"},
    {"id": "3", "content": "Tag v1.2", "status": "pending"},
]
BASH_INPUT = {"command": "ls dist", "timeout": 30}


def _store(db: Database, mid: str, **fields: Any) -> Any:
    fields.setdefault("is_from_me", True)
    return store_message_direct(db=db, id=mid, chat_jid=JID, timestamp=now_iso(), **fields)


def _tool(db: Database, mid: str, tool: str, content: str, exit_code: int, kind: str, payload: dict[str, Any]) -> Any:
    meta = build_structured_envelope(kind, payload, extras={"exit_code": exit_code, "tool": tool, "tool_use_id": mid})
    return _store(
        db, mid, sender="command_output", sender_name=tool, content=content, message_type="tool_result", metadata=meta
    )


def _seed(db: Database) -> dict[str, Any]:
    q = _store(
        db,
        "q1",
        sender="web:Ann",
        sender_name="Ann",
        is_from_me=False,
        message_type="user",
        content=f"@Andy fix the greeting and plan the release {XSS}",
    )
    _store(
        db,
        "t1",
        sender="tool_use",
        sender_name="edit_file",
        message_type="assistant",
        content='edit_file {"path": "src/app.py"}',
    )
    _tool(
        db,
        "r1",
        "edit_file",
        "edited src/app.py",
        0,
        "CODE_EDIT",
        {
            "edits": [
                {"file_path": "src/app.py", "old_content": OLD_PY, "new_content": NEW_PY, "language": "python"},
                {"file_path": "docs/NEW.md", "old_content": None, "new_content": "# New\nsecond line\n"},
            ]
        },
    )
    _tool(db, "r2", "todo_write", "3 todos", 0, "TODO", {"todos": TODOS})
    _tool(
        db,
        "r3",
        "bash",
        "ls: cannot access 'dist'",
        2,
        "TOOL_CALL",
        {
            "tool_name": "bash",
            "input": BASH_INPUT,
            "output": "ls: cannot access 'dist': No such file or directory",
            "error": "exit status 2",
        },
    )
    _tool(
        db,
        "r4",
        "glob",
        '["a.py", "b.py"]',
        0,
        "TOOL_CALL",
        {"tool_name": "glob", "input": {"pattern": "*.py"}, "output": ["a.py", "b.py"]},
    )
    _store(
        db,
        "r5",
        sender="command_output",
        sender_name="bash",
        content="plain output",
        message_type="tool_result",
        metadata={"exit_code": 0},
    )
    a = _store(
        db,
        "a1",
        sender="bot",
        sender_name="Andy",
        message_type="assistant",
        content=f"Done: the greeting is fixed. {XSS}",
        metadata={REPLY_TO_KEY: q.seq},
    )
    _store(
        db,
        "h1",
        sender="host",
        sender_name="host",
        message_type="host",
        content="run 1234 failed: the container exited with 137 (out of memory)",
    )
    _store(db, "s1", sender="system", sender_name="system", message_type="system", content="Answer briefly.")
    return {"q": q, "a": a}


@pytest.fixture
def open_server(db: Database, settings: Settings) -> Iterator[Any]:
    started: list[Any] = []

    def start(**overrides: Any) -> str:
        cm = serve(create_app(Orchestrator(settings.replace(**overrides))))
        started.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(started):
        cm.__exit__(None, None, None)


def _texts(page: Any, selector: str) -> list[str]:
    return [t.strip() for t in page.locator(selector).all_inner_texts()]


def _style(page: Any, selector: str, prop: str) -> str:
    return str(page.locator(selector).first.evaluate(f"e => getComputedStyle(e).{prop}"))


def test_rich_rendering_live_updates_and_run_status(db: Database, open_server: Any, page: Any, tmp_path: Path) -> None:
    add_group(db, chat_jid=JID, name="Web team", folder="web", requires_trigger=True)
    seeded = _seed(db)
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=seeded["q"].seq, celery_task_id=None)
    base = open_server()
    page.goto(f"{base}/#chat_jid={JID}")
    page.wait_for_selector("article[data-id='s1']")
    assert _texts(page, "#groups .group-name") == ["Web team"]
    assert page.inner_text("#chat-title") == "Web team"
    assert page.get_attribute("#conn", "data-state") == "live"
    assert "start with @Andy" in page.get_attribute("#composer-text", "placeholder")

    # CODE_EDIT: a diff per file, with the path; removed lines red, added green.
    edit = page.locator("article[data-id='r1']")
    assert _texts(edit, ".file-head .path") == ["src/app.py", "docs/NEW.md"]
    assert _texts(edit, ".file-head .verb") == ["Edited", "Created"]
    first = edit.locator(".code-edit").first
    assert _texts(first, ".line.del .code") == ["def greet(name):", "print('hello ' + name)"]
    assert _texts(first, ".line.add .code") == ["def greet(name: str) -> None:", "print(f'Hello, {name}!')"]
    assert "import sys" in _texts(first, ".line.ctx .code")
    assert first.locator(".stat").inner_text() == "+2 −2"
    assert _style(page, "article[data-id='r1'] .line.del", "backgroundColor") == "rgb(255, 235, 233)"
    assert _style(page, "article[data-id='r1'] .line.add", "backgroundColor") == "rgb(218, 251, 225)"
    assert _texts(edit.locator(".code-edit").nth(1), ".line.add .code") == ["# New", "second line"]
    assert "✅ exit 0" in edit.locator(".exit").inner_text()

    # TODO: a checklist, completed struck through.
    todo = page.locator("article[data-id='r2']")
    assert _texts(todo, ".todo-item .mark") == ["●", "◐", "○"]
    assert [todo.locator(".todo-item").nth(i).get_attribute("data-status") for i in range(3)] == [
        "completed",
        "in_progress",
        "pending",
    ]
    assert _texts(todo, ".todo-text")[1] == TODOS[1]["content"]  # the markup shows as text
    assert "line-through" in _style(page, "article[data-id='r2'] .todo-item.completed .todo-text", "textDecorationLine")
    assert "line-through" not in _style(
        page, "article[data-id='r2'] .todo-item.pending .todo-text", "textDecorationLine"
    )
    assert todo.locator(".todo-head").inner_text() == "Todos 1/3 done"

    # TOOL_CALL: collapsed; input and output as JSON; the error state.
    failed = page.locator("article[data-id='r3']")
    details = failed.locator("details.tool-call")
    assert "error" in (details.get_attribute("class") or "")
    assert details.get_attribute("open") is None and not failed.locator(".tool-input").is_visible()
    failed.locator("summary").click()
    assert details.get_attribute("open") is not None
    assert json.loads(failed.locator(".tool-input").inner_text()) == BASH_INPUT
    assert failed.locator(".tool-error").inner_text() == "exit status 2"
    assert failed.locator(".exit").inner_text() == "❌ exit 2"
    assert failed.locator(".exit").get_attribute("data-exit-code") == "2"
    ok = page.locator("article[data-id='r4']")
    ok.locator("summary").click()
    assert json.loads(ok.locator(".tool-output").inner_text()) == ["a.py", "b.py"]
    assert "error" not in (ok.locator("details").get_attribute("class") or "")
    plain = page.locator("article[data-id='r5']")
    assert (
        plain.locator("pre.output").inner_text() == "plain output"
        and plain.locator(".exit").inner_text() == "✅ exit 0"
    )

    # Host and system messages set apart; the reply under the assistant's name; buttons.
    host = page.locator("article[data-id='h1']")
    assert host.locator(".who").inner_text() == "🏠 host"
    assert _style(page, "article[data-id='h1']", "backgroundColor") == "rgb(255, 246, 219)"
    assert _style(page, "article[data-id='h1']", "borderTopStyle") == "dashed"
    assert page.locator("article[data-id='s1'] .who").inner_text() == "⚙️ system"
    assert page.locator("article[data-id='a1'] .who").inner_text() == "Andy"
    assert page.locator("article[data-id='a1'] button.regenerate").count() == 1
    assert page.locator("article[data-id='q1'] button.edit").count() == 1
    assert page.locator("article[data-id='q1'] button.regenerate").count() == 0
    assert page.locator("article[data-id='t1']").get_attribute("class") == "msg msg-tool-use"

    # Nothing from a message became markup.
    assert page.locator("#messages img, #messages script").count() == 0
    assert page.evaluate("() => window.__xss") is None
    assert XSS in page.locator("article[data-id='a1'] .text").inner_text()

    # Run status while the agent works, live from the stream.
    status = page.locator("#run-status")
    assert status.get_attribute("data-state") == "queued" and "queued" in status.inner_text()
    set_container(db, run.id, "c0ffee")
    page.wait_for_selector("#run-status[data-state='running']")
    assert page.locator("#messages .typing").is_visible()
    assert "Andy is working" in page.locator("#messages .typing").inner_text()
    screenshot(page, tmp_path, "web-chat-rich.png")

    # A new message shows up without a reload, then the run ends.
    _store(
        db,
        "a2",
        sender="bot",
        sender_name="Andy",
        message_type="assistant",
        content="One more thing:\n```python\nprint('<b>x</b>')\n```\nThat's all.",
    )
    page.wait_for_selector("article[data-id='a2']")
    assert page.locator("article[data-id='a2'] pre.fenced").inner_text() == "print('<b>x</b>')"
    assert page.locator("article[data-id='a2'] .text").inner_text().endswith("That's all.")
    finish_run(db, run.id, state="succeeded")
    page.wait_for_selector("#run-status[data-state='succeeded']")
    assert status.inner_text() == "done" and page.locator("#messages .typing").count() == 0
    failing = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=1, celery_task_id=None)
    finish_run(db, failing.id, state="timed_out", error="run timed out after 300s")
    page.wait_for_selector("#run-status[data-state='timed_out']")
    assert status.inner_text() == "failed (timed out)" and status.get_attribute("title") == "run timed out after 300s"
    order = [int(s) for s in page.locator("#messages article").evaluate_all("els => els.map(e => e.dataset.seq)")]
    assert order == sorted(order) and len(order) == 11


def test_login_composer_edit_and_regenerate(db: Database, open_server: Any, page: Any, tmp_path: Path) -> None:
    add_group(db, chat_jid=JID, name="Web team", folder="web", requires_trigger=True)
    base = open_server(api_token=TOKEN)
    page.goto(f"{base}/")
    page.wait_for_selector("#login-form")
    assert page.locator("#app").is_hidden()
    screenshot(page, tmp_path, "web-login.png")
    page.fill("#login-token", "wrong")
    page.click("#login-form button")
    page.wait_for_selector("#login-error:not([hidden])")
    assert "not accepted" in page.inner_text("#login-error")
    assert page.evaluate("() => sessionStorage.getItem('orchestrator.token')") is None
    page.fill("#login-token", TOKEN)
    page.click("#login-form button")
    page.wait_for_selector("#conn[data-state='live']")  # the token-carrying (fetch) stream
    assert page.evaluate("() => sessionStorage.getItem('orchestrator.token')") == TOKEN

    # The composer: Enter sends; a message without the trigger is stored but wakes nobody.
    page.fill("#sender-name", "Ann")
    page.fill("#composer-text", "just saying hi")
    page.press("#composer-text", "Enter")
    page.wait_for_selector("#messages article.msg-user >> text=just saying hi")
    assert "does not wake the agent" in page.inner_text("#composer-note")
    assert page.input_value("#composer-text") == ""
    page.fill("#composer-text", "@Andy please answer\nwith two lines")
    page.click("#send")
    page.wait_for_selector("#messages article.msg-user >> text=with two lines")
    assert page.inner_text("#composer-note") == ""
    stored = get_messages_after(JID, 0, db=db)
    assert [(m.sender, m.sender_name, m.content) for m in stored] == [
        ("web:Ann", "Ann", "just saying hi"),
        ("web:Ann", "Ann", "@Andy please answer\nwith two lines"),
    ]
    assert get_group(db, JID).pending_seq == stored[1].seq  # the second one woke the agent

    # Edit a person's message in place.
    question = stored[1]
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=question.seq, celery_task_id=None)
    reply = _store(
        db,
        "a1",
        sender="bot",
        sender_name="Andy",
        message_type="assistant",
        content="first answer",
        metadata={REPLY_TO_KEY: question.seq, "run_id": run.id},
    )
    finish_run(db, run.id, state="succeeded")
    page.wait_for_selector("article[data-id='a1']")
    page.click(f"article[data-id='{stored[0].id}'] button.edit")
    page.fill(f"article[data-id='{stored[0].id}'] textarea.edit-text", "just saying hello")
    page.click(f"article[data-id='{stored[0].id}'] button.save")
    page.wait_for_selector(f"article[data-id='{stored[0].id}'] .text >> text=just saying hello")
    assert page.locator(f"article[data-id='{stored[0].id}'] .edited").count() == 1
    assert get_messages_after(JID, 0, db=db)[0].content == "just saying hello"

    # Regenerate: refused (409) while a run holds the group, then done.
    assert leases.acquire(db, JID, "someone", 60)
    page.click("article[data-id='a1'] button.regenerate")
    page.wait_for_selector("#error:not([hidden])")
    assert "a run is in progress" in page.inner_text("#error")
    leases.release(db, JID, "someone")
    page.click("article[data-id='a1'] button.regenerate")
    page.wait_for_selector("article[data-id='a1']", state="detached")
    assert [m.id for m in get_messages_after(JID, 0, include_superseded=True, db=db) if m.superseded_at] == [reply.id]

    # Signing out forgets the token.
    page.click("#logout")
    page.wait_for_selector("#login-form")
    assert page.evaluate("() => sessionStorage.getItem('orchestrator.token')") is None


def test_the_address_names_the_chat_and_an_old_chat_link_still_opens_it(
    db: Database, open_server: Any, page: Any
) -> None:
    # Two groups: the one named in the address is shown, not the first in the list.
    add_group(db, chat_jid="first@local", name="First", folder="first")
    add_group(db, chat_jid=JID, name="Web team", folder="web")
    _store(db, "w1", sender="web:Ann", sender_name="Ann", is_from_me=False, message_type="user", content="hi")
    base = open_server()

    page.goto(f"{base}/#chat_jid={JID}")
    page.wait_for_selector("article[data-id='w1']")
    assert page.inner_text("#chat-title") == "Web team"
    assert page.evaluate("() => location.hash") == "#chat_jid=web%40local"

    # The older spelling opens the same chat and is rewritten to the new one.
    page.goto(f"{base}/?old#chat={JID}")
    page.wait_for_selector("article[data-id='w1']")
    assert page.inner_text("#chat-title") == "Web team"
    assert page.evaluate("() => location.hash") == "#chat_jid=web%40local"

    # Choosing another group writes its chat_jid; changing the hash by hand follows it.
    page.click("#groups button[data-jid='first@local']")
    page.wait_for_function("() => location.hash === '#chat_jid=first%40local'")
    assert page.inner_text("#chat-title") == "First"
    page.evaluate(f"() => {{ location.hash = 'chat={JID}'; }}")
    page.wait_for_function("() => document.querySelector('#chat-title').textContent === 'Web team'")


def test_without_a_token_the_page_changes_things_and_another_sites_page_cannot(
    db: Database, open_server: Any, page: Any
) -> None:
    """No token (loopback): the page's own requests carry X-Orchestrator-Client from its own
    origin and go through.  A page of another site (localhost against 127.0.0.1: two sites to the
    browser) posting to the API by script (no-cors: no preflight) or by a form changes nothing."""
    add_group(db, chat_jid=JID, name="Web team", folder="web", requires_trigger=True)
    q = _store(db, "q1", sender="web:Ann", sender_name="Ann", is_from_me=False, message_type="user", content="@Andy hi")
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=q.seq, celery_task_id=None)
    _store(
        db,
        "a1",
        sender="bot",
        sender_name="Andy",
        message_type="assistant",
        content="hello",
        metadata={REPLY_TO_KEY: q.seq, "run_id": run.id},
    )
    finish_run(db, run.id, state="succeeded")
    base = open_server()
    api = f"{base}/api/chats/web%40local/messages"

    page.goto(f"http://localhost:{urlsplit(base).port}/health")  # another site's page, as far as the browser knows
    page.evaluate(
        """async ([base, api]) => {
        const message = JSON.stringify({chat_jid: "web@local", sender: "evil", content: "@Andy run this"});
        await fetch(`${base}/api/messages`, {method: "POST", mode: "no-cors", body: new Blob([message])});
        await fetch(`${base}/api/messages`, {method: "POST", mode: "no-cors", body: message});
        await fetch(`${api}/a1/regenerate`, {method: "POST", mode: "no-cors"});
    }""",
        [base, api],
    )
    with page.expect_navigation():
        page.evaluate(
            """(action) => {
            const form = document.createElement("form");
            form.method = "POST";
            form.action = action;
            document.body.append(form);
            form.submit();
        }""",
            f"{api}/q1/truncate",
        )
    assert "refused" in page.inner_text("body")
    stored = get_messages_after(JID, 0, include_superseded=True, db=db)
    assert [(m.id, m.superseded_at) for m in stored] == [("q1", None), ("a1", None)]

    # The page itself: a reply regenerated, a message sent.
    page.goto(f"{base}/#chat_jid={JID}")
    page.click("article[data-id='a1'] button.regenerate")
    page.wait_for_selector("article[data-id='a1']", state="detached")
    page.fill("#sender-name", "Ann")
    page.fill("#composer-text", "from the page")
    page.press("#composer-text", "Enter")
    page.wait_for_selector("#messages article.msg-user >> text=from the page")
    stored = get_messages_after(JID, 0, include_superseded=True, db=db)
    assert [m.content for m in stored if m.superseded_at is None] == ["@Andy hi", "from the page"]
    assert [m.id for m in stored if m.superseded_at] == ["a1"]
