"""A chat's live event stream: server-sent events for the HTTP API and the web page.

``GET /api/chats/{jid}/stream?after=SEQ`` sends, as they are committed:

* ``event: message`` (``id:`` the seq) with the :class:`StoredMessage` JSON of
  each new message of the display view (superseded ones are left out, host
  messages are in);
* ``event: run`` with the :class:`Run` JSON of the chat's newest run when the
  stream opens, then of every run that appears or changes state or attempt;
* ``event: reset`` when the history changed in place (an edit, a regenerate,
  a truncate): the client drops what it shows and the stream sends the whole
  display view again from seq 0 on the same connection.

The seq cursor is the one the pipeline uses (commit order, never a timestamp),
so nothing is skipped or sent twice.  Each tick is a few short read
transactions (no transaction stays open while the stream waits): ``max(seq)``
of the chat (an index lookup on ``(chat_jid, seq)``) and the chat's live runs;
messages are read only when ``max(seq)`` moved.  In-place changes are looked
for less often (``max(superseded_at)``, ``max(edited_at)`` of the chat).  A
comment line every 15 s keeps proxies from closing an idle stream; a browser's
``EventSource`` reconnects by itself with ``Last-Event-ID`` (the last seq).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

from sqlalchemy import func, or_, select
from starlette.concurrency import run_in_threadpool

from orchestrator.store.db import Database
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import get_run, list_runs
from orchestrator.store.tables import MessageRow, RunRow

log = logging.getLogger(__name__)

LIVE_STATES = ("queued", "running")
PAGE = 200
KEEPALIVE_S = 15.0
HISTORY_CHECK_S = 1.0
RETRY_MS = 2000


def sse(event: str, data: str, *, id: int | None = None) -> str:
    """One server-sent event (``data`` must be a single line, as JSON is)."""
    head = f"event: {event}\n" + (f"id: {id}\n" if id is not None else "")
    return f"{head}data: {data}\n\n"


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

    # -- one tick (synchronous: runs in a worker thread) -------------------

    def poll(self) -> list[str]:
        frames: list[str] = []
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
                self.cursor = 0
                frames.append(sse("reset", '{"reason": "history changed"}'))
        frames += self._new_messages()
        frames += self._changed_runs()
        return frames

    def _history_marks(self) -> tuple[Any, Any]:
        with self.db.read() as session:
            row = session.execute(
                select(func.max(MessageRow.superseded_at), func.max(MessageRow.edited_at)).where(
                    MessageRow.chat_jid == self.chat_jid
                )
            ).one()
        return row[0], row[1]

    def _new_messages(self) -> list[str]:
        with self.db.read() as session:
            latest = session.scalar(select(func.max(MessageRow.seq)).where(MessageRow.chat_jid == self.chat_jid))
        if latest is None or latest <= self.cursor:
            return []
        frames = []
        # Every row up to ``latest`` is committed (seq order is commit order),
        # so after these pages the cursor may jump to it even if the newest
        # rows were superseded meanwhile.
        while True:
            page = get_messages_after(self.chat_jid, self.cursor, limit=PAGE, db=self.db)
            for m in page:
                frames.append(sse("message", m.model_dump_json(), id=m.seq))
                self.cursor = m.seq
            if len(page) < PAGE:
                break
        self.cursor = max(self.cursor, latest)
        return frames

    def _changed_runs(self) -> list[str]:
        cond = [RunRow.state.in_(LIVE_STATES)]
        if self._live:
            cond.append(RunRow.id.in_(self._live))
        if self._newest_run is not None:
            cond.append(RunRow.created_at >= self._newest_run)
        stmt = select(RunRow.id, RunRow.state, RunRow.attempts, RunRow.created_at).where(
            RunRow.chat_jid == self.chat_jid, or_(*cond)
        )
        with self.db.read() as session:
            rows = session.execute(stmt).all()
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

    def _run_frame(self, run_id: str) -> str:
        run = get_run(self.db, run_id)
        self._runs[run.id] = (run.state, run.attempts)
        if self._newest_run is None or run.created_at > self._newest_run:
            self._newest_run = run.created_at
        if run.state in LIVE_STATES:
            self._live.add(run.id)
        return sse("run", run.model_dump_json())

    # -- the response body ----------------------------------------------------

    async def events(self, disconnected: Callable[[], Awaitable[bool]], poll_s: float) -> AsyncIterator[str]:
        yield f"retry: {RETRY_MS}\n\n"
        quiet_since = time.monotonic()
        while not await disconnected():
            try:
                frames = await run_in_threadpool(self.poll)
            except Exception as exc:  # noqa: BLE001 - the database may be briefly away; keep the stream
                log.warning("stream of %s: %s", self.chat_jid, exc)
                frames = []
                await asyncio.sleep(1.0)
            for frame in frames:
                yield frame
            now = time.monotonic()
            if frames:
                quiet_since = now
            elif now - quiet_since >= KEEPALIVE_S:
                quiet_since = now
                yield ": keepalive\n\n"
            await asyncio.sleep(poll_s)
