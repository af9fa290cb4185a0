"""A run's egress log read back (orchestrator/run/egress_log.py): the decisions of the run's
``egress_log`` records, and of nothing else the run stored, however its metadata looks."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.errors import NotFound
from orchestrator.model.messages import SENDER_BOT, SENDER_EGRESS_LOG, SENDER_SYSTEM
from orchestrator.run.egress_log import run_egress
from orchestrator.store.db import Database
from orchestrator.store.message_log import now_iso, store_message_direct
from orchestrator.store.runs import create_run

JID = "main@local"


def _decision(host: str, allowed: bool) -> dict[str, Any]:
    return {"at": 1.0, "method": "GET", "host": host, "port": 443, "allowed": allowed,
            "reason": "allowed" if allowed else "not on the allowlist", "sent": 1, "received": 2}  # fmt: skip


def _stored(db: Database, mid: str, sender: str, message_type: str, metadata: dict[str, Any]) -> None:
    store_message_direct(
        db=db, id=mid, chat_jid=JID, timestamp=now_iso(), is_from_me=True, sender=sender, sender_name=sender,
        content="words", message_type=message_type, metadata=metadata,
    )  # fmt: skip


def test_only_the_runs_egress_records_are_read(db: Database) -> None:
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    other = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    # Look-alikes: metadata of the same shape on what is no egress_log record, or another run's.
    decoy = {"decisions": [_decision("decoy.test", True)], "left_out": 100, "bytes": 100}
    _stored(db, f"{run.id}-0001", SENDER_BOT, "assistant", decoy)
    _stored(db, f"{run.id}-0002", SENDER_SYSTEM, "system", decoy)
    _stored(db, f"{other.id}-egress-0000", SENDER_EGRESS_LOG, "system", decoy)
    # Two attempts, two records: the log is both.
    _stored(db, f"{run.id}-egress-0000", SENDER_EGRESS_LOG, "system",
            {"decisions": [_decision("a.test", True)], "left_out": 1, "bytes": 10})  # fmt: skip
    _stored(db, f"{run.id}-egress-0001", SENDER_EGRESS_LOG, "system",
            {"decisions": [_decision("b.test", False)], "left_out": 2, "bytes": 20})  # fmt: skip

    log = run_egress(db, run.id)
    assert [(d.host, d.allowed) for d in log.decisions] == [("a.test", True), ("b.test", False)]
    assert (log.left_out, log.bytes) == (3, 30)
    quiet = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    assert run_egress(db, quiet.id).decisions == []
    with pytest.raises(NotFound):
        run_egress(db, "no-such-run")
