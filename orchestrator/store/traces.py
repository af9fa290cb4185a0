"""The trace context stored with the messages that woke the agent (``messages.traceparent``).

Written by ingest (and the scheduler) inside the transaction that stores the message,
read when a run starts: the run's span joins those traces (orchestrator/run/run_trace.py)
whichever signal started it, since a signal may be lost, late, or sent for another
message (orchestrator/core/tracing.py).  Nothing here runs while tracing is off.
"""

from __future__ import annotations

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from orchestrator.store.db import Database, driver_execute
from orchestrator.store.tables import MessageRow

# seq is unique: one index probe.  A fixed statement on the driver, as ingest's others.
_RECORD = "UPDATE messages SET traceparent = :traceparent WHERE seq = :seq"


def record_trace(conn: Connection | Session, seq: int, traceparent: str) -> None:
    """Keep ``traceparent`` with message ``seq``, in the caller's transaction."""
    if isinstance(conn, Session):
        conn = conn.connection()
    driver_execute(conn, _RECORD, {"traceparent": traceparent, "seq": seq})


def batch_traces(db: Database, chat_jid: str, after_seq: int, upto_seq: int) -> list[str]:
    """The stored ``traceparent`` of ``chat_jid``'s messages in ``(after_seq, upto_seq]``
    (a run's batch), in seq order: the first is the trace the run joins."""
    c = MessageRow.__table__.c
    stmt = (
        select(c.traceparent)
        .where(c.chat_jid == chat_jid, c.seq > after_seq, c.seq <= upto_seq, c.traceparent.is_not(None))
        .order_by(c.seq)
    )
    with db.read() as session:
        return [row[0] for row in session.execute(stmt)]
