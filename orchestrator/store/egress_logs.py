"""The retention of runs' egress logs: their stored-only ``egress_log`` records
(``orchestrator/run/egress_log.py``) older than the retention are deleted by the sweeper,
a bounded batch per statement.

A record reaches no channel and holds no file: no delivery nor file link names it, so the
row alone goes.  Its age is ``stored_at``, the database's clock at the insert (never the
``timestamp`` a sender could set)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select

from orchestrator.model.messages import SENDER_EGRESS_LOG
from orchestrator.store.db import Database
from orchestrator.store.tables import MessageRow


def delete_egress_logs(db: Database, stored_before: datetime, *, limit: int) -> int:
    """Delete at most ``limit`` ``egress_log`` records stored before ``stored_before``, the
    oldest first; how many went.  One short transaction, so a large backlog never holds the
    messages table's writers back for long: the caller repeats while a batch comes back full."""
    oldest = (
        select(MessageRow.seq)
        .where(
            MessageRow.sender == SENDER_EGRESS_LOG,
            MessageRow.message_type == "system",
            MessageRow.stored_at < stored_before,
        )
        .order_by(MessageRow.seq)
        .limit(limit)
    )
    with db.write() as session:
        gone = session.execute(delete(MessageRow).where(MessageRow.seq.in_(oldest.scalar_subquery())))
        return int(getattr(gone, "rowcount", 0) or 0)
