"""A run's reply as it is written: the container's ``text_delta`` events, bounded and published.

The runner sends the text of the model's answer as it streams (coalesced to one line
per 50 ms or KiB, container/agent_runner/text_stream.py), then the whole block as an
``assistant`` event, and only that one is stored.  :class:`LiveDraft` keeps the text
since the last stored reply (a new block of the same reply starts a new paragraph) and
writes it to ``run_drafts`` (orchestrator/store/drafts.py) in place, so the chat's event
stream in another process can show it; the row is deleted when the reply is stored
(:meth:`stored`) and when the attempt ends (:meth:`close`).

Each write is the whole text so far, and every open page's event stream reads each
version whole (it sends only what the draft grew by, orchestrator/store/draft_feed.py,
but reads the text to know it), so what a draft costs is the bytes it writes, not the
bytes it adds: one 1 MiB delta and then a byte every 100 ms would rewrite 1 MiB ten
times a second for the whole run.  So the writes are bounded in bytes, not only in number:

* after a write of ``n`` bytes the next waits ``max(interval_s, n / rate)``
  (``WRITE_RATE``, 64 KiB/s): a draft up to 6.4 KiB (a model answer at the default
  ``ORCHESTRATOR_MAX_TOKENS`` is a few KiB) is written every 100 ms as before, a 64 KiB
  one every second, a 1 MiB one every 16 s.  A run's drafts write at most about 64 KiB a
  second, and a stream sends no more than that per running run, whatever the deltas;
  the pace holds across replies (a stored reply does not reset it);
* an attempt's drafts write at most ``max_written`` bytes in all (the pipeline gives it
  ``ORCHESTRATOR_MAX_RUN_STORED_BYTES``: as much as the run may store): a write that would
  pass it is not made, and the live view stops there, the draft left as it was until the
  reply is stored, then none for the rest of the attempt.  The stored replies arrive as
  messages as they always do: a person watching loses the live text, never the reply.

The deltas are the container's, so they are hostile, and they are bounded on their own
(they are never stored, so the stored-bytes budget does not see them):

* the draft holds at most ``max_bytes`` (the longest reply one event line can carry,
  ``ORCHESTRATOR_MAX_EVENT_LINE_BYTES``); what comes beyond is dropped, not kept;
* a run's deltas are *free* (not counted as output lines) up to ``free_lines`` lines and
  ``free_bytes`` bytes in all (10 x ``ORCHESTRATOR_MAX_RUN_EVENTS`` lines, at 50 ms a
  line far more than a run's timeout allows; ``ORCHESTRATOR_MAX_RUN_STORED_BYTES``, what
  the run may store anyway): past either, :meth:`add` drops the delta and returns False,
  and the pipeline counts the line against ``max_run_events``, so an endless stream of
  deltas ends the run like any other flood of lines.

Writing the draft is best effort: a failed write is logged and the run goes on (the
stored reply is what counts).  The time between writes is the worker's clock; a text
that arrives just after a write waits for the next delta or the stored reply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent_runner.protocol import TextDeltaEvent
from orchestrator.store.db import Database
from orchestrator.store.drafts import drop_draft, save_draft

log = logging.getLogger(__name__)

WRITE_INTERVAL_S = 0.1
WRITE_RATE = 64 * 1024  # bytes a second a run's drafts write, sustained (the wait after each write)
FREE_LINES_PER_EVENT = 10  # free delta lines per line of ORCHESTRATOR_MAX_RUN_EVENTS
BLOCK_BREAK = "\n\n"  # between two text blocks of one reply, as the stored messages are apart


class LiveDraft:
    """One attempt's streamed text: :meth:`add` each delta, :meth:`stored` per stored reply, :meth:`close` at the end."""

    def __init__(
        self,
        db: Database,
        run_id: str,
        chat_jid: str,
        *,
        max_bytes: int,
        free_lines: int,
        free_bytes: int,
        max_written: int,
        interval_s: float = WRITE_INTERVAL_S,
        rate: float = WRITE_RATE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db, self.run_id, self.chat_jid = db, run_id, chat_jid
        self.max_bytes, self.free_lines, self.free_bytes = max_bytes, free_lines, free_bytes
        self.max_written = max_written
        self.interval_s, self.rate = interval_s, rate
        self._clock = clock
        self.lines = 0  # delta lines seen, in all
        self.bytes = 0  # their text's bytes, in all
        self.dropped = 0  # bytes not kept (over max_bytes, or past the free allowance)
        self.writes = 0  # rows written (tests and the bench read it)
        self.written = 0  # the text's bytes those writes carried (or tried to), in all
        self.spent = False  # max_written reached: no more writes this attempt
        self._wait = 0.0  # after the last write, before the next one
        self._parts: list[str] = []
        self._size = 0
        self._block: str | None = None
        self._version = 0
        self._written_at = float("-inf")
        self._dirty = False
        self._published = False  # a row may exist
        self._failures = 0

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def add(self, event: TextDeltaEvent) -> bool:
        """Take one delta; False when it is past the run's free allowance (dropped: count its line)."""
        size = len(event.text.encode("utf-8"))
        self.lines += 1
        self.bytes += size
        if self.lines > self.free_lines or self.bytes > self.free_bytes:
            self.dropped += size
            return False
        piece = event.text
        if event.block != self._block:
            if self._block is not None and self._parts:
                piece = BLOCK_BREAK + piece
                size += len(BLOCK_BREAK)
            self._block = event.block
        room = self.max_bytes - self._size
        if size > room:
            self.dropped += size - max(room, 0)
            piece = piece.encode("utf-8")[: max(room, 0)].decode("utf-8", "ignore")
            size = len(piece.encode("utf-8"))
        if piece:
            self._parts.append(piece)
            self._size += size
            self._dirty = True
        if self._dirty and not self.spent and self._clock() - self._written_at >= self._wait:
            self._write()
        return True

    def stored(self) -> None:
        """The reply was stored as a message: the draft goes (the next delta starts a new one)."""
        self._parts.clear()
        self._size = 0
        self._block = None
        self._dirty = False
        if self._published:
            self._drop()

    def close(self) -> None:
        """The attempt is over: no draft is left behind."""
        self.stored()

    def _write(self) -> None:
        if self.written + self._size > self.max_written:
            self.spent = True
            log.info(
                "run %s: its drafts wrote %d bytes (ORCHESTRATOR_MAX_RUN_STORED_BYTES): no live view for the "
                "rest of the attempt; its replies are stored as always",
                self.run_id,
                self.written,
            )
            return
        self._version += 1
        self._written_at = self._clock()
        # A failed write waits as long: a database that is away is not asked ten times a second either.
        self._wait = max(self.interval_s, self._size / self.rate)
        self._dirty = False
        self.written += self._size
        try:
            save_draft(self.db, self.run_id, self.chat_jid, self.text, self._version)
            self._published = True
            self.writes += 1
        except self.db.error_kinds as exc:
            self._failed("write", exc)

    def _drop(self) -> None:
        try:
            drop_draft(self.db, self.run_id)
            self._published = False
        except self.db.error_kinds as exc:
            self._failed("delete", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        self._failures += 1
        if self._failures <= 3:  # a database that is away must not flood the log
            log.warning("run %s: could not %s its draft (the reply is stored all the same): %s", self.run_id, what, exc)
