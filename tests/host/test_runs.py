"""Run records: state transitions, cancel, and who gets the last word."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo

import pytest

from orchestrator.core.errors import NotFound, StoreError
from orchestrator.store.db import Database
from orchestrator.store.runs import (
    cancel_run,
    create_run,
    finish_run,
    get_run,
    list_runs,
    park_run,
    parked_of,
    resume_run,
    set_container,
    unfinished_runs,
)


def test_states_from_queued_to_done(db: Database) -> None:
    run = create_run(db, chat_jid="c", cursor_from=0, cursor_to=3, celery_task_id="t-1", owner="w")
    assert run.state == "queued" and run.attempts == 1 and run.created_at.tzinfo is not None
    set_container(db, run.id, "abc123")
    assert get_run(db, run.id).state == "running"
    retry_at = datetime.now(UTC) + timedelta(seconds=30)
    parked = park_run(db, run.id, attempts=2, error="crashed", retry_at=retry_at, input_tokens=3, output_tokens=1)
    again = get_run(db, run.id)
    assert again == parked
    assert (again.state, again.attempts, again.container_id, again.retry_at) == ("queued", 2, None, retry_at)
    assert (again.input_tokens, again.output_tokens, again.error) == (3, 1, "crashed")
    assert parked_of(unfinished_runs(db, "c")) == again and parked_of(unfinished_runs(db, "other")) is None
    resume_run(db, run.id, owner="w2", celery_task_id="t-2")
    assert parked_of(unfinished_runs(db, "c")) is None
    resumed = get_run(db, run.id)
    assert (resumed.retry_at, resumed.owner, resumed.celery_task_id) == (None, "w2", "t-2")
    set_container(db, run.id, "def456")
    done = finish_run(db, run.id, state="succeeded", input_tokens=10, output_tokens=5)
    assert done.state == "succeeded" and done.duration_s is not None and done.duration_s >= 0
    assert done.finished_at is not None and done.finished_at.tzinfo is not None
    # The first verdict stands: a late second finish changes nothing.
    assert finish_run(db, run.id, state="failed", error="late").state == "succeeded"
    assert get_run(db, run.id[:8]).id == run.id  # a unique prefix is enough
    # A prefix is taken literally: a wildcard in it matches no run (the only one here).
    for wild in ("%", "_" + run.id[1:8]):
        with pytest.raises(NotFound):
            get_run(db, wild)
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


def test_a_cancel_before_the_container_is_up_stays(db: Database) -> None:
    # The container is recorded, the run is not made running again: the worker's stop watch
    # reads "cancelled" and stops it.
    run = create_run(db, chat_jid="c", cursor_from=0, cursor_to=1, celery_task_id=None)
    assert cancel_run(db, run.id).state == "cancelled"
    set_container(db, run.id, "abc")
    after = get_run(db, run.id)
    assert (after.state, after.container_id) == ("cancelled", "abc")
    set_container(db, "no-such-run", "def")  # a run that is gone: nothing to update, no error


def test_a_runs_times_are_the_databases_whatever_the_hosts_clock(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    # The quotas count a group's runs in the database's last hour: a host two
    # hours ahead must not make its runs look fresh for two more hours.
    from orchestrator.store import runs as runs_module
    from orchestrator.store.hosts import database_now

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> Ahead:
            return super().now(tz) + timedelta(hours=2)

    monkeypatch.setattr(runs_module, "datetime", Ahead)
    before = database_now(db)
    run = create_run(db, chat_jid="main@local", cursor_from=0, cursor_to=1, celery_task_id=None)
    done = finish_run(db, run.id, state="succeeded")
    after = database_now(db)
    assert before - timedelta(seconds=1) <= run.created_at <= after
    assert done.finished_at is not None and before - timedelta(seconds=1) <= done.finished_at <= after
    assert done.duration_s is not None and 0 <= done.duration_s < 5
