"""Failure detection in seconds (``store/liveness.py``): a lease holder on another host that
is SIGKILLed is taken over once it stopped renewing, long before its lease expires or its
host's heartbeat window ends, and the recovery watch finds it; a live holder whose token
looks gone (PostgreSQL: its session ended by the server) keeps its lease while it renews,
and makes its token again. Holders are real processes; both databases."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text, update

from orchestrator.run.recovery import dead_holders
from orchestrator.store import hosts, leases, liveness
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.placement import placed_on
from orchestrator.store.tables import GroupRow, ProcessLivenessRow
from tests.conftest import wait_until

JID = "main@local"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def holder(db: Database) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A process of host ``far-host`` holding the main group's lease, renewing it; its owner."""
    ensure_main_group(db)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.host.lease_holder", db.url, "far-host", JID],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    said = proc.stdout.readline().split()
    assert said[:1] == ["held"], said
    try:
        yield proc, said[1]
    finally:
        proc.kill()
        proc.wait()


def _renewed_at(db: Database) -> datetime:
    with db.read() as session:
        found = session.scalar(select(GroupRow.lease_renewed_at).where(GroupRow.chat_jid == JID))
    assert found is not None
    return found


def _token(db: Database, owner: str) -> str:
    process = hosts.owner_process(owner)
    assert process is not None
    return liveness.tokens_of(db, [process])[process]


def test_a_killed_holder_on_another_host_is_taken_over_once_it_stopped_renewing(
    db: Database, holder: tuple[subprocess.Popen[str], str]
) -> None:
    proc, owner = holder
    token = _token(db, owner)
    assert liveness.gone(db, [token]) == set()  # it runs
    # Its host beats on (its heartbeat window is not over), and the group is placed there.
    hosts.register(db, host_id="far-host", instance="far", version="t", concurrency=1)
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(placed_host="far-host"))
    assert placed_on(db, JID) == "far-host"
    mine = hosts.process_owner("near-host")
    assert not leases.acquire(db, JID, mine, 60)  # held, renewed
    assert dead_holders(db, "near-host") == []
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_until(lambda: liveness.gone(db, [token]) == {token}, 10, "its token gone with it")
    last = _renewed_at(db)
    wait_until(lambda: dead_holders(db, "near-host") == [(JID, owner)], 10, "the recovery watch finding it")
    assert leases.take(db, JID, mine, 60, place="near-host") is not None
    with db.read() as session:
        taken = session.execute(
            select(GroupRow.lease_owner, GroupRow.lease_renewed_at, GroupRow.placed_host).where(
                GroupRow.chat_jid == JID
            )
        ).one()
    # The taker is the place, though far-host looks alive: its queue may have no reader.
    assert taken[0] == mine and taken[2] == "near-host"
    # Not before the holder had been quiet for the while, and long before its 60 s expiry.
    assert taken[1] - last >= timedelta(seconds=leases.TAKE_OVER_AFTER_S)
    assert taken[1] - last < timedelta(seconds=30)


def test_a_live_holder_whose_token_looks_gone_keeps_its_lease_while_it_renews(
    db: Database, holder: tuple[subprocess.Popen[str], str]
) -> None:
    proc, owner = holder
    token = _token(db, owner)
    process = hosts.owner_process(owner)
    assert process is not None
    if db.is_sqlite:
        # A token of a file nobody holds: as if its process were gone.
        folder = liveness.liveness_folder(db)
        assert folder is not None
        (folder / "released").touch()
        with db.write() as session:
            session.execute(
                update(ProcessLivenessRow)
                .where(ProcessLivenessRow.host_id == process[0], ProcessLivenessRow.pid == process[1])
                .values(token="flock:released")
            )
        assert liveness.gone(db, ["flock:released"]) == {"flock:released"}
    else:
        # The server ends its session (as pg_terminate_backend, or a restart of one backend).
        with db.read() as session:
            session.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": int(token.split(":")[1])})
        wait_until(lambda: _token(db, owner) != token, 10, "the holder making its token again")
        assert liveness.gone(db, [token]) == {token} and liveness.gone(db, [_token(db, owner)]) == set()
    mine = hosts.process_owner("near-host")
    deadline = time.monotonic() + 3 * leases.TAKE_OVER_AFTER_S
    while time.monotonic() < deadline:
        assert not leases.acquire(db, JID, mine, 60)  # it renews: never taken
        assert dead_holders(db, "near-host") == []
        time.sleep(0.2)
    assert proc.poll() is None


def test_what_is_no_verdict(db: Database) -> None:
    ensure_main_group(db)
    # Tokens of another kind, malformed, or a file that is not there: never "gone".
    assert liveness.gone(db, ["pg:x:1", "flock:", "flock:../x", "other", "flock:not-there"]) == set()
    # A holder that never registered a token waits for the usual rules.
    assert leases.acquire(db, JID, f"far-host:{2**22 + 7}:0badf00d", 60)
    with db.write() as session:
        session.execute(update(GroupRow).values(lease_renewed_at=hosts.database_now(db) - timedelta(minutes=5)))
    assert dead_holders(db, "near-host") == []
    assert not leases.acquire(db, JID, hosts.process_owner("near-host"), 60)
    assert liveness.server_settled(db)
