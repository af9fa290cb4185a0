"""Changing history: edit a user message, regenerate a reply, truncate.

Nothing is ever deleted.  Regenerate and truncate *supersede* messages
(``superseded_at`` is set): they stay in the table for audit and appear in
neither the display view nor the model's view.  An edit keeps every earlier
text in the message's metadata (``edit_history``).

Operations that move the group's cursor take the group's lease first, like a
run does, so they never interleave with a run writing to the same chat; if a
run holds it they raise :class:`GroupBusy` (cancel the run or wait).  Each change
wakes the chat's open streams (store/chat_wakeups.py), which then reset their view,
and records in its transaction what the channels that showed the messages must change
(store/delivery_changes.py: an edited message updated, a superseded one retracted); the
deliverer is signalled after the commit.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from orchestrator.core.errors import ChangeRefused, GroupBusy, InvalidMessage, MessageNotFound, UnknownGroup
from orchestrator.core.jsontypes import JsonObject
from orchestrator.core.settings import Settings
from orchestrator.model.context import CONTEXT_KEY, parse_context
from orchestrator.model.messages import SENDER_BOT, StoredMessage
from orchestrator.model.views import REPLY_TO_KEY, RUN_ID_KEY
from orchestrator.store import leases
from orchestrator.store.chat_wakeups import chat_changed
from orchestrator.store.db import Database
from orchestrator.store.delivery_changes import record_changes
from orchestrator.store.message_log import nth_last_live, to_stored
from orchestrator.store.tables import GroupRow, MessageRow, RunRow

EDIT_HISTORY_KEY = "edit_history"
# The chat whose agent posted a message into another (run/chat_outputs.py, send_message).
FROM_CHAT_KEY = "from_chat"

log = logging.getLogger(__name__)

Signal = Callable[[str], object]


class HistoryChange(BaseModel):
    """What an edit / regenerate / truncate did."""

    message: StoredMessage
    superseded: list[int]  # seqs
    rerun: bool  # a new run was asked for


@contextlib.contextmanager
def _holding_lease(db: Database, settings: Settings, chat_jid: str) -> Iterator[None]:
    owner = f"history:{uuid.uuid4().hex[:12]}"
    if not leases.acquire(db, chat_jid, owner, settings.fleet.lease_ttl_s):
        with db.read() as session:  # no row to lease: say what is missing, not that it is busy
            if session.get(GroupRow, chat_jid) is None:
                raise UnknownGroup(chat_jid)
        raise GroupBusy(f"a run is in progress in {chat_jid}; wait for it or cancel it (orchestrator runs cancel)")
    try:
        yield
    finally:
        leases.release(db, chat_jid, owner)


def _live_row(session: Session, chat_jid: str, message_id: str) -> MessageRow:
    row = session.get(MessageRow, {"id": message_id, "chat_jid": chat_jid})
    if row is None:
        raise MessageNotFound(chat_jid, message_id)
    if row.superseded_at is not None:
        raise ChangeRefused(f"message {message_id!r} was superseded and can no longer change")
    return row


def _supersede(session: Session, chat_jid: str, from_seq: int, now: datetime) -> list[int]:
    seqs = list(
        session.scalars(
            select(MessageRow.seq).where(
                MessageRow.chat_jid == chat_jid, MessageRow.seq >= from_seq, MessageRow.superseded_at.is_(None)
            )
        )
    )
    if seqs:
        session.execute(
            update(MessageRow)
            .where(MessageRow.chat_jid == chat_jid, MessageRow.seq >= from_seq, MessageRow.superseded_at.is_(None))
            .values(superseded_at=now)
        )
    return sorted(seqs)


def _rewind(session: Session, chat_jid: str, cursor_seq: int, pending_seq: int) -> None:
    session.execute(
        update(GroupRow).where(GroupRow.chat_jid == chat_jid).values(cursor_seq=cursor_seq, pending_seq=pending_seq)
    )


def edit_message(
    db: Database,
    settings: Settings,
    chat_jid: str,
    message_id: str,
    content: str,
    *,
    context: list[JsonObject] | None = None,
    rerun: bool = False,
    signal: Signal | None = None,
    signal_delivery: Signal | None = None,
) -> HistoryChange:
    """Replace a user message's text (and optionally its context items).

    The next run sees the new text, with its context blocks expanded afresh.
    With ``rerun`` everything after the message is superseded and the agent
    answers the edited message again.
    """
    if "\x00" in content:
        raise InvalidMessage("content must not contain NUL characters")
    now = datetime.now(UTC)
    guard = _holding_lease(db, settings, chat_jid) if rerun else contextlib.nullcontext()
    with guard, db.write() as session:
        row = _live_row(session, chat_jid, message_id)
        if to_stored(row).part.kind != "user_text" or row.is_from_me:
            raise ChangeRefused(f"only a person's message can be edited; {message_id!r} is {row.message_type}")
        meta = dict(row.meta or {})
        if context is not None:
            meta[CONTEXT_KEY] = context
            parse_context(meta)  # refuse bad items before anything changes
        previous = {"content": row.content, "edited_at": now.isoformat()}
        meta[EDIT_HISTORY_KEY] = [*meta.get(EDIT_HISTORY_KEY, []), previous]
        row.content, row.meta, row.edited_at = content, meta, now
        superseded: list[int] = []
        if rerun:
            superseded = _supersede(session, chat_jid, row.seq + 1, now)
            group = session.get(GroupRow, chat_jid)
            # Not past earlier unanswered messages: they stay new for the run.
            cursor = row.seq - 1 if group is None else min(group.cursor_seq, row.seq - 1)
            _rewind(session, chat_jid, cursor_seq=cursor, pending_seq=row.seq)
        session.flush()
        changes = record_changes(
            session, chat_jid, edited=[row.seq], superseded=superseded, hold_replies_s=settings.runs.rerun_replace_s
        )
        message = to_stored(row)
        chat_changed(session, chat_jid)  # the open streams reset their view
    _signal_changes(chat_jid, changes, signal_delivery)
    if rerun and signal is not None:
        signal(chat_jid)
    return HistoryChange(message=message, superseded=superseded, rerun=rerun)


def edit_agent_message(
    db: Database, chat_jid: str, content: str, *, nth_last: int, owner: str, by_run: str
) -> HistoryChange | None:
    """A run's agent changes the words of its own ``nth_last`` message in its chat (1: its
    latest), in one transaction fenced by the run's lease: the old words kept as for every
    edit, the channels that show it updated (:func:`record_changes`).  None when it has no
    such message.

    Its own: a reply, not superseded, stored by a run of this chat's group (the run id its
    metadata carries names a run of ``chat_jid``) and not posted from another chat.  What
    the main group's agent posted here (``send_message``: ``from_chat`` and a run of the
    main group), a message with no run (imported, the operator's) and any other chat's
    words are not its to change: they are neither edited nor counted, so ``nth_last``
    counts the group's own replies only."""
    if "\x00" in content:
        raise InvalidMessage("content must not contain NUL characters")
    now = datetime.now(UTC)
    with db.write() as session:
        leases.fence(session, chat_jid, owner)
        row = nth_last_live(session, chat_jid, nth_last, *_own_replies(chat_jid))
        if row is None:
            return None
        meta = dict(row.meta or {})
        previous = {"content": row.content, "edited_at": now.isoformat(), "by_run": by_run}
        meta[EDIT_HISTORY_KEY] = [*meta.get(EDIT_HISTORY_KEY, []), previous]
        row.content, row.meta, row.edited_at = content, meta, now
        session.flush()
        record_changes(session, chat_jid, edited=[row.seq])
        message = to_stored(row)
        chat_changed(session, chat_jid)  # the open streams reset their view
    return HistoryChange(message=message, superseded=[], rerun=False)


def _own_replies(chat_jid: str) -> tuple[Any, ...]:
    """The conditions a reply the agent of ``chat_jid`` may edit meets, for the database to
    pick the row: the columns a bot's reply (an assistant_text part) is stored with, a run
    of this chat's group named in its metadata, no other chat it came from."""
    meta = MessageRow.meta
    by_own_run = (
        select(RunRow.id).where(RunRow.id == meta[RUN_ID_KEY].as_string(), RunRow.chat_jid == chat_jid).exists()
    )
    return (
        MessageRow.sender == SENDER_BOT,
        MessageRow.message_type == "assistant",
        meta[FROM_CHAT_KEY].as_string().is_(None),
        by_own_run,
    )


def regenerate(
    db: Database,
    settings: Settings,
    chat_jid: str,
    message_id: str,
    *,
    signal: Signal | None = None,
    signal_delivery: Signal | None = None,
) -> HistoryChange:
    """Supersede an assistant reply (with its run's other outputs and all
    that follows) and run the agent again on the messages it answered."""
    now = datetime.now(UTC)
    with _holding_lease(db, settings, chat_jid), db.write() as session:
        row = _live_row(session, chat_jid, message_id)
        if to_stored(row).part.kind != "assistant_text":
            raise ChangeRefused(f"only an assistant reply can be regenerated; {message_id!r} is {row.message_type}")
        meta = row.meta or {}
        answered = meta.get(REPLY_TO_KEY)
        if not isinstance(answered, int):
            answered = _last_input_before(session, chat_jid, row.seq)
        # The run's first output: its tool calls before this reply go too,
        # or the new run would repeat them beside the old ones.
        first = session.scalar(
            select(MessageRow.seq)
            .where(
                MessageRow.chat_jid == chat_jid,
                MessageRow.is_from_me.is_(True),
                MessageRow.seq > answered,
                MessageRow.seq <= row.seq,
                MessageRow.superseded_at.is_(None),
            )
            .order_by(MessageRow.seq)
            .limit(1)
        )
        start = _run_start(session, chat_jid, meta.get(RUN_ID_KEY), answered)
        superseded = _supersede(session, chat_jid, first or row.seq, now)
        _rewind(session, chat_jid, cursor_seq=start, pending_seq=answered)
        session.flush()
        changes = record_changes(session, chat_jid, superseded=superseded, hold_replies_s=settings.runs.rerun_replace_s)
        message = to_stored(row)
        chat_changed(session, chat_jid)
    _signal_changes(chat_jid, changes, signal_delivery)
    if signal is not None:
        signal(chat_jid)
    return HistoryChange(message=message, superseded=superseded, rerun=True)


def _signal_changes(chat_jid: str, changes: int, signal_delivery: Signal | None) -> None:
    """Wake a deliverer for the changes just recorded (the sweeper re-signals a lost signal)."""
    if changes and signal_delivery is not None:
        try:
            signal_delivery(chat_jid)
        except Exception as exc:  # noqa: BLE001 - the change is made; the sweeper signals due changes
            log.warning("could not signal a deliverer for %s's changes (%s); the sweeper will", chat_jid, exc)


def _last_input_before(session: Session, chat_jid: str, seq: int) -> int:
    found = session.scalar(
        select(MessageRow.seq)
        .where(
            MessageRow.chat_jid == chat_jid,
            MessageRow.seq < seq,
            MessageRow.is_from_me.is_(False),
            MessageRow.superseded_at.is_(None),
        )
        .order_by(MessageRow.seq.desc())
        .limit(1)
    )
    if found is None:
        raise ChangeRefused("there is no earlier message for the agent to answer again")
    return found


def _run_start(session: Session, chat_jid: str, run_id: Any, answered: int) -> int:
    """The cursor the answered run started from (so it sees the same batch)."""
    stmt = select(RunRow.cursor_from).where(RunRow.chat_jid == chat_jid)
    if isinstance(run_id, str):
        stmt = stmt.where(RunRow.id == run_id)
    else:
        stmt = stmt.where(RunRow.cursor_to == answered)
    start = session.scalar(stmt.order_by(RunRow.created_at.desc()).limit(1))
    # Imported history has no runs: answer just the last input again.
    return answered - 1 if start is None else start


def truncate_after(
    db: Database, settings: Settings, chat_jid: str, message_id: str, *, signal_delivery: Signal | None = None
) -> HistoryChange:
    """Supersede every message after ``message_id``; nothing new runs."""
    now = datetime.now(UTC)
    with _holding_lease(db, settings, chat_jid), db.write() as session:
        row = _live_row(session, chat_jid, message_id)
        superseded = _supersede(session, chat_jid, row.seq + 1, now)
        group = session.get(GroupRow, chat_jid)
        if group is not None:
            _rewind(
                session,
                chat_jid,
                cursor_seq=min(group.cursor_seq, row.seq),
                pending_seq=min(group.pending_seq, row.seq),
            )
        changes = record_changes(session, chat_jid, superseded=superseded)
        message = to_stored(row)
        chat_changed(session, chat_jid)
    _signal_changes(chat_jid, changes, signal_delivery)
    return HistoryChange(message=message, superseded=superseded, rerun=False)
