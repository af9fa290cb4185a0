"""The web chat page in headless Chromium, against the API on a real uvicorn
server (loopback) and a real database: rich rendering of every message kind,
live updates over the event stream, run status, the token login, the
composer, edit and regenerate, files (dropped or chosen, sent, previewed,
downloaded; refused; hostile names and types).  (The page with a real worker
and agent container: tests/integration/test_web_chat.py.)"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from PIL import Image

from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.http.api import create_app
from orchestrator.model.envelopes import build_structured_envelope
from orchestrator.model.views import REPLY_TO_KEY
from orchestrator.root import Orchestrator
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.files import FileStore
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
    # The stream may show the message before the POST's answer sets the note.
    page.wait_for_selector("#composer-note >> text=does not wake the agent")
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
    # The edit's answer draws the message, and the history's change resets the view (a redraw
    # from the stream): the mark is waited for, as it may come with the second drawing.
    page.wait_for_selector(f"article[data-id='{stored[0].id}'] .edited")
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


# --- files ---------------------------------------------------------------------------------

HOSTILE_NAME = "<img src=x onerror=alert(1)>.png"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(2)"><script>alert(3)</script></svg>'


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 60, 40)).save(out, format="PNG")
    return out.getvalue()


def _transfer(page: Any, files: list[tuple[str, str, bytes]]) -> Any:
    """A DataTransfer in the page carrying ``files`` (name, type, bytes), as a drag from the desktop does."""
    return page.evaluate_handle(
        """(files) => {
        const transfer = new DataTransfer();
        for (const [name, type, data] of files) {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            transfer.items.add(new File([bytes], name, { type }));
        }
        return transfer;
    }""",
        [[name, mime, base64.b64encode(data).decode()] for name, mime, data in files],
    )


def _drop(page: Any, files: list[tuple[str, str, bytes]]) -> None:
    transfer = _transfer(page, files)
    for event in ("dragenter", "dragover", "drop"):
        page.dispatch_event("#composer-text", event, {"dataTransfer": transfer})


def _envelope(message: Any) -> dict[str, Any]:
    """A stored message's FILE envelope."""
    meta = message.metadata
    assert isinstance(meta, dict) and meta["message_type"] == "FILE", meta
    return meta


def _sent_files(message: Any) -> list[str]:
    """The names of the files a stored message carries."""
    return [ref["name"] for ref in _envelope(message)["payload"]["files"]]


def _download(page: Any, link: Any) -> tuple[str, bytes]:
    with page.expect_download() as download:
        link.click()
    return download.value.suggested_filename, Path(download.value.path()).read_bytes()


def _image_sizes(img: Any) -> list[int]:
    """An <img>'s natural size and the size it takes on the page (its border included)."""
    return list(img.evaluate("i => [i.naturalWidth, i.naturalHeight, i.offsetWidth, i.offsetHeight]"))


def test_files_dropped_on_the_composer_are_sent_previewed_and_downloaded(
    db: Database, settings: Settings, open_server: Any, page: Any, tmp_path: Path
) -> None:
    add_group(db, chat_jid=JID, name="Web team", folder="web", requires_trigger=True)
    picture = _png(640, 480)
    notes = b"line one\nline two\n" * 100
    base = open_server()
    page.goto(f"{base}/#chat_jid={JID}")
    page.wait_for_selector("#conn[data-state='live']")
    composer = page.locator("#composer")

    # Files dragged over the composer show where they will go; dragged away, that goes.
    transfer = _transfer(page, [("photo.png", "image/png", picture), ("notes.txt", "text/plain", notes)])
    page.dispatch_event("#composer-text", "dragenter", {"dataTransfer": transfer})
    assert "dropping" in (composer.get_attribute("class") or "")
    assert page.locator("#composer .drop-hint").is_visible()
    page.dispatch_event("#composer", "dragleave", {"dataTransfer": transfer})
    assert "dropping" not in (composer.get_attribute("class") or "")
    assert page.locator("#composer .drop-hint").is_hidden()

    # Dropped: each listed with its name and size; the image with a thumbnail from its bytes.
    for event in ("dragenter", "dragover", "drop"):
        page.dispatch_event("#composer-text", event, {"dataTransfer": transfer})
    page.wait_for_selector("#attachments .pending-file >> nth=1")
    assert "dropping" not in (composer.get_attribute("class") or "")
    assert _texts(page, "#attachments .file-name") == ["photo.png", "notes.txt"]
    assert _texts(page, "#attachments .file-size") == [human_size(len(picture)), human_size(len(notes))]
    thumb = page.locator("#attachments .pending-thumb")
    assert thumb.count() == 1
    page.wait_for_function("() => document.querySelector('#attachments .pending-thumb').naturalWidth === 640")
    assert (thumb.get_attribute("src") or "").startswith("blob:")
    assert page.locator("#messages article").count() == 0  # nothing is sent before Send

    # A drop beside the composer is refused (the browser would open the file in place of the page).
    prevented = page.evaluate(
        """(transfer) => {
        const event = new DragEvent("drop", { dataTransfer: transfer, bubbles: true, cancelable: true });
        document.getElementById("messages").dispatchEvent(event);
        return event.defaultPrevented;
    }""",
        transfer,
    )
    assert prevented is True
    assert page.locator("#attachments .pending-file").count() == 2

    # The paperclip chooses files too; × takes one back.
    with page.expect_file_chooser() as chooser:
        page.click("#attach")
    assert chooser.value.is_multiple()
    chooser.value.set_files([{"name": "extra.bin", "mimeType": "application/octet-stream", "buffer": b"\0" * 10}])
    page.wait_for_selector("#attachments .pending-file >> nth=2")
    assert _texts(page, "#attachments .file-name") == ["photo.png", "notes.txt", "extra.bin"]
    page.click("#attachments .pending-file:has-text('extra.bin') button.remove")
    page.wait_for_function("() => document.querySelectorAll('#attachments .pending-file').length === 2")
    page.fill("#composer-text", "here are the files")
    screenshot(page, tmp_path, "web-files-composer.png")

    # Sent: uploaded, then the message names them in its FILE envelope.
    page.press("#composer-text", "Enter")
    page.wait_for_selector("#messages article.msg-user .files")
    page.wait_for_selector("#attachments", state="hidden")  # (the stream may show the message first)
    assert page.input_value("#composer-text") == ""
    stored = get_messages_after(JID, 0, db=db)
    files = FileStore.from_settings(db, settings).list_chat(JID)
    assert [(f.name, f.mime, f.size) for f in files] == [
        ("photo.png", "image/png", len(picture)),
        ("notes.txt", "text/plain", len(notes)),
    ]
    assert [(m.sender, m.content, _sent_files(m)) for m in stored] == [
        ("web:web", "here are the files", [f.name for f in files])
    ]
    assert [ref["id"] for ref in _envelope(stored[0])["payload"]["files"]] == [f.id for f in files]

    # Shown: the words, the image as a bounded preview from a blob: URL, every file as a link.
    article = page.locator(f"article[data-id='{stored[0].id}']")
    assert article.locator(".text").inner_text() == "here are the files"
    article.locator(".file-preview[data-state='shown']").wait_for()
    preview = article.locator("img.file-image")
    assert preview.count() == 1 and (preview.get_attribute("src") or "").startswith("blob:")
    natural_w, natural_h, shown_w, shown_h = _image_sizes(preview)
    assert (natural_w, natural_h) == (640, 480)
    assert 300 < shown_w <= 320 and abs(shown_h / shown_w - 0.75) < 0.02  # bounded, the shape kept
    assert _texts(article, ".file-download .file-name") == ["photo.png", "notes.txt"]
    assert _texts(article, ".file-download .file-size") == [human_size(len(picture)), human_size(len(notes))]
    screenshot(page, tmp_path, "web-files-message.png")

    # Downloads: the right bytes under the file's name.
    assert _download(page, article.locator(".file-download:has-text('notes.txt')")) == ("notes.txt", notes)
    assert _download(page, article.locator(".file-download:has-text('photo.png')")) == ("photo.png", picture)

    # Files alone, without a word, are a message too.
    _drop(page, [("only.txt", "text/plain", b"just a file")])
    page.wait_for_selector("#attachments .pending-file")
    page.click("#send")
    page.wait_for_function("() => document.querySelectorAll('#messages article.msg-user').length === 2")
    last = get_messages_after(JID, stored[0].seq, db=db)
    assert [(m.content, _sent_files(m)) for m in last] == [("", ["only.txt"])]
    only = page.locator(f"article[data-id='{last[0].id}']")
    assert only.locator(".text").count() == 0
    assert _texts(only, ".file-download .file-name") == ["only.txt"]


def test_a_refused_upload_is_shown_and_keeps_the_text_and_the_files(
    db: Database, settings: Settings, open_server: Any, page: Any
) -> None:
    add_group(db, chat_jid=JID, name="Web team", folder="web", requires_trigger=True)
    base = open_server(file_max_bytes=1000, group_files_max_bytes=1500)
    page.goto(f"{base}/#chat_jid={JID}")
    page.wait_for_selector("#conn[data-state='live']")

    # A file past the per-file limit (GET /api/info says it) is not even added.
    _drop(page, [("big.txt", "text/plain", b"x" * 5000), ("small.txt", "text/plain", b"small")])
    page.wait_for_selector("#attachments .pending-file")
    assert "Not added: big.txt (a file may be at most 1000 B)" in page.inner_text("#error")
    assert _texts(page, "#attachments .file-name") == ["small.txt"]

    # Files within it that take the group past its limit: the server's 413 is said, by the
    # composer too; nothing stored, nothing lost.
    _drop(page, [("a.txt", "text/plain", b"a" * 900), ("b.txt", "text/plain", b"b" * 900)])
    page.wait_for_selector("#attachments .pending-file >> nth=2")
    page.fill("#composer-text", "please read these")
    page.click("#send")
    page.wait_for_selector("#composer-note.refused")
    assert "ORCHESTRATOR_GROUP_FILES_MAX_BYTES" in page.inner_text("#error")
    assert page.inner_text("#composer-note").startswith("Not sent: ")
    assert page.input_value("#composer-text") == "please read these"
    assert _texts(page, "#attachments .file-name") == ["small.txt", "a.txt", "b.txt"]
    assert get_messages_after(JID, 0, db=db) == []
    assert FileStore.from_settings(db, settings).list_chat(JID) == []
    assert page.locator("#messages article").count() == 0
    assert page.locator("#send").is_enabled()

    # Without one of them, the same message goes.
    page.click("#attachments .pending-file:has-text('b.txt') button.remove")
    page.click("#send")
    page.wait_for_selector("#messages article.msg-user .file-download")
    assert "refused" not in (page.get_attribute("#composer-note", "class") or "")
    page.wait_for_selector("#attachments", state="hidden")  # (the stream may show the message first)
    assert page.input_value("#composer-text") == ""
    stored = get_messages_after(JID, 0, db=db)
    assert [(m.content, _sent_files(m)) for m in stored] == [("please read these", ["small.txt", "a.txt"])]


def test_hostile_file_names_and_types_stay_text_and_images_load_with_the_token(
    db: Database, settings: Settings, open_server: Any, page: Any
) -> None:
    add_group(db, chat_jid=JID, name="Web team", folder="web", requires_trigger=True)
    base = open_server(api_token=TOKEN)
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.goto(f"{base}/#chat_jid={JID}")
    page.fill("#login-token", TOKEN)
    page.click("#login-form button")
    page.wait_for_selector("#conn[data-state='live']")

    # A name that is markup, and an SVG (it runs script when shown as a document).
    picture = _png(64, 40)
    _drop(page, [(HOSTILE_NAME, "image/png", picture), ("drawing.svg", "image/svg+xml", SVG)])
    page.wait_for_selector("#attachments .pending-file >> nth=1")
    assert _texts(page, "#attachments .file-name") == [HOSTILE_NAME, "drawing.svg"]
    assert page.locator("#attachments .pending-thumb").count() == 1  # the SVG gets no thumbnail
    page.press("#composer-text", "Enter")
    page.wait_for_selector("#messages article.msg-user .file-preview[data-state='shown']")
    sent = page.locator("#messages article.msg-user")
    assert _texts(sent, ".file-download .file-name") == [HOSTILE_NAME, "drawing.svg"]
    assert sent.locator(".file-download").first.get_attribute("download") == HOSTILE_NAME
    # The preview came with the token: the same URL without it is refused.
    image = sent.locator("img.file-image")
    assert image.count() == 1 and _image_sizes(image)[:2] == [64, 40]
    files = FileStore.from_settings(db, settings).list_chat(JID)
    assert [(f.name, f.mime) for f in files] == [(HOSTILE_NAME, "image/png"), ("drawing.svg", "text/plain")]
    assert httpx.get(f"{base}/api/files/{files[0].id}?inline=true").status_code == 401
    # The SVG is a download only, its bytes as sent.
    name, data = _download(page, sent.locator(".file-download:has-text('drawing.svg')"))
    assert (name, data) == ("drawing.svg", SVG)

    # An agent's reply with a file (send_file) shows it the same way, under the reply's words.
    chart = FileStore.from_settings(db, settings).store_bytes(JID, _png(30, 20), "chart.png")
    _store(
        db,
        "a1",
        sender="bot",
        sender_name="Andy",
        message_type="assistant",
        content="Here is the chart.",
        metadata=file_envelope([chart], extras={"via": "send_file"}),
    )
    reply = page.locator("article[data-id='a1']")
    reply.locator(".file-preview[data-state='shown']").wait_for()
    assert reply.locator(".text").inner_text() == "Here is the chart."
    assert _image_sizes(reply.locator("img.file-image"))[:2] == [30, 20]
    assert _download(page, reply.locator(".file-download")) == ("chart.png", _png(30, 20))

    # An envelope that lies (stored without the API's check): an SVG called a PNG is asked
    # for, served as text, and never shown; one that says SVG or HTML is not even asked for;
    # a picture said to be 100 megapixels is not fetched to be decoded; one of a sane size
    # is shown in the box its size gives, bounded.
    svg_file = files[1]
    forged = [
        {"id": svg_file.id, "name": "trust-me.png", "mime": "image/png", "size": svg_file.size},
        {"id": svg_file.id, "name": "drawing.svg", "mime": "image/svg+xml", "size": svg_file.size},
        {"id": svg_file.id, "name": "page.html", "mime": "text/html", "size": svg_file.size},
        {
            "id": chart.id,
            "name": "bomb.png",
            "mime": "image/png",
            "size": chart.size,
            "width": 10_000,
            "height": 10_000,
        },
        {"id": chart.id, "name": "wide.png", "mime": "image/png", "size": chart.size, "width": 3000, "height": 2000},
    ]
    _store(
        db,
        "f1",
        sender="bot",
        sender_name="Andy",
        message_type="assistant",
        content="",
        metadata={"message_type": "FILE", "version": 1, "payload": {"files": forged}},
    )
    lie = page.locator("article[data-id='f1']")
    lie.locator(".file-preview[data-state='failed']").wait_for(state="attached")
    lie.locator(".file-preview[data-state='shown']").wait_for()
    assert lie.locator(".file-preview").count() == 2
    assert lie.locator(".file[data-mime='image/png'] .file-preview").count() == 2  # not bomb.png's
    failed = lie.locator(".file-preview[data-state='failed']")
    assert failed.locator("img").get_attribute("src") is None
    # Refused on the server's own type, before any decoding was tried.
    assert failed.get_attribute("title") == "No preview: not an image to show (text/plain)"
    wide = lie.locator(".file-preview[data-state='shown'] img")
    assert (wide.get_attribute("width"), wide.get_attribute("height")) == ("320", "213")
    natural_w, natural_h, shown_w, shown_h = _image_sizes(wide)
    assert (natural_w, natural_h, shown_w) == (30, 20, 320) and abs(shown_h - 213) <= 1
    assert _texts(lie, ".file-download .file-name") == [
        "trust-me.png",
        "drawing.svg",
        "page.html",
        "bomb.png",
        "wide.png",
    ]

    # Nothing any of it named became an element, and nothing ran.
    assert page.locator("img[src='x'], #messages svg, #messages script, #messages iframe").count() == 0
    assert dialogs == []
