"""What one reader was sent of a chat's drafts, and what to send it next: text appended at an offset.

A running run's draft (``store/drafts.py``) is rewritten whole in place each time it grows.
A reader (an open event stream, ``orchestrator/http/stream.py``; the terminal chat,
``orchestrator/cli/chat.py``) needs only what it has not seen: :meth:`DraftFeed.changes`
reads the versions of the chat's drafts, the text of those whose version moved, and gives
a :class:`DraftPiece` per change:

* ``offset`` > 0: ``text`` follows the first ``offset`` characters the reader has (what the
  draft grew by);
* ``offset`` 0: ``text`` is the whole draft, which starts over: the first piece of a draft,
  and a draft whose text was replaced (its reply stored and the next one begun, a run's
  next attempt) rather than grown;
* ``offset`` 0 with ``text`` "": the draft is gone (its reply stored, or the run ended).

Offsets count characters (Unicode code points), not bytes or UTF-16 units.  A draft is
known to have grown, not been replaced, when its new text starts with what was sent:
the feed keeps the length and a digest of what it sent, not the text, so a reader of a
megabyte draft holds a few bytes for it.  In ``whole`` mode every piece is the whole text
at offset 0 (what a client that reads only ``text`` expects).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from orchestrator.store.db import Database
from orchestrator.store.drafts import chat_draft_versions, drafts_of

DraftMode = Literal["whole", "append"]


class DraftPiece(BaseModel):
    """One change of a run's draft for one reader (the ``draft`` event's JSON)."""

    run_id: str
    offset: int  # characters of the draft the reader keeps; ``text`` follows them
    text: str


@dataclass
class _Sent:
    version: int
    length: int  # characters sent
    digest: bytes  # of their UTF-8


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class DraftFeed:
    """The drafts of ``chat_jid`` as one reader follows them (see the module's docstring)."""

    def __init__(self, db: Database, chat_jid: str, mode: DraftMode = "append") -> None:
        self.db, self.chat_jid, self.mode = db, chat_jid, mode
        self._sent: dict[str, _Sent] = {}

    @property
    def following(self) -> bool:
        """Whether the reader was sent a draft that is not gone yet."""
        return bool(self._sent)

    def forget(self) -> None:
        """The reader dropped every draft it showed (a ``reset``): the next pieces start at 0."""
        self._sent.clear()

    def changes(self) -> list[DraftPiece]:
        """What changed since the last call: two reads (the versions; the texts that moved)."""
        current = chat_draft_versions(self.db, self.chat_jid)
        moved = [run_id for run_id, version in current.items() if self._version(run_id) != version]
        texts = drafts_of(self.db, moved)  # the text only of what moved: a big draft is not read each look
        pieces = []
        for run_id in moved:
            draft = texts.get(run_id)
            if draft is None:
                continue  # gone since the versions were read: the next look says so
            piece = self._piece(run_id, draft.text)
            self._sent[run_id] = _Sent(draft.version, len(draft.text), _digest(draft.text))
            if piece is not None:
                pieces.append(piece)
        for run_id in [r for r in self._sent if r not in current]:
            del self._sent[run_id]
            pieces.append(DraftPiece(run_id=run_id, offset=0, text=""))
        return pieces

    def _version(self, run_id: str) -> int | None:
        sent = self._sent.get(run_id)
        return None if sent is None else sent.version

    def _piece(self, run_id: str, text: str) -> DraftPiece | None:
        sent = self._sent.get(run_id)
        if self.mode == "whole" or sent is None or len(text) < sent.length:
            return DraftPiece(run_id=run_id, offset=0, text=text)
        if _digest(text[: sent.length]) != sent.digest:
            return DraftPiece(run_id=run_id, offset=0, text=text)  # replaced, not grown
        if len(text) == sent.length:
            return None  # written again as it was: nothing to send
        return DraftPiece(run_id=run_id, offset=sent.length, text=text[sent.length :])
