"""Runs' egress logs are kept ``ORCHESTRATOR_EGRESS_LOG_RETENTION_DAYS`` (30 by default; 0:
for ever): the sweeper deletes the older ``egress_log`` records, a bounded batch at a time, on
the real database (both backends).  Age is the database's ``stored_at``, never the
``timestamp`` a message carries; nothing but those records goes."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import update

from orchestrator.cli.runs import print_egress
from orchestrator.core.errors import SettingsError
from orchestrator.core.settings import Settings
from orchestrator.model.messages import SENDER_EGRESS_LOG
from orchestrator.run import sweeper
from orchestrator.run.egress_log import run_egress
from orchestrator.run.sweeper import (
    EGRESS_LOG_BATCH,
    EGRESS_LOG_BATCHES,
    EGRESS_LOG_EVERY_S,
    EgressLogRetention,
    sweep,
)
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after, now_iso, store_message_direct
from orchestrator.store.runs import create_run, finish_run
from orchestrator.store.tables import MessageRow

JID = "main@local"


def egress_record(db: Database, *, days_old: float, timestamp: str | None = None) -> str:
    """A run with an egress log of one decision stored ``days_old`` days ago; the run's id."""
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    finish_run(db, run.id, state="succeeded")
    decision = {"at": time.time(), "method": "CONNECT", "host": "pypi.org", "port": 443, "allowed": True,
                "reason": "allowed", "sent": 10, "received": 20}  # fmt: skip
    mid = f"{run.id}-egress-0000"
    store_message_direct(
        db=db, id=mid, chat_jid=JID, timestamp=timestamp or now_iso(), is_from_me=True, sender=SENDER_EGRESS_LOG,
        sender_name="egress", content="1 egress decision(s)", message_type="system",
        metadata={"decisions": [decision], "left_out": 0, "bytes": 30, "run_id": run.id},
    )  # fmt: skip
    _age(db, mid, days_old)
    return run.id


def _age(db: Database, mid: str, days_old: float) -> None:
    with db.write() as session:
        session.execute(
            update(MessageRow)
            .where(MessageRow.id == mid)
            .values(stored_at=db.now() - timedelta(days=days_old))
        )  # fmt: skip


def _kept(db: Database, run_id: str) -> bool:
    return bool(run_egress(db, run_id).decisions)


@pytest.fixture
def main(db: Database) -> Database:
    ensure_main_group(db)
    return db


def test_an_old_egress_log_goes_and_a_new_one_stays(main: Database, capsys: pytest.CaptureFixture[str]) -> None:
    db = main
    old = egress_record(db, days_old=31)
    new = egress_record(db, days_old=29, timestamp="2001-01-01T00:00:00.000Z")  # a sender's word: not its age
    # Other messages as old (a message named like the record's sender that is not a system
    # one cannot be stored at all: message_log.py).
    for mid, sender, kind in (("u1", "ann", "user"), ("s1", "system", "system")):
        store_message_direct(
            db=db, id=mid, chat_jid=JID, timestamp=now_iso(), is_from_me=False, sender=sender,
            sender_name=sender, content="kept", message_type=kind,
        )  # fmt: skip
        _age(db, mid, 400)
    assert _kept(db, old) and _kept(db, new)

    assert sweep(db, signal=None).deleted_egress_logs == 0  # no retention given: kept for ever
    assert sweep(db, signal=None, egress_log_retention_days=0).deleted_egress_logs == 0
    assert _kept(db, old)

    report = sweep(db, signal=None, egress_log_retention_days=30)
    assert report.deleted_egress_logs == 1
    assert not _kept(db, old) and _kept(db, new)
    left = {m.id for m in get_messages_after(JID, 0, db=db)}
    assert {"u1", "s1", f"{new}-egress-0000"} <= left and f"{old}-egress-0000" not in left
    assert sweep(db, signal=None, egress_log_retention_days=30).deleted_egress_logs == 0
    print_egress(run_egress(db, old))  # what `orchestrator runs show RUN --egress` says of it now
    assert "its log is past its retention" in capsys.readouterr().out


def test_a_backlog_goes_a_bounded_batch_at_a_time(main: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    db = main
    monkeypatch.setattr(sweeper, "EGRESS_LOG_BATCH", 2)
    monkeypatch.setattr(sweeper, "EGRESS_LOG_BATCHES", 2)
    runs = [egress_record(db, days_old=100 - i) for i in range(5)]
    fresh = egress_record(db, days_old=1)
    assert sweep(db, signal=None, egress_log_retention_days=30).deleted_egress_logs == 4  # 2 batches of 2
    assert [_kept(db, r) for r in runs] == [False, False, False, False, True]  # the oldest first
    assert sweep(db, signal=None, egress_log_retention_days=30).deleted_egress_logs == 1
    assert not _kept(db, runs[-1]) and _kept(db, fresh)


def test_the_setting() -> None:
    assert Settings.load(env_file=None, environ={}).egress.log_retention_days == 30
    assert (
        Settings.load(env_file=None, environ={"ORCHESTRATOR_EGRESS_LOG_RETENTION_DAYS": "0"}).egress.log_retention_days
        == 0
    )
    with pytest.raises(SettingsError, match="ORCHESTRATOR_EGRESS_LOG_RETENTION_DAYS"):
        Settings.load(env_file=None, environ={"ORCHESTRATOR_EGRESS_LOG_RETENTION_DAYS": "-1"})


def test_a_process_looks_hourly_unless_a_backlog_is_left() -> None:
    retention = EgressLogRetention(30)
    assert retention.days_now(100.0) == 30  # the first sweep looks
    retention.looked(100.0, deleted=3)
    assert retention.days_now(101.0) == 0 and retention.days_now(100.0 + EGRESS_LOG_EVERY_S) == 30
    retention.looked(5000.0, deleted=EGRESS_LOG_BATCH * EGRESS_LOG_BATCHES)  # its whole budget: more are left
    assert retention.days_now(5000.0) == 30
    assert EgressLogRetention(0).days_now(0.0) == 0  # kept for ever
