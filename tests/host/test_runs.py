"""Run records: state transitions, cancel, and who gets the last word."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import StoreError
from orchestrator.store.db import Database
from orchestrator.store.runs import cancel_run, create_run, finish_run, get_run, list_runs, set_attempts, set_container


def test_states_from_queued_to_done(db: Database) -> None:
    run = create_run(db, chat_jid="c", cursor_from=0, cursor_to=3, celery_task_id="t-1", owner="w")
    assert run.state == "queued" and run.attempts == 1 and run.created_at.tzinfo is not None
    set_container(db, run.id, "abc123")
    assert get_run(db, run.id).state == "running"
    set_attempts(db, run.id, 2, "crashed")
    again = get_run(db, run.id)
    assert again.state == "queued" and again.attempts == 2 and again.container_id is None
    set_container(db, run.id, "def456")
    done = finish_run(db, run.id, state="succeeded", input_tokens=10, output_tokens=5)
    assert done.state == "succeeded" and done.duration_s is not None and done.duration_s >= 0
    assert done.finished_at is not None and done.finished_at.tzinfo is not None
    # The first verdict stands: a late second finish changes nothing.
    assert finish_run(db, run.id, state="failed", error="late").state == "succeeded"
    assert get_run(db, run.id[:8]).id == run.id  # a unique prefix is enough
    assert [r.id for r in list_runs(db, chat_jid="c", state="succeeded")] == [run.id]


def test_cancel_outranks_how_the_run_ended(db: Database) -> None:
    run = create_run(db, chat_jid="c", cursor_from=0, cursor_to=1, celery_task_id=None)
    set_container(db, run.id, "abc")
    assert cancel_run(db, run.id).state == "cancelled"
    ended = finish_run(db, run.id, state="failed", error="killed")
    assert ended.state == "cancelled" and ended.finished_at is not None
    # An ended run cannot be cancelled any more.
    other = create_run(db, chat_jid="c", cursor_from=1, cursor_to=2, celery_task_id=None)
    finish_run(db, other.id, state="succeeded")
    assert cancel_run(db, other.id).state == "succeeded"
    with pytest.raises(StoreError):
        cancel_run(db, "no-such-run")
