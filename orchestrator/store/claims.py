"""A ledger row one deliverer works at a time: the sends (``deliveries``) and the changes
to what was sent (``delivery_changes``) are claimed, ended and abandoned the same way.

* :func:`claim_row`: ``pending`` and ready -> ``sending``, attempts + 1, the claimer's
  name and a deadline on the database's clock, in one conditional UPDATE, so two
  deliverers never work the same row;
* :func:`end_claim`: only the claim's holder ends it (the sweeper may have given up on a
  slow call meanwhile; what really happened wins);
* :func:`abandon_stale`: a claim past its deadline means its deliverer died mid-call.
  On the channels whose receivers deduplicate by the delivery id it is made again; on
  the others the row ends ``failed``, never repeated (at most once).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import ColumnElement, and_, update
from sqlalchemy.orm import Session

from orchestrator.store.db import Database, changed_rows, db_now, now_sql
from orchestrator.store.tables import DeliveryChangeRow, DeliveryRow

PENDING: Final = "pending"
SENDING: Final = "sending"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"

Ledger = type[DeliveryRow] | type[DeliveryChangeRow]


def claim_row(db: Database, table: Ledger, row_id: int, ready: ColumnElement[bool], owner: str, claim_s: float) -> bool:
    """Claim row ``row_id`` of ``table`` for ``owner`` if ``ready`` holds (-> ``sending``,
    attempts + 1) until ``claim_s`` seconds from the database's now; whether it was."""
    with db.write() as session:
        # The deadline is on the database's clock (the sweeper compares it with the same
        # clock); when a row falls due stays on the hosts' clocks that wrote it.
        deadline = db_now(session) + timedelta(seconds=claim_s)
        done = session.execute(
            update(table)
            .where(table.id == row_id, ready)
            .values(state=SENDING, attempts=table.attempts + 1, claimed_by=owner, claimed_until=deadline)
        )
        return changed_rows(done) == 1


def end_values(
    table: Ledger,
    state: str,
    *,
    last_error: str | None = None,
    next_attempt_at: datetime | None = None,
    give_back_attempt: bool = False,
) -> dict[str, Any]:
    """What ending a claim writes besides the table's own fields (``give_back_attempt``: the
    claim's attempt is not counted)."""
    values: dict[str, Any] = {"state": state}
    if last_error is not None:
        values["last_error"] = last_error
    if next_attempt_at is not None:
        values["next_attempt_at"] = next_attempt_at
    if give_back_attempt:
        values["attempts"] = table.attempts - 1
    return values


def end_claim(session: Session, table: Ledger, row_id: int, owner: str, values: dict[str, Any]) -> bool:
    """End ``owner``'s claim on the row with ``values``, in the caller's transaction; whether
    ``owner`` still held it."""
    done = session.execute(
        update(table)
        .where(table.id == row_id, table.claimed_by == owner)
        .values(claimed_by=None, claimed_until=None, **values)
    )
    return changed_rows(done) == 1


def abandon_stale(session: Session, table: Ledger, resend: Collection[str], *, again_at: datetime) -> int:
    """End the claims of ``table`` past their deadline (see the module's doc); how many."""
    stale = and_(table.state == SENDING, table.claimed_until < now_sql(session))
    again = 0
    if resend:
        again = changed_rows(
            session.execute(
                update(table)
                .where(stale, table.channel.in_(list(resend)))
                .values(
                    state=PENDING,
                    next_attempt_at=again_at,
                    claimed_by=None,
                    claimed_until=None,
                    last_error="its deliverer stopped while sending; sent again with the same delivery id",
                )
            )
        )
    given_up = changed_rows(
        session.execute(
            update(table)
            .where(stale)
            .values(
                state=FAILED,
                last_error="its deliverer stopped while sending; not retried, so that it is never sent twice",
            )
        )
    )
    return (again or 0) + (given_up or 0)
