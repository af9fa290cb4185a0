"""``orchestrator send``: store a message as a user would, print the replies.

The one command with a start-up target (≤ 0.5 s of CPU until the message is
stored, issue 13; docs/performance.md).  So it is written on click alone,
not typer: typer converts every parameter through pydantic (0.19 s of
import), and SQLAlchemy alone takes 0.6 s.  When an installation's API is
running (announced in the data dir, or ``ORCHESTRATOR_API_URL``) the message
is POSTed to it with the standard library; otherwise it is stored in process
through the composition root, as before.  Both paths give the message an id
here, so a fallback after an API that took the request but never answered
cannot store it twice (ingest is idempotent on the id).

``orchestrator send`` is routed here by :func:`orchestrator.cli.main.main`
before typer is imported; typer's app has a forwarding ``send`` entry so
the command is listed in ``--help`` and works through typer too.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

import click

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal

if TYPE_CHECKING:
    from orchestrator.cli.api_client import ApiClient
    from orchestrator.core.settings import Settings
    from orchestrator.model.messages import StoredMessage
    from orchestrator.root import Orchestrator

# Exit codes of --wait (documented in the command's help).
EXIT_RUN_FAILED = 3
EXIT_NO_RUN = 4


class _MessageBody(TypedDict):
    """POST /api/messages's body, and the in-process IncomingMessage's fields."""

    id: str
    chat_jid: str
    sender: str
    sender_name: str
    content: str
    metadata: NotRequired[Any]  # the user's JSON, checked by ingest


class _Chat(Protocol):
    """What --wait reads while the run goes on: local database or the API."""

    def assistant_name(self) -> str: ...

    def messages_after(self, seq: int) -> list[StoredMessage]: ...

    def finished_run(self, seq: int) -> tuple[str, str, float] | None:
        """(run id, state, seconds) of the finished run that took message ``seq``."""
        ...


class _LocalChat:
    def __init__(self, root: Orchestrator, chat_jid: str) -> None:
        self.root, self.chat_jid = root, chat_jid

    def assistant_name(self) -> str:
        from orchestrator.store.groups import get_group

        return get_group(self.root.db, self.chat_jid).assistant_name or self.root.settings.assistant_name

    def messages_after(self, seq: int) -> list[StoredMessage]:
        from orchestrator.store.message_log import get_messages_after

        return get_messages_after(self.chat_jid, seq, db=self.root.db)

    def finished_run(self, seq: int) -> tuple[str, str, float] | None:
        from orchestrator.store.runs import FINAL_STATES, list_runs

        for r in list_runs(self.root.db, chat_jid=self.chat_jid, limit=20, chat_runs_only=True):
            if r.cursor_from < seq <= r.cursor_to and r.state in FINAL_STATES:
                return r.id, r.state, r.duration_s or 0.0
        return None


class _ApiChat:
    def __init__(self, client: ApiClient, settings: Settings, chat_jid: str) -> None:
        self.client, self.settings, self.chat_jid = client, settings, chat_jid

    def assistant_name(self) -> str:
        group = self.client.get(f"/api/groups/{self.client.quote(self.chat_jid)}")
        return str(group.get("assistant_name") or self.settings.assistant_name)

    def messages_after(self, seq: int) -> list[StoredMessage]:
        from orchestrator.model.messages import StoredMessage

        docs = self.client.get(f"/api/chats/{self.client.quote(self.chat_jid)}/messages", after=seq)
        return [StoredMessage.model_validate(d) for d in docs]

    def finished_run(self, seq: int) -> tuple[str, str, float] | None:
        for r in self.client.get("/api/runs", chat_jid=self.chat_jid, limit=20):
            # A replay (replay_of set) covers the same messages but is no answer of the chat's.
            if r["cursor_from"] < seq <= r["cursor_to"] and r["state"] in _FINAL_STATES and not r.get("replay_of"):
                return str(r["id"]), str(r["state"]), float(r.get("duration_s") or 0.0)
        return None


# The run states that end a run (store.runs.FINAL_STATES; not imported here:
# that module pulls SQLAlchemy).  tests/host/test_send.py holds the two equal.
_FINAL_STATES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})


@click.command(
    "send",
    help="Store TEXT as a user message in chat CHAT_JID (and wake the agent if it should).\n\n"
    "With a running installation's API (announced by `orchestrator up`/`api` in the data dir, or "
    "ORCHESTRATOR_API_URL) the message goes through it; otherwise it is stored in process. "
    f"--wait exits 0 when the run succeeded, {EXIT_RUN_FAILED} when it did not, "
    f"{EXIT_NO_RUN} when no run finished in time.",
)
@click.argument("chat_jid", metavar="CHAT_JID")
@click.argument("text")
@click.option("--sender", default="cli-user", show_default=True, help="Sender name.")
@click.option(
    "--wait", type=float, default=0, show_default=True, help="Seconds to wait for the run and print replies (0: don't)."
)
@click.option("--json", "as_json", is_flag=True, help="Print replies as JSON lines.")
@click.option("--metadata", default=None, help="Metadata JSON object, e.g. '{\"context\": [...]}'.")
def send_command(chat_jid: str, text: str, sender: str, wait: float, as_json: bool, metadata: str | None) -> None:
    from orchestrator.core.settings import Settings

    try:
        settings = Settings.load()
        meta = None if metadata is None else json.loads(metadata)
    except (OrchestratorError, ValueError) as exc:
        raise _fail(exc) from exc
    body: _MessageBody = {
        "id": f"msg-{uuid.uuid4().hex}",
        "chat_jid": chat_jid,
        "sender": sender,
        "sender_name": sender,
        "content": text,
    }
    if meta is not None:
        body["metadata"] = meta
    chat: _Chat
    sent = _send_to_api(settings, body)
    if sent is not None:
        client, seq, triggered = sent
        chat = _ApiChat(client, settings, chat_jid)
    else:
        root, seq, triggered = _store_in_process(body)
        chat = _LocalChat(root, chat_jid)
    if wait <= 0 or not triggered:
        return
    try:
        code = _wait_for_replies(chat, seq, wait, as_json)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    sys.exit(code)


def _said_stored(chat_jid: str, seq: int, triggered: bool, where: str) -> None:
    # Said once the message is committed, before any reply: on its own line.
    click.echo(
        for_terminal(f"stored #{seq} in {chat_jid}{where}" + ("" if triggered else " (does not wake the agent)")),
        err=True,
    )


def _send_to_api(settings: Settings, body: _MessageBody) -> tuple[ApiClient, int, bool] | None:
    """POST the message to the installation's API; None: store it in process instead."""
    from orchestrator.cli.api_client import ApiClient
    from orchestrator.core.errors import ApiRefused, ApiUnreachable
    from orchestrator.http.endpoint import find

    endpoint = find(settings)
    if endpoint is None:
        return None
    client = ApiClient(endpoint)
    try:
        posted = client.post("/api/messages", body)
    except ApiUnreachable as exc:
        if not endpoint.announced:
            raise _fail(exc) from exc  # named explicitly: never store elsewhere
        return None  # a stale announcement: the server is gone
    except ApiRefused as exc:
        if endpoint.announced and exc.status == 421:
            return None  # the port now serves another installation
        raise _fail(ApiRefused(exc.status, exc.detail)) from exc
    message = posted["message"]
    _said_stored(body["chat_jid"], int(message["seq"]), bool(posted["triggered"]), f" via {endpoint.url}")
    return client, int(message["seq"]), bool(posted["triggered"])


def _store_in_process(body: _MessageBody) -> tuple[Orchestrator, int, bool]:
    from orchestrator.cli.support import setup
    from orchestrator.run.ingest import IncomingMessage, ingest

    root = setup()

    def stored(msg: StoredMessage, wakes: bool) -> None:
        _said_stored(msg.chat_jid, msg.seq, wakes, "")

    try:
        result = ingest(
            root.db,
            root.settings,
            IncomingMessage(**body),
            signal=root.signals.group,
            signal_delivery=root.signals.delivery,
            on_stored=stored,
        )
    except (OrchestratorError, ValueError) as exc:
        raise _fail(exc) from exc
    return root, result.message.seq, result.triggered


def _wait_for_replies(chat: _Chat, sent_seq: int, wait: float, as_json: bool) -> int:
    """Print what the run stores after message ``sent_seq``; 0 if the run succeeded."""
    assistant = chat.assistant_name()
    deadline = time.monotonic() + wait
    after = sent_seq
    while time.monotonic() < deadline:
        after = _print_replies(chat, after, assistant, as_json)
        done = chat.finished_run(sent_seq)
        if done:
            _print_replies(chat, after, assistant, as_json)
            run_id, state, seconds = done
            click.echo(f"run {run_id[:8]} {state} in {seconds:.2f}s", err=True)
            return 0 if state == "succeeded" else EXIT_RUN_FAILED
        time.sleep(0.1)
    click.secho(f"no finished run after {wait:.0f}s (is a worker running?)", fg="yellow", err=True)
    return EXIT_NO_RUN


def _print_replies(chat: _Chat, after: int, assistant: str, as_json: bool) -> int:
    """Print the agent's and the host's messages after ``after``; the last seq seen."""
    from orchestrator.model.render import render_text

    for m in chat.messages_after(after):
        after = m.seq
        if not (m.is_from_me or m.message_type == "host"):
            continue  # other people's messages are not replies
        # JSON lines in ASCII (every control, C1 and bidi character a \u escape); text lines escaped.
        click.echo(
            json.dumps(m.model_dump(mode="json"))
            if as_json
            else for_terminal(f"[{m.message_type}] {render_text(m, assistant)}")
        )
    return after


def _fail(exc: Exception) -> click.exceptions.Exit:
    """Print ``exc`` as a one-line error; raise the returned Exit (status 1)."""
    click.secho(for_terminal(f"error: {exc}"), fg="red", err=True)
    return click.exceptions.Exit(1)
