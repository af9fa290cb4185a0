"""Group leases: one holder at a time, expiry on the clock (a fake one: no sleeps), release."""

from __future__ import annotations

from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from tests.fakes.clock import FakeClock


def test_one_holder_at_a_time(db: Database) -> None:
    ensure_main_group(db)
    assert leases.acquire(db, "main@local", "w1", 30)
    assert not leases.acquire(db, "main@local", "w2", 30)
    assert leases.acquire(db, "main@local", "w1", 30)  # re-entrant for its owner
    leases.release(db, "main@local", "w2")  # not the owner: no effect
    assert not leases.acquire(db, "main@local", "w2", 30)
    leases.release(db, "main@local", "w1")
    assert leases.acquire(db, "main@local", "w2", 30)


def test_a_lease_expires_on_the_clock_and_not_before(db: Database) -> None:
    clock = FakeClock()
    ensure_main_group(db)
    assert leases.acquire(db, "main@local", "dead-worker", 30, clock=clock)
    clock.advance(29)
    assert not leases.acquire(db, "main@local", "w2", 30, clock=clock)
    clock.advance(2)
    assert leases.acquire(db, "main@local", "w2", 30, clock=clock)
    assert not leases.renew(db, "main@local", "dead-worker", 30, clock=clock)


def test_a_heartbeat_keeps_the_lease_while_time_passes(db: Database) -> None:
    clock = FakeClock()
    ensure_main_group(db)
    assert leases.acquire(db, "main@local", "w1", 30, clock=clock)
    with leases.Heartbeat(db, "main@local", "w1", 30, clock=clock) as hb:
        # Many beats later (each a jump of ttl/3), the lease is still w1's.
        while len(clock.waits_of("lease-main@local")) < 12:
            hb.lost.wait(0.01)
        assert not leases.acquire(db, "main@local", "w2", 30, clock=clock)
    assert not hb.lost.is_set()
    clock.advance(31)
    assert leases.acquire(db, "main@local", "w2", 30, clock=clock)
