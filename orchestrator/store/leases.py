"""One run per group at a time, across every worker and host.

A lease is (owner, expiry) on the group row, taken with a conditional UPDATE
that works the same on SQLite and PostgreSQL: it succeeds only if the lease is
free or expired.  The holder renews it from a heartbeat thread; a holder that
dies simply stops renewing and the lease expires.  Expiry is the clock's
(``orchestrator/core/clock.py``), so tests move time instead of sleeping.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import or_, update

from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.store.db import Database, changed_rows
from orchestrator.store.tables import GroupRow

log = logging.getLogger(__name__)


def acquire(db: Database, chat_jid: str, owner: str, ttl_s: float, *, clock: Clock = SYSTEM_CLOCK) -> bool:
    now = clock.now()
    with db.write() as session:
        result = session.execute(
            update(GroupRow)
            .where(
                GroupRow.chat_jid == chat_jid,
                or_(
                    GroupRow.lease_owner.is_(None),
                    GroupRow.lease_owner == owner,
                    GroupRow.lease_expires_at < now,
                ),
            )
            .values(lease_owner=owner, lease_expires_at=now + timedelta(seconds=ttl_s))
        )
        return changed_rows(result) == 1


def renew(db: Database, chat_jid: str, owner: str, ttl_s: float, *, clock: Clock = SYSTEM_CLOCK) -> bool:
    with db.write() as session:
        result = session.execute(
            update(GroupRow)
            .where(GroupRow.chat_jid == chat_jid, GroupRow.lease_owner == owner)
            .values(lease_expires_at=clock.now() + timedelta(seconds=ttl_s))
        )
        return changed_rows(result) == 1


def release(db: Database, chat_jid: str, owner: str) -> None:
    with db.write() as session:
        session.execute(
            update(GroupRow)
            .where(GroupRow.chat_jid == chat_jid, GroupRow.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
        )


class Heartbeat:
    """Renews a lease every ``ttl/3`` seconds until stopped."""

    def __init__(
        self, db: Database, chat_jid: str, owner: str, ttl_s: float, *, clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._db, self._jid, self._owner, self._ttl = db, chat_jid, owner, ttl_s
        self._clock = clock
        self._stop = threading.Event()
        self.lost = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{chat_jid}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._clock.wait(self._stop, self._ttl / 3):
            try:
                if not renew(self._db, self._jid, self._owner, self._ttl, clock=self._clock):
                    self.lost.set()
                    return
            except Exception:  # noqa: BLE001 - a transient DB error: try again next beat
                log.warning("could not renew the lease of %s; trying again next beat", self._jid, exc_info=True)
