"""Group leases: one holder at a time, expiry, release."""

from __future__ import annotations

import time

from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group


def test_one_holder_at_a_time(db: Database) -> None:
    ensure_main_group(db)
    assert leases.acquire(db, "main@local", "w1", 30)
    assert not leases.acquire(db, "main@local", "w2", 30)
    assert leases.acquire(db, "main@local", "w1", 30)  # re-entrant for its owner
    leases.release(db, "main@local", "w2")  # not the owner: no effect
    assert not leases.acquire(db, "main@local", "w2", 30)
    leases.release(db, "main@local", "w1")
    assert leases.acquire(db, "main@local", "w2", 30)


def test_expired_lease_can_be_taken(db: Database) -> None:
    ensure_main_group(db)
    assert leases.acquire(db, "main@local", "dead-worker", 0.2)
    assert not leases.acquire(db, "main@local", "w2", 30)
    time.sleep(0.3)
    assert leases.acquire(db, "main@local", "w2", 30)
    assert not leases.renew(db, "main@local", "dead-worker", 30)


def test_heartbeat_keeps_a_lease_alive(db: Database) -> None:
    ensure_main_group(db)
    assert leases.acquire(db, "main@local", "w1", 1.5)
    with leases.Heartbeat(db, "main@local", "w1", 1.5) as hb:
        time.sleep(2.5)
        assert not leases.acquire(db, "main@local", "w2", 30)
    assert not hb.lost.is_set()
