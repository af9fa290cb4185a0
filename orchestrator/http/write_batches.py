"""Group commit for the API's posted messages.

Each ``POST /api/messages`` is a transaction of its own when it comes alone.
When posts arrive while another is being stored, they wait together and the
next writer stores all of them, in arrival order, in one transaction
(``orchestrator/run/ingest.py`` :func:`ingest_batch`): one BEGIN, one seq lock and
one COMMIT for the lot instead of one each.  Nothing waits on purpose: a batch
is whatever queued up while the previous one was being written, so a single
client sees no added latency and 32 clients share their transactions.

``writers`` bounds the batches in flight: 1 on SQLite (one writer at a time in
any case; a second thread would only sleep in SQLite's busy handler), a few on
PostgreSQL (its pool's connections).  A post whose client went away before its
batch was written is still stored, as it was when each post had its own thread.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from anyio import to_thread

Item = TypeVar("Item")
Result = TypeVar("Result")

MAX_BATCH = 64


class WriteBatches(Generic[Item, Result]):
    """Items stored by ``store`` (run in a worker thread) in batches; each caller gets its own outcome.

    ``store`` gets a batch in arrival order and returns one outcome per item, in the
    same order: the item's result, or the exception to raise to its caller."""

    def __init__(
        self,
        store: Callable[[Sequence[Item]], Sequence[Result | Exception]],
        *,
        writers: int,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._store = store
        self._writers = writers
        self._max_batch = max_batch
        self._waiting: collections.deque[tuple[Item, asyncio.Future[Result]]] = collections.deque()
        # Writers at work, counted by the writers themselves: a task's done-callback runs a loop
        # step after it returned, and a post made in between would find a writer that is gone.
        self._writing = 0
        self._tasks: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones

    async def submit(self, item: Item) -> Result:
        """Store ``item`` with whatever else is waiting; its outcome (raised if an exception)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()
        self._waiting.append((item, future))
        if self._writing < self._writers:
            self._writing += 1
            task = loop.create_task(self._write())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _write(self) -> None:
        try:
            await self._write_waiting()
        finally:
            # In the same step as the last look at the queue: no post can slip in between.
            self._writing -= 1

    async def _write_waiting(self) -> None:
        while self._waiting:
            batch = [self._waiting.popleft() for _ in range(min(self._max_batch, len(self._waiting)))]
            try:
                outcomes: Sequence[Result | Exception] = await to_thread.run_sync(
                    self._store, [item for item, _ in batch]
                )
                if len(outcomes) != len(batch):
                    raise RuntimeError(f"{len(outcomes)} outcomes for a batch of {len(batch)}")
            except Exception as exc:  # noqa: BLE001 - a bug in store: every caller hears of it, none hangs
                outcomes = [exc] * len(batch)
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.done():  # its caller was cancelled (the client went away)
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
