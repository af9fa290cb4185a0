"""``orchestrator chat CHAT_JID``: an interactive terminal chat.

What you type is ingested like any channel's message; everything the group's
display view gains (replies, tool results, host messages, other people's
messages from other channels) is printed as it is stored, rendered by type,
with the run's state (queued, running, done, failed) as it changes.  While
a run's model writes its reply, the new text is printed as it comes
(``✎`` lines: what the run's draft grew by, orchestrator/store/draft_feed.py;
a draft that starts over is printed whole); the stored reply follows whole.
The terminal reads the database, so it sees exactly what every other channel
sees; it reads when the chat's wake-up comes (orchestrator/store/chat_listener.py,
as the API's event stream does) and at the latest every
``ORCHESTRATOR_STREAM_SAFETY_POLL_S``.

On a terminal the prompt stays at the bottom while messages print above it
(prompt_toolkit); with piped stdin it reads lines until EOF, for scripts.
Lines starting with ``/`` are commands: ``/quit``, ``/history``, ``/edit
#SEQ TEXT``, ``/regenerate #SEQ``, ``/file PATH [TEXT]`` (send a file of this
machine with the words after it; a path with spaces in quotes), ``/help``.  A file
the agent sends is saved in the downloads folder (``--downloads``, ``./downloads``:
names made safe, nothing replaced) and the line says where.

Every line printed has its control characters shown as escapes
(``orchestrator/core/terminal.py``): a message, a draft or an error naming
them cannot write the clipboard, erase lines or reorder text on the terminal.
"""

from __future__ import annotations

import functools
import logging
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.cli.local_files import open_local_file, save_download
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import human_size
from orchestrator.core.terminal import for_terminal
from orchestrator.model.envelopes import files_of
from orchestrator.model.messages import StoredMessage
from orchestrator.model.parts import RECORD_KINDS
from orchestrator.model.render import render_text
from orchestrator.run.ingest import IncomingMessage, Signal, ingest
from orchestrator.store.chat_listener import Subscription, listen
from orchestrator.store.db import Database
from orchestrator.store.draft_feed import DraftFeed
from orchestrator.store.file_refs import file_envelope
from orchestrator.store.files import FileStore, chunks_of
from orchestrator.store.groups import find_group
from orchestrator.store.history import edit_message, regenerate
from orchestrator.store.message_log import get_messages_after, get_recent_messages, resolve_message
from orchestrator.store.runs import FINAL_STATES, list_runs

log = logging.getLogger(__name__)

# How often a piped chat looks whether the agent is done, after its input ended.
LINGER_POLL_S = 0.2
BACKLOG = 20
RUN_MARKS = {
    "queued": "⏳ queued",
    "running": "⚙️ running",
    "succeeded": "✔ done",
    "awaiting_answer": "❓ awaiting an answer",
    "failed": "✖ failed",
    "timed_out": "✖ timed out",
    "cancelled": "🛑 cancelled",
}
HELP = "commands: /history  /edit #SEQ TEXT  /regenerate #SEQ  /file PATH [TEXT]  /quit"

Print = Callable[[str], None]


def format_line(m: StoredMessage, assistant: str) -> str:
    return for_terminal(f"#{m.seq} {render_text(m, assistant)}")


def escaping(out: Print) -> Print:
    """``out``, printing every line with its control characters escaped."""
    return lambda s: out(for_terminal(s))


class Follower:
    """Prints what the chat gains, and run state changes, from a background thread: when
    the chat's wake-up comes (``ORCHESTRATOR_STREAM_WAKEUP=push``), and at the latest every
    ``ORCHESTRATOR_STREAM_SAFETY_POLL_S``."""

    def __init__(
        self, db: Database, settings: Settings, jid: str, out: Print, after: int, downloads: Path | None = None
    ) -> None:
        self.db, self.settings, self.jid, self.out = db, settings, jid, escaping(out)
        self.after = after
        self.downloads = downloads
        self.assistant = settings.assistant_name
        group = find_group(db, jid)
        if group is not None and group.assistant_name:
            self.assistant = group.assistant_name
        self._run_states: dict[str, str] = {
            r.id: r.state for r in list_runs(db, chat_jid=jid, limit=20, chat_runs_only=True)
        }
        self._drafts = DraftFeed(db, jid, "append")
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._subscription: Subscription | None = None
        self._thread = threading.Thread(target=self._loop, name="chat-follower", daemon=True)

    def start(self) -> None:
        if self.settings.api.stream_wakeup == "push":
            # Before the first look: a change committed after it wakes the follower.
            self._subscription = listen(self.db, self.jid, self._woken.set)
        self._woken.set()  # a first look at once
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._woken.set()
        self._thread.join(timeout=2)
        if self._subscription is not None:
            self._subscription.close()

    def poll(self) -> None:
        for m in get_messages_after(self.jid, self.after, db=self.db):
            self.after = m.seq
            if m.part.kind not in RECORD_KINDS:
                self.out(format_line(m, self.assistant))
                if m.is_from_me and self.downloads is not None:
                    self._save_files(m)
        for run in reversed(list_runs(self.db, chat_jid=self.jid, limit=5, chat_runs_only=True)):
            if self._run_states.get(run.id) != run.state:
                self._run_states[run.id] = run.state
                self.out(f"   [{RUN_MARKS.get(run.state, run.state)} · run {run.id[:8]}]")
        if "running" in self._run_states.values() or self._drafts.following:
            self._print_drafts()

    def _save_files(self, m: StoredMessage) -> None:
        """The files the agent's message carries, saved in the downloads folder."""
        files = files_of(m.metadata)
        if files is None or self.downloads is None:
            return
        store = FileStore.from_settings(self.db, self.settings)
        for ref in files.files:
            try:
                stored = store.get(ref.id, self.jid)
                path = save_download(self.downloads, stored.name, functools.partial(store.write_to, stored))
            except (OrchestratorError, OSError) as exc:
                self.out(f"   [could not save {ref.name}: {exc}]")
                continue
            self.out(f"   [saved {ref.name} ({ref.mime}, {human_size(ref.size)}) to {path}]")

    def _print_drafts(self) -> None:
        """What the running runs' drafts gained since the last look (a new draft, or one that
        starts over: all of it)."""
        for piece in self._drafts.changes():
            if piece.text.strip():
                self.out(f"   ✎ {piece.text.strip()}")

    def _loop(self) -> None:
        while True:
            self._woken.wait(self.settings.api.stream_safety_poll_s)
            self._woken.clear()  # a wake-up during the look makes one more
            if self._stop.is_set():
                return
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - keep following; say what happened
                log.warning("chat %s: could not read new messages: %s", self.jid, exc)
                self.out(f"   [could not read the chat: {exc}]")


def handle_line(
    line: str,
    *,
    db: Database,
    settings: Settings,
    jid: str,
    sender: str,
    out: Print,
    signal: Signal,
) -> bool:
    """Act on one typed line; False means quit."""
    out = escaping(out)
    text = line.rstrip("\n")
    if not text.strip():
        return True
    try:
        if text.startswith("/"):
            cmd, _, rest = text.partition(" ")
            if cmd in ("/quit", "/exit"):
                return False
            if cmd == "/help":
                out(HELP)
            elif cmd == "/history":
                for m in get_recent_messages(jid, BACKLOG, db=db):
                    out(format_line(m, settings.assistant_name))
            elif cmd == "/edit":
                ref, _, new_text = rest.partition(" ")
                msg = resolve_message(jid, ref, db=db)
                edit_message(db, settings, jid, msg.id, new_text, rerun=True, signal=signal)
                out(f"   [edited #{msg.seq}; the agent answers again]")
            elif cmd == "/file":
                send_file(db, settings, jid, sender, rest, signal=signal, out=out)
            elif cmd == "/regenerate":
                msg = resolve_message(jid, rest.strip(), db=db)
                regenerate(db, settings, jid, msg.id, signal=signal)
                out(f"   [regenerating #{msg.seq}]")
            else:
                out(f"   [unknown command {cmd}; {HELP}]")
            return True
        result = ingest(
            db, settings, IncomingMessage(chat_jid=jid, sender=sender, sender_name=sender, content=text), signal=signal
        )
        if not result.triggered:
            out("   [stored; it does not wake the agent (no trigger, or not a registered group)]")
    except (OrchestratorError, ValueError) as exc:
        out(f"   [error: {exc}]")
    return True


def send_file(
    db: Database, settings: Settings, jid: str, sender: str, rest: str, *, signal: Signal, out: Print
) -> None:
    """``/file PATH [TEXT]``: the file stored for the chat, then a message naming it with the
    words; if the message is refused, the file is taken back."""
    words = shlex.split(rest)
    if not words:
        raise ValueError("/file needs a path: /file PATH [TEXT]")
    local = open_local_file(words[0])
    store = FileStore.from_settings(db, settings)
    with local.file:
        stored = store.store(jid, chunks_of(local.file), local.name)
    try:
        result = ingest(
            db,
            settings,
            IncomingMessage(
                chat_jid=jid,
                sender=sender,
                sender_name=sender,
                content=" ".join(words[1:]),
                metadata=file_envelope([stored]),
            ),
            signal=signal,
        )
    except BaseException:
        store.discard([stored])
        raise
    out(f"   [sent {stored.name} ({stored.mime}, {human_size(stored.size)}) as #{result.message.seq}]")


def _idle(db: Database, jid: str) -> bool:
    """No work pending for the chat and no run in flight."""
    group = find_group(db, jid)
    if group is not None and group.pending_seq > group.cursor_seq:
        return False
    return all(r.state in FINAL_STATES for r in list_runs(db, chat_jid=jid, limit=5, chat_runs_only=True))


def run_chat(
    db: Database,
    settings: Settings,
    jid: str,
    sender: str,
    *,
    signal: Signal,
    linger_s: float = 0.0,
    downloads: Path | None = None,
) -> int:
    """Chat until /quit or EOF; with piped input, keep following up to
    ``linger_s`` seconds after EOF until the agent has nothing left to do."""
    if find_group(db, jid) is None:
        print(
            for_terminal(f"note: {jid} is not a registered group; messages are stored but never answered"),
            file=sys.stderr,
        )
    backlog = get_recent_messages(jid, BACKLOG, db=db)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    if interactive:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.patch_stdout import patch_stdout

        def out(s: str) -> None:
            print(for_terminal(s), flush=True)

        for m in backlog:
            out(format_line(m, settings.assistant_name))
        follower = Follower(db, settings, jid, out, backlog[-1].seq if backlog else 0, downloads)
        session: PromptSession[str] = PromptSession(f"{sender}> ")
        with patch_stdout(raw=True):
            follower.start()
            try:
                while True:
                    try:
                        line = session.prompt()
                    except KeyboardInterrupt:
                        continue
                    except EOFError:
                        break
                    if not handle_line(line, db=db, settings=settings, jid=jid, sender=sender, out=out, signal=signal):
                        break
            finally:
                follower.stop()
        return 0

    lock = threading.Lock()

    def out_locked(s: str) -> None:
        with lock:
            sys.stdout.write(for_terminal(s) + "\n")
            sys.stdout.flush()

    for m in backlog:
        out_locked(format_line(m, settings.assistant_name))
    follower = Follower(db, settings, jid, out_locked, backlog[-1].seq if backlog else 0, downloads)
    follower.start()
    try:
        for line in sys.stdin:
            if not handle_line(line, db=db, settings=settings, jid=jid, sender=sender, out=out_locked, signal=signal):
                break
        deadline = time.monotonic() + linger_s
        time.sleep(min(linger_s, 2 * LINGER_POLL_S))  # let a just-sent message reach a worker
        while time.monotonic() < deadline and not _idle(db, jid):
            time.sleep(LINGER_POLL_S)
    finally:
        follower.stop()
    follower.poll()  # anything stored in the last moments
    return 0
