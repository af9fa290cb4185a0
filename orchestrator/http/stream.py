"""A chat's live event stream: server-sent events for the HTTP API and the web page.

``GET /api/chats/{chat_jid}/stream?after=SEQ`` sends, as they are committed:

* ``event: message`` (``id:`` the seq) with the :class:`StoredMessage` JSON of
  each new message of the display view (superseded ones are left out, host
  messages are in);
* ``event: run`` with the :class:`Run` JSON of the chat's newest run when the
  stream opens, then of every run that appears or changes state or attempt;
* ``event: reset`` when the history changed in place (an edit, a regenerate,
  a truncate): the client drops what it shows and the stream sends the whole
  display view again from seq 0 on the same connection;
* ``event: draft`` with ``{"run_id", "text"}``: the reply a running run's
  model is writing, the whole text so far, each time it grew
  (orchestrator/store/drafts.py; the worker writes it at most every 100 ms, less
  often as it grows: about 64 KiB a second per run at most, and a bounded total,
  orchestrator/run/live_draft.py; the stream sends each version once, so no more).
  It is never a message: when the reply is stored it arrives as a
  ``message`` (its ``metadata.run_id`` names the run) and the client shows
  that instead; ``"text": ""`` says the draft is gone (stored, or the run
  ended) and whatever the client showed for it goes.

The seq cursor is the one the pipeline uses (commit order, never a timestamp),
so nothing is skipped or sent twice.  Each tick is a few short read
transactions (no transaction stays open while the stream waits): ``max(seq)``
of the chat (an index lookup on ``(chat_jid, seq)``) and the chat's live runs;
messages are read only when ``max(seq)`` moved; drafts (by primary key and
the chat's index) only while the chat has a live run, their versions on each
tick and a draft's text only when its version moved.  In-place changes are looked
for less often (``max(superseded_at)``, ``max(edited_at)`` of the chat).  A
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

import json
import logging
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from orchestrator.store.db import Database
from orchestrator.store.drafts import chat_draft_versions, drafts_of
from orchestrator.store.message_log import change_marks, get_messages_after, latest_seq
from orchestrator.store.runs import LIVE_STATES, get_run, list_runs, runs_changed

log = logging.getLogger(__name__)

PAGE = 200
KEEPALIVE_S = 15.0
HISTORY_CHECK_S = 1.0
RETRY_MS = 2000
ERROR_PAUSE_S = 1.0
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


def event_stream(db: Database, chat_jid: str, after: int, poll_s: float) -> EventSourceResponse:
    """The response of ``GET /api/chats/{jid}/stream`` for a checked chat and cursor.

    Called in the request's event loop (the shutdown event belongs to it)."""
    shutdown = anyio.Event()
    return EventSourceResponse(
        ChatStream(db, chat_jid, after).events(poll_s, shutdown),
        ping=KEEPALIVE_S,  # read per response: tests shorten it
        ping_message_factory=_keepalive,
        sep=SEP,
        shutdown_event=shutdown,
        shutdown_grace_period=SHUTDOWN_GRACE_S,
    )


class ChatStream:
    """The state of one client's stream: cursor, runs seen, history baseline."""

    def __init__(self, db: Database, chat_jid: str, after: int) -> None:
        self.db = db
        self.chat_jid = chat_jid
        self.cursor = after
        self._runs: dict[str, tuple[str, int]] = {}  # run id -> (state, attempts) last sent
        self._live: set[str] = set()
        self._newest_run: datetime | None = None
        self._history: tuple[Any, Any] | None = None
        self._history_checked = 0.0
        self._started = False
        self._drafts: dict[str, int] = {}  # run id -> draft version last sent
        # Messages past the cursor wait beyond the page just sent (up to ``_latest``).
        self.behind = False
        self._latest = after

    # -- one tick (synchronous: runs in a worker thread) -------------------

    def poll(self) -> list[ServerSentEvent]:
        frames: list[ServerSentEvent] = []
        if not self._started:
            self._started = True
            self._history = self._history_marks()
            self._history_checked = time.monotonic()
            newest = list_runs(self.db, chat_jid=self.chat_jid, limit=1)
            if newest:
                frames.append(self._run_frame(newest[0].id))
        elif time.monotonic() - self._history_checked >= HISTORY_CHECK_S:
            self._history_checked = time.monotonic()
            marks = self._history_marks()
            if marks != self._history:
                self._history = marks
                self.cursor, self.behind = 0, False
                frames.append(sse("reset", '{"reason": "history changed"}'))
        frames += self._new_messages()
        frames += self._changed_runs()
        frames += self._draft_changes()
        return frames

    def _draft_changes(self) -> list[ServerSentEvent]:
        if not self._live and not self._drafts:
            return []  # no run writes a reply now: no read
        current = chat_draft_versions(self.db, self.chat_jid)
        changed = [run_id for run_id, version in current.items() if self._drafts.get(run_id) != version]
        texts = drafts_of(self.db, changed)  # the text only of what changed: a big draft is not read each tick
        frames = []
        for run_id in changed:
            draft = texts.get(run_id)
            if draft is None:
                continue  # gone since the versions were read: the next tick says so
            self._drafts[run_id] = draft.version
            frames.append(sse("draft", json.dumps({"run_id": run_id, "text": draft.text})))
        for run_id in [r for r in self._drafts if r not in current]:
            del self._drafts[run_id]
            frames.append(sse("draft", json.dumps({"run_id": run_id, "text": ""})))
        return frames

    def _history_marks(self) -> tuple[Any, Any]:
        return change_marks(self.db, self.chat_jid)

    def _new_messages(self) -> list[ServerSentEvent]:
        """At most one page of the display view past the cursor; ``behind`` says more
        is waiting, and the next tick follows at once.  A stream opened at seq 0 of a
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

    async def events(self, poll_s: float, shutdown: anyio.Event) -> AsyncIterator[ServerSentEvent]:
        """The stream's events until ``shutdown`` is set; a client's disconnect
        cancels it (at a wait, or after the tick's thread is done)."""
        yield ServerSentEvent(retry=RETRY_MS, sep=SEP)
        while not shutdown.is_set():
            pause = poll_s
            try:
                frames = await run_in_threadpool(self.poll)
                if self.behind:
                    pause = 0  # the next page of a long history at once (each page a tick)
            except Exception as exc:  # noqa: BLE001 - the database may be briefly away; keep the stream
                log.warning("stream of %s: %s", self.chat_jid, exc)
                frames, pause = [], max(poll_s, ERROR_PAUSE_S)
            for frame in frames:
                yield frame
            with anyio.move_on_after(pause):
                await shutdown.wait()
