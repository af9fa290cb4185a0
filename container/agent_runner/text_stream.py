"""Streamed text to ``TextDeltaEvent`` lines, coalesced.

A model streams a token every few milliseconds; one stdout line per token
would make the host read, parse and throttle thousands of lines per answer.
:class:`DeltaCoalescer` holds the text back and writes one event when
``min_interval_s`` has passed since the last one it wrote, or when
``max_bytes`` are waiting, whichever comes first; a new block, and the end
of the model call (:meth:`flush`), write what is waiting at once.  The first
piece after a quiet spell goes out at once, so the first visible text is
not delayed.  Without a timer thread, text that arrives just after a write
waits for the next piece or the end of the call (a model that pauses
mid-answer shows its last few tokens when it goes on).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .protocol import Event, TextDeltaEvent

MIN_INTERVAL_S = 0.05
MAX_BYTES = 1024


class DeltaCoalescer:
    """Collects ``(block, text)`` pieces; emits :class:`TextDeltaEvent` at most every ``min_interval_s``."""

    def __init__(
        self,
        emit: Callable[[Event], None],
        *,
        min_interval_s: float = MIN_INTERVAL_S,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self.min_interval_s = min_interval_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._block: str | None = None
        self._parts: list[str] = []
        self._size = 0
        self._last = float("-inf")

    def sink(self, prefix: str) -> Callable[[int, str], None]:
        """A provider's ``on_text`` for one model call: block ids ``prefix`` + the text block's index."""
        return lambda index, text: self.add(f"{prefix}{index}", text)

    def add(self, block: str, text: str) -> None:
        if not text:
            return
        if block != self._block:
            self.flush()
            self._block = block
        self._parts.append(text)
        self._size += len(text.encode("utf-8"))
        if self._size >= self.max_bytes or self._clock() - self._last >= self.min_interval_s:
            self.flush()

    def flush(self) -> None:
        if self._parts and self._block is not None:
            self._emit(TextDeltaEvent(block=self._block, text="".join(self._parts)))
            self._last = self._clock()
        self._parts.clear()
        self._size = 0
