"""A running run's reply as the model writes it: the ``run_drafts`` table.

The worker that runs the agent writes the text so far (orchestrator/run/live_draft.py,
at most every ~100 ms, less often as it grows, bounded in bytes per run); the chat's
event stream, in the API process and maybe on another host, reads it
(orchestrator/http/stream.py, through orchestrator/store/draft_feed.py): the versions
on every look (:func:`chat_draft_versions`, no text), the text of a draft only when its
version moved (:func:`drafts_of`), and sends what it grew by.  The database is the only
thing both share, so the draft goes through it: one row per run, **updated in place**
(never a row per piece of text), deleted when the reply is stored as a message or the
run ends; each write and each removal wakes the chat's open streams (store/chat_wakeups.py).
Drafts are for watching only: nothing reads them back into a conversation,
a delivery or a model's input.

``version`` grows by one with each write, so a reader compares one integer to see a
change.  Drafts of runs that are no longer ``running`` (a worker that died before it
could delete its row) are never listed, and the run's next attempt overwrites its row.
"""

from __future__ import annotations

from collections.abc import Collection

from pydantic import BaseModel
from sqlalchemy import TextClause, select, text

from orchestrator.store.chat_wakeups import NOTIFY_RETURNING, chat_changed
from orchestrator.store.db import Database, now_text
from orchestrator.store.tables import RunDraftRow, RunRow


class Draft(BaseModel):
    run_id: str
    text: str
    version: int


def save_draft(db: Database, run_id: str, chat_jid: str, text: str, version: int) -> None:
    """The run's draft is ``text`` (written in place; the first write creates the row), and
    the chat's open streams are woken when it commits (store/chat_wakeups.py).

    One statement, an upsert: the row made by an earlier attempt's worker, still closing,
    is written over."""
    params = {"run_id": run_id, "chat_jid": chat_jid, "text": text, "version": version}
    with db.transaction() as conn:
        conn.execute(_SAVE[db.is_sqlite], params)
        if db.is_sqlite:
            chat_changed(conn, chat_jid)  # PostgreSQL's is in the statement


def drop_draft(db: Database, run_id: str) -> None:
    """No draft for the run any more (its reply is stored, or it ended); a row that was there
    wakes its chat's open streams."""
    with db.transaction() as conn:
        rows = conn.execute(_DROP[db.is_sqlite], {"run_id": run_id}).all()
        if db.is_sqlite and rows:
            chat_changed(conn, rows[0][0])


def _save_sql(*, sqlite: bool) -> TextClause:
    return text(
        "INSERT INTO run_drafts (run_id, chat_jid, text, version, updated_at) "
        f"VALUES (:run_id, :chat_jid, :text, :version, {now_text(sqlite=sqlite)}) "
        "ON CONFLICT (run_id) DO UPDATE SET chat_jid = excluded.chat_jid, text = excluded.text, "
        "version = excluded.version, updated_at = excluded.updated_at"
        + ("" if sqlite else f" RETURNING {NOTIFY_RETURNING}")
    )


# SQLAlchemy's text(), not the driver's own call: tests/host/test_drafts.py counts the bytes
# every draft write carries through SQLAlchemy's cursor events.
_SAVE = {sqlite: _save_sql(sqlite=sqlite) for sqlite in (True, False)}
_DROP = {
    sqlite: text(
        f"DELETE FROM run_drafts WHERE run_id = :run_id RETURNING {'chat_jid' if sqlite else NOTIFY_RETURNING}"
    )
    for sqlite in (True, False)
}


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
    text: what a reader polls, so an unchanged draft of a megabyte is not read again each look."""
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
