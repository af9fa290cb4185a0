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

**Files** (issue 31).  ``--file PATH`` (repeatable): every path is opened and checked
first (it exists, is a regular file, can be read; at most the files one message may
carry), so a wrong one is an error before anything is sent.  Then the files are uploaded
to the chat in one request (``POST /api/chats/{chat_jid}/files``, streamed; refused
whole, nothing kept, when one is over a limit) or, without an API, stored in process
(and taken back if the message is refused), and the message carries them as a FILE
envelope (beside ``--metadata``'s keys, which may then not be an envelope of their own).
With ``--wait``, the files of a reply are saved in ``--downloads`` (``./downloads``),
each under its name made safe (``store/file_names.py``: ``safe_name``), numbered when taken
(``name (2).ext``; created with ``O_EXCL``, never replacing a file, never following a
link), and each saved path is printed.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

import click

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal

if TYPE_CHECKING:
    from orchestrator.cli.api_client import ApiClient, Upload
    from orchestrator.core.settings import Settings
    from orchestrator.model.envelopes import FileRef
    from orchestrator.model.messages import StoredMessage
    from orchestrator.root import Orchestrator
    from orchestrator.store.file_rows import StoredFile

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

    def download(self, file_id: str, write: Callable[[bytes], object]) -> int:
        """Hand the bytes of the chat's file ``file_id`` to ``write``; how many there were."""
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

    def download(self, file_id: str, write: Callable[[bytes], object]) -> int:
        from orchestrator.store.files import FileStore

        files = FileStore.from_settings(self.root.db, self.root.settings)
        return files.write_to(files.get(file_id, self.chat_jid), write)


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

    def download(self, file_id: str, write: Callable[[bytes], object]) -> int:
        return self.client.download(f"/api/files/{self.client.quote(file_id)}", write)


# The run states that end a run, and those of them that are its answer (store.runs.FINAL_STATES
# and GOOD_ENDS; not imported here: that module pulls SQLAlchemy).  tests/host/test_send.py
# holds each pair equal.
_FINAL_STATES = frozenset({"succeeded", "awaiting_answer", "failed", "timed_out", "cancelled"})
_GOOD_ENDS = frozenset({"succeeded", "awaiting_answer"})


@click.command(
    "send",
    help="Store TEXT as a user message in chat CHAT_JID (and wake the agent if it should).\n\n"
    "With a running installation's API (announced by `orchestrator up`/`api` in the data dir, or "
    "ORCHESTRATOR_API_URL) the message goes through it; otherwise it is stored in process. "
    f"--wait exits 0 when the run succeeded, {EXIT_RUN_FAILED} when it did not, "
    f"{EXIT_NO_RUN} when no run finished in time. --file sends files with the message (repeat it for "
    "several); with --wait, the files of the replies are saved in --downloads.",
)
@click.argument("chat_jid", metavar="CHAT_JID")
@click.argument("text")
@click.option("--sender", default="cli-user", show_default=True, help="Sender name.")
@click.option(
    "--wait", type=float, default=0, show_default=True, help="Seconds to wait for the run and print replies (0: don't)."
)
@click.option("--json", "as_json", is_flag=True, help="Print replies as JSON lines.")
@click.option("--metadata", default=None, help="Metadata JSON object, e.g. '{\"context\": [...]}'.")
@click.option(
    "--file",
    "file_paths",
    multiple=True,
    metavar="PATH",
    help="A file to send with the message (repeatable); checked before anything is sent.",
)
@click.option(
    "--downloads",
    default="downloads",
    show_default=True,
    metavar="DIR",
    help="With --wait: where the replies' files are saved (made if missing; never overwriting).",
)
def send_command(
    chat_jid: str,
    text: str,
    sender: str,
    wait: float,
    as_json: bool,
    metadata: str | None,
    file_paths: tuple[str, ...],
    downloads: str,
) -> None:
    from orchestrator.core.settings import Settings

    try:
        settings = Settings.load()
        meta = None if metadata is None else json.loads(metadata)
    except (OrchestratorError, ValueError) as exc:
        raise _fail(exc) from exc
    uploads = _open_files(file_paths, meta) if file_paths else []
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
    try:
        sent = _send_to_api(settings, body, uploads)
        if sent is not None:
            client, seq, triggered = sent
            chat = _ApiChat(client, settings, chat_jid)
        else:
            root, seq, triggered = _store_in_process(body, uploads)
            chat = _LocalChat(root, chat_jid)
    finally:
        for upload in uploads:
            upload.file.close()
    if wait <= 0 or not triggered:
        return
    try:
        code = _wait_for_replies(chat, seq, wait, as_json, Path(downloads))
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    sys.exit(code)


def _open_files(paths: Sequence[str], meta: Any) -> list[Upload]:
    """Every ``--file``, opened and checked before anything is sent (see the module's doc)."""
    from agent_runner.protocol import ENVELOPE_KEYS, MAX_FILES_PER_MESSAGE

    if len(paths) > MAX_FILES_PER_MESSAGE:
        raise _fail(ValueError(f"{len(paths)} files: a message carries at most {MAX_FILES_PER_MESSAGE}"))
    if meta is not None and (not isinstance(meta, dict) or set(ENVELOPE_KEYS) & set(meta)):
        raise _fail(ValueError("with --file, --metadata is an object of extra keys, not an envelope of its own"))
    opened: list[Upload] = []
    try:
        for path in paths:
            opened.append(_open_file(path))
    except BaseException:
        for upload in opened:
            upload.file.close()
        raise
    return opened


def _open_file(path: str) -> Upload:
    from orchestrator.cli.local_files import open_local_file

    try:
        return open_local_file(path)
    except ValueError as exc:
        raise _fail(ValueError(f"--file {exc}; nothing was sent")) from None


def _file_metadata(files: Sequence[dict[str, Any]], meta: Any) -> dict[str, Any]:
    """The message's metadata naming ``files`` (the store's answers) in a FILE envelope, beside
    ``meta``'s keys.  Ingest checks that each is the chat's and takes their details from the store."""
    from agent_runner.protocol import FILE

    refs = [{"id": f["id"], "name": f["name"], "mime": f["mime"], "size": f["size"]} for f in files]
    return {**(meta or {}), "message_type": FILE, "version": 1, "payload": {"files": refs}}


def _said_stored(chat_jid: str, seq: int, triggered: bool, where: str) -> None:
    # Said once the message is committed, before any reply: on its own line.
    click.echo(
        for_terminal(f"stored #{seq} in {chat_jid}{where}" + ("" if triggered else " (does not wake the agent)")),
        err=True,
    )


def _send_to_api(
    settings: Settings, body: _MessageBody, uploads: Sequence[Upload] = ()
) -> tuple[ApiClient, int, bool] | None:
    """Upload the files and POST the message to the installation's API; None: store them
    in process instead."""
    from orchestrator.cli.api_client import ApiClient
    from orchestrator.core.errors import ApiRefused, ApiUnreachable
    from orchestrator.http.endpoint import find

    endpoint = find(settings)
    if endpoint is None:
        return None
    client = ApiClient(endpoint)
    try:
        if uploads:
            files = client.upload(f"/api/chats/{client.quote(body['chat_jid'])}/files", uploads)
            body["metadata"] = _file_metadata(files, body.get("metadata"))
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


def _store_in_process(body: _MessageBody, uploads: Sequence[Upload] = ()) -> tuple[Orchestrator, int, bool]:
    from orchestrator.cli.support import setup
    from orchestrator.run.ingest import IncomingMessage, ingest

    root = setup()

    def stored(msg: StoredMessage, wakes: bool) -> None:
        _said_stored(msg.chat_jid, msg.seq, wakes, "")

    kept: list[StoredFile] = []
    try:
        if uploads:
            kept = _store_files(root, body["chat_jid"], uploads)
            files = [{"id": f.id, "name": f.name, "mime": f.mime, "size": f.size} for f in kept]
            body["metadata"] = _file_metadata(files, body.get("metadata"))
        result = ingest(
            root.db,
            root.settings,
            IncomingMessage(**body),
            signal=root.signals.group,
            signal_delivery=root.signals.delivery,
            on_stored=stored,
        )
    except (OrchestratorError, ValueError) as exc:
        if kept:
            from orchestrator.store.files import FileStore

            FileStore.from_settings(root.db, root.settings).discard(kept)  # no message names them
        raise _fail(exc) from exc
    return root, result.message.seq, result.triggered


def _store_files(root: Orchestrator, chat_jid: str, uploads: Sequence[Upload]) -> list[StoredFile]:
    """Store the files in the file store of ``root``, as the upload route does: the chat must
    be a registered group's, and a file over a limit keeps none of them."""
    from orchestrator.core.errors import UnknownGroup
    from orchestrator.store.files import FileStore, chunks_of
    from orchestrator.store.groups import is_registered

    if not is_registered(root.db, chat_jid):
        raise UnknownGroup(chat_jid)
    files = FileStore.from_settings(root.db, root.settings)
    kept: list[StoredFile] = []
    try:
        for upload in uploads:
            upload.file.seek(0)
            kept.append(files.store(chat_jid, chunks_of(upload.file), upload.name))
    except BaseException:
        files.discard(kept)
        raise
    return kept


def _wait_for_replies(chat: _Chat, sent_seq: int, wait: float, as_json: bool, downloads: Path) -> int:
    """Print what the run stores after message ``sent_seq`` (saving its files in ``downloads``);
    0 if the run succeeded."""
    assistant = chat.assistant_name()
    deadline = time.monotonic() + wait
    after = sent_seq
    while time.monotonic() < deadline:
        after = _print_replies(chat, after, assistant, as_json, downloads)
        done = chat.finished_run(sent_seq)
        if done:
            _print_replies(chat, after, assistant, as_json, downloads)
            run_id, state, seconds = done
            click.echo(f"run {run_id[:8]} {state} in {seconds:.2f}s", err=True)
            # A question asked is an answer of the run's: the question was printed above.
            return 0 if state in _GOOD_ENDS else EXIT_RUN_FAILED
        time.sleep(0.1)
    click.secho(f"no finished run after {wait:.0f}s (is a worker running?)", fg="yellow", err=True)
    return EXIT_NO_RUN


def _print_replies(chat: _Chat, after: int, assistant: str, as_json: bool, downloads: Path | None = None) -> int:
    """Print the agent's and the host's messages after ``after`` (and save their files in
    ``downloads``); the last seq seen."""
    from orchestrator.model.envelopes import files_of
    from orchestrator.model.render import render_text

    for m in chat.messages_after(after):
        after = m.seq
        if not (m.is_from_me or m.part.kind == "host_note"):
            continue  # other people's messages are not replies
        # JSON lines in ASCII (every control, C1 and bidi character a \u escape); text lines escaped.
        click.echo(
            json.dumps(m.model_dump(mode="json"))
            if as_json
            else for_terminal(f"[{m.message_type}] {render_text(m, assistant)}")
        )
        if downloads is not None:
            files = files_of(m.metadata)
            for ref in files.files if files is not None else ():
                _save_reply_file(chat, ref, downloads, as_json)
    return after


def _save_reply_file(chat: _Chat, ref: FileRef, downloads: Path, as_json: bool) -> None:
    """Save a reply's file in ``downloads`` and say where (a failure is said, and the rest goes on)."""
    from orchestrator.core.errors import ApiRefused, ApiUnreachable, NotFound, StoreError
    from orchestrator.core.sizes import human_size

    def fetch(write: Callable[[bytes], object]) -> int:
        got = chat.download(ref.id, write)
        if got != ref.size:
            raise OSError(f"{got} bytes came, not the {ref.size} stored")
        return got

    from orchestrator.cli.local_files import save_download

    try:
        path = save_download(downloads, ref.name, fetch)
    except (OSError, ApiRefused, ApiUnreachable, NotFound, StoreError) as exc:
        click.secho(for_terminal(f"could not save {ref.name}: {exc}"), fg="yellow", err=True)
        return
    click.echo(for_terminal(f"[file] saved {ref.name} ({ref.mime}, {human_size(ref.size)}) to {path}"), err=as_json)


def _fail(exc: Exception) -> click.exceptions.Exit:
    """Print ``exc`` as a one-line error; raise the returned Exit (status 1)."""
    click.secho(for_terminal(f"error: {exc}"), fg="red", err=True)
    return click.exceptions.Exit(1)
