"""A chat's live event stream: server-sent events for the HTTP API and the web page.

``GET /api/chats/{chat_jid}/stream?after=SEQ&drafts=whole|append`` sends, as they are committed:

* ``event: message`` (``id:`` the seq) with the :class:`StoredMessage` JSON of
  each new message of the display view (superseded ones are left out, host
  messages are in);
* ``event: run`` with the :class:`Run` JSON of the chat's newest run when the
  stream opens, then of every run that appears or changes state or attempt;
* ``event: reset`` when the history changed in place (an edit, a regenerate,
  a truncate): the client drops what it shows (drafts too) and the stream sends
  the whole display view again from seq 0 on the same connection, and the
  drafts whole;
* ``event: reaction`` with a :class:`~orchestrator.store.reactions.Reaction` JSON
  (``{"id", "message_seq", "emoji", "sender", ...}``): an emoji put on a message, each
  once, every one of the chat's when the stream opens and after a ``reset``; the message
  it is on may come later in the stream (a long history's next page);
* ``event: draft`` with ``{"run_id", "offset", "text"}`` (a
  :class:`~orchestrator.store.draft_feed.DraftPiece`): the reply a running run's
  model is writing (orchestrator/store/drafts.py; the worker writes it at most every
  100 ms, less often as it grows, orchestrator/run/live_draft.py).  The client keeps
  the first ``offset`` characters (Unicode code points) of what it shows for the run
  and puts ``text`` after them: with ``drafts=append`` the stream sends what the draft
  grew by, at the length the client has, and the whole text at offset 0 when the
  draft starts (or starts over: a reply stored and the next begun, a new attempt);
  with ``drafts=whole`` (the default, for a client that reads only ``text``) every
  event is the whole text at offset 0.  It is never a message: when the reply is
  stored it arrives as a ``message`` (its ``metadata.run_id`` names the run) and the
  client shows that instead; offset 0 with ``"text": ""`` says the draft is gone
  (stored, or the run ended) and whatever the client showed for it goes.

The stream looks when it is woken (``ORCHESTRATOR_STREAM_WAKEUP=push``, the default): a
stored message, a draft written or dropped, a run created or changed, a history change
wakes the chat's open streams once committed (orchestrator/store/chat_wakeups.py, heard
by the process's one listener, orchestrator/store/chat_listener.py), and at the latest
every ``ORCHESTRATOR_STREAM_SAFETY_POLL_S`` (2 s), which catches a wake-up that was lost.
Wake-ups that come while it looks make one more look, and it looks at most every
:data:`MIN_LOOK_S`, however many come.

The seq cursor is the one the pipeline uses (commit order, never a timestamp),
so nothing is skipped or sent twice.  Each look is a few short read
transactions (no transaction stays open while the stream waits): ``max(seq)``
of the chat (an index lookup on ``(chat_jid, seq)``) and the chat's live runs;
messages are read only when ``max(seq)`` moved; drafts (by primary key and
the chat's index) only while the chat has a live run, their versions on each
look and a draft's text only when its version moved.  In-place changes are looked
for at most once a second (``max(superseded_at)``, ``max(edited_at)`` of the chat),
and at once after a wake-up that nothing else explained.  A
comment line (``: keepalive``) every 15 s keeps proxies from closing an idle
stream; a browser's ``EventSource`` reconnects by itself with
``Last-Event-ID`` (the last seq), after the ``retry:`` the stream opens with.

The framing, the keep-alive pings, the client's disconnect and the server's
shutdown are sse-starlette's (:func:`event_stream`).  Chosen over FastAPI's own
SSE support (``fastapi.sse``, new in 0.135): that one frames and pings only
for generator path operations (the 404 and the cursor checks would have to
move into dependencies), pings on a fixed private 15 s timer, and knows
nothing of shutdown, so an open stream holds uvicorn until its
graceful-shutdown timeout (3 s, ``orchestrator/cli/supervisor.py``) cancels
it mid-response.  sse-starlette (a dedicated, maintained SSE library for
Starlette and FastAPI) notices uvicorn's exit within half a second and sets
the stream's shutdown event; the loop below wakes on it and returns, so the
response ends complete long before that timeout.  A client's disconnect
cancels the loop at once (no polling of ``request.is_disconnected``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from orchestrator.store.chat_listener import listen
from orchestrator.store.db import Database
from orchestrator.store.draft_feed import DraftFeed, DraftMode
from orchestrator.store.message_log import change_marks, get_messages_after, latest_seq
from orchestrator.store.reactions import reactions_after
from orchestrator.store.runs import LIVE_STATES, get_run, list_runs, runs_changed

log = logging.getLogger(__name__)

PAGE = 200
KEEPALIVE_S = 15.0
HISTORY_CHECK_S = 1.0
RETRY_MS = 2000
ERROR_PAUSE_S = 1.0
# The shortest time from one look to the next, however many wake-ups come: a chat with
# several runs writing drafts costs each open stream at most 50 looks a second.
MIN_LOOK_S = 0.02
# After the server starts to exit: how long the stream may take to end by
# itself before sse-starlette cancels it.  It ends at once (the wait below
# wakes on the shutdown event); well under uvicorn's 3 s timeout.
SHUTDOWN_GRACE_S = 1.0
SEP = "\n"  # line ends on the wire (sse-starlette's default is CRLF)


def sse(event: str, data: str, *, id: int | None = None) -> ServerSentEvent:
    """One server-sent event (``data`` is one line, as JSON is)."""
    return ServerSentEvent(data, event=event, id=None if id is None else str(id), sep=SEP)


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keepalive", sep=SEP)


def event_stream(
    db: Database,
    chat_jid: str,
    after: int,
    *,
    safety_poll_s: float,
    push: bool,
    drafts: DraftMode = "whole",
) -> EventSourceResponse:
    """The response of ``GET /api/chats/{jid}/stream`` for a checked chat and cursor.

    Called in the request's event loop (the shutdown event belongs to it)."""
    shutdown = anyio.Event()
    return EventSourceResponse(
        ChatStream(db, chat_jid, after, drafts=drafts).events(shutdown, safety_poll_s=safety_poll_s, push=push),
        ping=KEEPALIVE_S,  # read per response: tests shorten it
        ping_message_factory=_keepalive,
        sep=SEP,
        shutdown_event=shutdown,
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )


class _Bell:
    """What the stream's loop waits on: a wake-up of its chat (rung from the listener's
    thread) or the server's shutdown."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def ring(self) -> None:
        self._event.set()

    def ring_threadsafe(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:
            pass  # the loop is closed: the stream is over

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout_s: float) -> bool:
        """Whether it rang within ``timeout_s``."""
        with anyio.move_on_after(timeout_s):
            await self._event.wait()
            return True
        return False


async def _ring_on(shutdown: anyio.Event, bell: _Bell) -> None:
    await shutdown.wait()
    bell.ring()


class ChatStream:
    """The state of one client's stream: cursor, runs seen, history baseline, drafts sent."""

    def __init__(self, db: Database, chat_jid: str, after: int, *, drafts: DraftMode = "whole") -> None:
        self.db = db
        self.chat_jid = chat_jid
        self.cursor = after
        self._runs: dict[str, tuple[str, int]] = {}  # run id -> (state, attempts) last sent
        self._live: set[str] = set()
        self._newest_run: datetime | None = None
        self._history: tuple[Any, Any] | None = None
        self._history_checked = 0.0
        self._started = False
        self._drafts = DraftFeed(db, chat_jid, drafts)
        self._reactions = 0  # the id of the last reaction sent
        self._reactions_behind = False
        # Messages past the cursor wait beyond the page just sent (up to ``_latest``).
        self.behind = False
        self._latest = after

    # -- one look (synchronous: runs in a worker thread) -------------------

    def poll(self, woken: bool = False) -> list[ServerSentEvent]:
        """What changed since the last look.  ``woken``: a wake-up came for the chat; if
        nothing else changed, it was a change of the history in place, looked for at once."""
        frames: list[ServerSentEvent] = []
        history_checked = False
        if not self._started:
            self._started = True
            self._history = self._history_marks()
            self._history_checked = time.monotonic()
            history_checked = True
            newest = list_runs(self.db, chat_jid=self.chat_jid, limit=1)
            if newest:
                frames.append(self._run_frame(newest[0].id))
        elif time.monotonic() - self._history_checked >= HISTORY_CHECK_S:
            frames += self._history_reset()
            history_checked = True
        frames += self._new_messages()
        frames += self._changed_runs()
        frames += self._draft_changes()
        if woken and not frames and not history_checked:
            reset = self._history_reset()
            if reset:
                frames = reset + self._new_messages() + self._draft_changes()
        if woken or history_checked or self._reactions_behind or any(f.event == "reset" for f in frames):
            # A reaction wakes the chat; without a wake-up the history check's cadence looks.
            frames += self._new_reactions()
        return frames

    def _new_reactions(self) -> list[ServerSentEvent]:
        """One page of reactions past the last sent; a full page looks again at once."""
        found = reactions_after(self.db, self.chat_jid, self._reactions, limit=PAGE)
        self._reactions_behind = len(found) == PAGE
        if found:
            self._reactions = found[-1].id
        return [sse("reaction", r.model_dump_json()) for r in found]

    def _history_reset(self) -> list[ServerSentEvent]:
        """A ``reset`` when the history changed in place since the last check (the client
        then drops what it shows: the messages follow from seq 0, the drafts whole)."""
        self._history_checked = time.monotonic()
        marks = self._history_marks()
        if marks == self._history:
            return []
        self._history = marks
        self.cursor, self.behind = 0, False
        self._reactions = 0
        self._drafts.forget()
        return [sse("reset", '{"reason": "history changed"}')]

    def _draft_changes(self) -> list[ServerSentEvent]:
        if not self._live and not self._drafts.following:
            return []  # no run writes a reply now: no read
        return [sse("draft", piece.model_dump_json()) for piece in self._drafts.changes()]

    def _history_marks(self) -> tuple[Any, Any]:
        return change_marks(self.db, self.chat_jid)

    def _new_messages(self) -> list[ServerSentEvent]:
        """At most one page of the display view past the cursor; ``behind`` says more
        is waiting, and the next look follows at once.  A stream opened at seq 0 of a
        long chat (any client may ask for one) so holds one page in memory, never the
        whole history: built all at once, its frames grew the API's memory with every
        chat's length (the soak, docs/performance.md)."""
        if not self.behind:
            latest = latest_seq(self.db, self.chat_jid)
            if latest is None or latest <= self.cursor:
                return []
            self._latest = latest
        page = get_messages_after(self.chat_jid, self.cursor, limit=PAGE, db=self.db)
        frames = []
        for m in page:
            frames.append(sse("message", m.model_dump_json(), id=m.seq))
            self.cursor = m.seq
        self.behind = len(page) == PAGE and self.cursor < self._latest
        if not self.behind:
            # Every row up to ``latest`` is committed (seq order is commit order), so
            # after the last page the cursor may jump to it even if the newest rows
            # were superseded meanwhile.
            self.cursor = max(self.cursor, self._latest)
        return frames

    def _changed_runs(self) -> list[ServerSentEvent]:
        rows = runs_changed(self.db, self.chat_jid, live=self._live, since=self._newest_run)
        frames = []
        for run_id, state, attempts, created_at in sorted(rows, key=lambda r: r[3]):
            if self._newest_run is None or created_at > self._newest_run:
                self._newest_run = created_at
            if state in LIVE_STATES:
                self._live.add(run_id)
            else:
                self._live.discard(run_id)
            if self._runs.get(run_id) != (state, attempts):
                frames.append(self._run_frame(run_id))
        return frames

    def _run_frame(self, run_id: str) -> ServerSentEvent:
        run = get_run(self.db, run_id)
        self._runs[run.id] = (run.state, run.attempts)
        if self._newest_run is None or run.created_at > self._newest_run:
            self._newest_run = run.created_at
        if run.state in LIVE_STATES:
            self._live.add(run.id)
        return sse("run", run.model_dump_json())

    # -- the response body ----------------------------------------------------

    async def events(
        self, shutdown: anyio.Event, *, safety_poll_s: float, push: bool
    ) -> AsyncIterator[ServerSentEvent]:
        """The stream's events until ``shutdown`` is set; a client's disconnect
        cancels it (at a wait, or after the look's thread is done).  With ``push`` it
        looks when woken, else (and at the latest) every ``safety_poll_s``."""
        yield ServerSentEvent(retry=RETRY_MS, sep=SEP)
        bell = _Bell()
        subscription = None
        ringer = asyncio.ensure_future(_ring_on(shutdown, bell))
        try:
            # Subscribed before the first look: a change committed after it wakes the stream.
            subscription = listen(self.db, self.chat_jid, bell.ring_threadsafe) if push else None
            woken = False
            while not shutdown.is_set():
                bell.clear()  # a wake-up during the look makes one more
                began = time.monotonic()
                pause = safety_poll_s
                try:
                    frames = await run_in_threadpool(self.poll, woken)
                    if self.behind or self._reactions_behind:
                        pause = 0  # the next page of a long history at once (each page a look)
                except Exception as exc:  # noqa: BLE001 - the database may be briefly away; keep the stream
                    log.warning("stream of %s: %s", self.chat_jid, exc)
                    frames = []
                    with anyio.move_on_after(ERROR_PAUSE_S):
                        await shutdown.wait()  # wake-ups do not hurry a look at a database that failed
                    pause = 0
                for frame in frames:
                    yield frame
                woken = pause > 0 and await bell.wait(pause)
                if woken and (rest := MIN_LOOK_S - (time.monotonic() - began)) > 0:
                    await anyio.sleep(rest)
        finally:
            if subscription is not None:
                subscription.close()
            ringer.cancel()
