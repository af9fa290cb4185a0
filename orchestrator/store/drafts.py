"""A running run's reply as the model writes it: the ``run_drafts`` table.

The worker that runs the agent writes the text so far (orchestrator/run/live_draft.py,
at most every ~100 ms, less often as it grows, bounded in bytes per run); the chat's
event stream, in the API process and maybe on another host, reads it
(orchestrator/http/stream.py): the versions on every tick (:func:`chat_draft_versions`,
no text), the text of a draft only when its version moved (:func:`drafts_of`).  The database is the only
thing both share, so the draft goes through it: one row per run, **updated in place**
(never a row per piece of text), deleted when the reply is stored as a message or the
run ends.  Drafts are for watching only: nothing reads them back into a conversation,
a delivery or a model's input.

``version`` grows by one with each write, so a reader compares one integer to see a
change.  Drafts of runs that are no longer ``running`` (a worker that died before it
could delete its row) are never listed, and the run's next attempt overwrites its row.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

from pydantic import BaseModel
from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError

from orchestrator.store.db import Database
from orchestrator.store.tables import RunDraftRow, RunRow


class Draft(BaseModel):
    run_id: str
    text: str
    version: int


def save_draft(db: Database, run_id: str, chat_jid: str, text: str, version: int) -> None:
    """The run's draft is now ``text`` (written in place; the first write creates the row)."""
    values = {"text": text, "version": version, "updated_at": datetime.now(UTC), "chat_jid": chat_jid}
    with db.write() as session:
        updated = session.execute(update(RunDraftRow).where(RunDraftRow.run_id == run_id).values(**values))
        if updated.rowcount:  # type: ignore[attr-defined]  # a CursorResult for an UPDATE
            return
    try:
        with db.write() as session:
            session.add(RunDraftRow(run_id=run_id, **values))
    except IntegrityError:  # created meanwhile (an earlier attempt's worker, still closing)
        with db.write() as session:
            session.execute(update(RunDraftRow).where(RunDraftRow.run_id == run_id).values(**values))


def drop_draft(db: Database, run_id: str) -> None:
    """No draft for the run any more (its reply is stored, or it ended)."""
    with db.write() as session:
        session.execute(delete(RunDraftRow).where(RunDraftRow.run_id == run_id))


def chat_drafts(db: Database, chat_jid: str) -> list[Draft]:
    """The drafts of the chat's running runs, oldest run first."""
    stmt = (
        select(RunDraftRow.run_id, RunDraftRow.text, RunDraftRow.version)
        .join(RunRow, RunRow.id == RunDraftRow.run_id)
        .where(RunDraftRow.chat_jid == chat_jid, RunRow.state == "running")
        .order_by(RunRow.created_at)
    )
    with db.read() as session:
        rows = session.execute(stmt).all()
    return [Draft(run_id=r[0], text=r[1], version=r[2]) for r in rows]


def chat_draft_versions(db: Database, chat_jid: str) -> dict[str, int]:
    """Run id -> draft version of the chat's running runs, oldest run first, without their
    text: what a reader polls, so an unchanged draft of a megabyte is not read again each tick."""
    stmt = (
        select(RunDraftRow.run_id, RunDraftRow.version)
        .join(RunRow, RunRow.id == RunDraftRow.run_id)
        .where(RunDraftRow.chat_jid == chat_jid, RunRow.state == "running")
        .order_by(RunRow.created_at)
    )
    with db.read() as session:
        return {r[0]: r[1] for r in session.execute(stmt).all()}


def drafts_of(db: Database, run_ids: Collection[str]) -> dict[str, Draft]:
    """The drafts of ``run_ids`` as they are now (a run without one is left out)."""
    if not run_ids:
        return {}
    stmt = select(RunDraftRow.run_id, RunDraftRow.text, RunDraftRow.version).where(RunDraftRow.run_id.in_(run_ids))
    with db.read() as session:
        return {r[0]: Draft(run_id=r[0], text=r[1], version=r[2]) for r in session.execute(stmt).all()}
