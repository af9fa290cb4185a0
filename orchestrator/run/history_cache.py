"""The history a worker process read for a group's last run, kept for its next run.

A run's input shows the last ``context_messages`` messages before its batch
(``assembly.prior_messages``).  Read and decoded afresh, that is the largest
part of a warm run's host time (~1 ms for a hundred rows, more for the default
200), though all but the last run's batch and outputs were read by the run
before.  So each worker process keeps, per group, the rows it showed the last
run plus that run's batch, and the next run reads only the rows stored since.

What the kept rows are is exact, not a guess: a chat's seqs are assigned in
commit order (``store/message_log.py``), so the rows above the kept ones are
the ones stored since; and every change to a stored row's view, and every
deletion, moves the group's ``history_rev`` (database triggers, revision
0027), which the run's lease read before any of the history.  Kept rows of
another revision are dropped unread.  A kept entry answers only a cursor at or
after its own (a rewind supersedes rows, so it moves the revision anyway).

At most ``groups`` groups are kept per process, the least recently run go
first; 0 keeps none (``ORCHESTRATOR_HISTORY_CACHE_GROUPS``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from orchestrator.model.messages import StoredMessage


@dataclass(frozen=True)
class KeptHistory:
    """A chat's live rows up to ``upto``, from a row the model's view counts on.

    ``complete``: they go back to the chat's first such row (fewer than the
    view wants were stored); else they hold at least ``wanted`` of them.
    """

    rev: int
    upto: int
    rows: list[StoredMessage]
    complete: bool
    wanted: int


class HistoryCache:
    """Per-process kept histories, keyed by chat (least recently used out first)."""

    def __init__(self, groups: int) -> None:
        self.groups = groups
        self._kept: OrderedDict[str, KeptHistory] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, chat_jid: str, rev: int, cursor: int, wanted: int) -> KeptHistory | None:
        """The kept history of ``chat_jid`` if it still holds for a read up to ``cursor``."""
        with self._lock:
            kept = self._kept.get(chat_jid)
            if kept is None:
                return None
            if kept.rev != rev or kept.upto > cursor or kept.wanted != wanted:
                del self._kept[chat_jid]
                return None
            self._kept.move_to_end(chat_jid)
            return kept

    def keep(self, chat_jid: str, kept: KeptHistory) -> None:
        if self.groups <= 0:
            return
        with self._lock:
            self._kept[chat_jid] = kept
            self._kept.move_to_end(chat_jid)
            while len(self._kept) > self.groups:
                self._kept.popitem(last=False)

    def __len__(self) -> int:
        return len(self._kept)
