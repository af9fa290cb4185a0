"""The API's group commit (orchestrator/http/write_batches.py): posts that arrive while a
batch is being written are written together, in arrival order; each caller gets its own
outcome, and no caller hangs when the store itself fails."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pytest

from orchestrator.http.write_batches import WriteBatches

T = TypeVar("T")


def _run(main: Callable[[], Awaitable[T]]) -> T:
    """``main`` on an event loop of its own, in a thread of its own: the suite's other tests
    (a browser's, the API's) may have left a loop running in this one."""

    async def wrapped() -> T:
        return await main()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wrapped()).result(timeout=30)


class _Store:
    """Holds the first batch until every item has been submitted, so the rest queue behind it."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.release = threading.Event()

    def __call__(self, items: Sequence[int]) -> list[int | Exception]:
        if not self.batches:
            assert self.release.wait(10), "the first batch was never released"
        self.batches.append(list(items))
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


def test_posts_that_wait_are_written_together_in_order_each_with_its_outcome() -> None:
    store = _Store()
    batches: WriteBatches[int, int] = WriteBatches(store, writers=1)

    async def main() -> list[int | BaseException]:
        first = asyncio.ensure_future(batches.submit(0))
        await asyncio.sleep(0.05)  # the first batch is being written
        rest = [asyncio.ensure_future(batches.submit(i)) for i in range(1, 9)]
        await asyncio.sleep(0.05)
        store.release.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    outcomes = _run(main)
    assert store.batches == [[0], [1, 2, 3, 4, 5, 6, 7, 8]]
    assert [o if isinstance(o, int) else str(o) for o in outcomes] == [
        0,
        "odd 1",
        20,
        "odd 3",
        40,
        "odd 5",
        60,
        "odd 7",
        80,
    ]


def test_a_failing_store_fails_every_caller_of_its_batch_and_the_next_batch_still_runs() -> None:
    calls: list[list[int]] = []

    def store(items: Sequence[int]) -> list[int | Exception]:
        calls.append(list(items))
        if len(calls) == 1:
            raise RuntimeError("the store's bug")
        return list(items)

    batches: WriteBatches[int, int] = WriteBatches(store, writers=1)

    async def main() -> tuple[list[int | BaseException], int]:
        failed = await asyncio.gather(*(batches.submit(i) for i in range(3)), return_exceptions=True)
        return failed, await batches.submit(7)

    failed, later = _run(main)
    assert all(isinstance(o, RuntimeError) for o in failed) and len(failed) == 3
    assert later == 7


def test_a_store_that_answers_short_is_an_error_not_a_hang() -> None:
    batches: WriteBatches[int, int] = WriteBatches(lambda items: list(items)[:-1], writers=1)

    async def main() -> list[int | BaseException]:
        return await asyncio.gather(*(batches.submit(i) for i in range(3)), return_exceptions=True)

    outcomes = _run(main)
    with pytest.raises(RuntimeError, match="outcomes for a batch"):
        raise next(o for o in outcomes if isinstance(o, BaseException))


def test_a_post_right_after_a_batch_ends_is_written_too() -> None:
    """The soak's lost post: a post made as the writer's last batch ended (its task done, the
    task's done-callback not yet run) found the writer still counted and waited forever."""
    batches: WriteBatches[int, int] = WriteBatches(lambda items: [i * 2 for i in items], writers=1)

    async def posts() -> list[int]:
        # Each submit runs in this task's own step, right as the previous batch's writer returns.
        return [await batches.submit(i) for i in range(20)]

    async def main() -> list[int]:
        return await asyncio.wait_for(posts(), timeout=5)  # a lost post fails here, not hangs

    assert _run(main) == [i * 2 for i in range(20)]
