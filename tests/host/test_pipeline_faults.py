"""The pipeline's fault logic, with a fake sandbox and a clock that jumps (no Docker, no sleeps).

Retries and their backoff, no replay after a reply, errors the agent says are
final, cancel, a lost lease, the sandbox's time limit and the task queue's
deadline: each decided by the pipeline itself, so each is driven here through
``fakes/sandbox.py`` on both databases.  The real-Docker versions of the
same stories stay in ``tests/integration/test_failures.py``.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from agent_runner.protocol import AssistantEvent, ErrorEvent, ResultEvent, ToolResultEvent
from fakes.channel import attach_recorder
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.clock import SYSTEM_CLOCK, Clock
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.sweeper import sweep
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group, get_group, update_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import cancel_run, get_run, list_runs
from orchestrator.store.tables import GroupRow, RunRow

JID = "main@local"
OK = Script([AssistantEvent(text="done"), ResultEvent()])
CRASH = Script([], exit_code=1, stderr="Traceback: boom")


class Deadline(Exception):
    """Stands for Celery's SoftTimeLimitExceeded."""


def _pipeline(
    settings: Settings,
    db: Database,
    sandbox: FakeSandbox,
    clock: Clock,
    deadline_exceptions: tuple[type[BaseException], ...] = (),
) -> Pipeline:
    s = settings.replace(**{"max_attempts": 3, "retry_base_s": 10.0, "retry_max_s": 60.0})
    ensure_main_group(db)
    rec = attach_recorder(db, JID)
    return Pipeline(s, db, ChannelRegistry([rec]), sandbox, clock=clock, deadline_exceptions=deadline_exceptions)


def _say(p: Pipeline, text: str = "hello") -> StoredMessage:
    return ingest(p.db, p.settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=None).message


def _from(p: Pipeline, sender: str) -> list[str]:
    return [m.content for m in get_messages_after(JID, 0, db=p.db) if m.sender == sender]


def test_a_crash_is_retried_with_the_backoff_and_the_reply_comes_once(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(CRASH, CRASH, OK)
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "succeeded", outcome.run.error
    assert len(sandbox.started) == 3 and get_run(db, outcome.run.id).attempts == 3
    # The same recorded input every attempt.
    assert len({inp.run_id for _, inp in sandbox.started}) == 1
    # Two backoffs, from the policy (uniform(d/2, d), d = 10·2ⁿ⁻¹), waited on the clock: no real sleep.
    first, second = clock.waits_of("MainThread")
    assert 5 <= first <= 10 and 10 <= second <= 20
    assert _from(p, "bot") == ["done"] and _from(p, "host") == []


def test_attempts_stop_at_max_attempts_with_one_error_message(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(CRASH)
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "failed" and "exited with status 1" in (outcome.run.error or "")
    assert "boom" in (outcome.run.error or "")  # the stderr tail says why
    assert len(sandbox.started) == 3 and len(clock.waits_of("MainThread")) == 2
    [host] = _from(p, "host")
    assert host.startswith("⚠️ Agent error")
    assert get_group(db, JID).cursor_seq == outcome.run.cursor_to  # the batch is done with, not retried forever


def test_a_run_that_already_replied_is_never_replayed(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(Script([AssistantEvent(text="half an answer")], exit_code=1), OK)
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "failed"
    assert len(sandbox.started) == 1 and clock.waits_of("MainThread") == []
    assert _from(p, "bot") == ["half an answer"]


def test_an_error_the_agent_calls_final_is_not_retried(settings: Settings, db: Database) -> None:
    clock = FakeClock()
    sandbox = FakeSandbox(Script([ErrorEvent(message="bad API key", retryable=False)], exit_code=1))
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert (outcome.run.state, outcome.run.error) == ("failed", "bad API key")
    assert len(sandbox.started) == 1


def test_a_retryable_error_is_retried(settings: Settings, db: Database) -> None:
    clock = FakeClock()
    sandbox = FakeSandbox(Script([ErrorEvent(message="overloaded", retryable=True)], exit_code=1), OK)
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "succeeded" and len(sandbox.started) == 2


def _in_background(p: Pipeline) -> tuple[threading.Thread, list[object]]:
    outcomes: list[object] = []
    t = threading.Thread(target=lambda: outcomes.extend(p.drain_group(JID)), name="drain")
    t.start()
    return t, outcomes


def test_cancel_stops_the_agent_and_says_so(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(Script([AssistantEvent(text="working")], hang=True))
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    thread, outcomes = _in_background(p)
    assert sandbox.agent_started.wait(30) and sandbox.agents[0].started_reading.wait(30)
    [run] = list_runs(db, chat_jid=JID)
    cancel_run(db, run.id)
    thread.join(30)
    assert not thread.is_alive()
    [outcome] = outcomes
    assert outcome.run.state == "cancelled"  # type: ignore[attr-defined]
    assert sandbox.agents[0].killed.is_set() and len(sandbox.started) == 1
    assert _from(p, "host") == ["🛑 Run cancelled."]


def test_a_lost_lease_stops_the_agent_and_leaves_the_run_to_the_new_holder(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(Script([], hang=True), OK)
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    thread, outcomes = _in_background(p)
    assert sandbox.agent_started.wait(30) and sandbox.agents[0].started_reading.wait(30)
    # Another worker took the group (this one's lease expired meanwhile): the next renewal fails.
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(lease_owner="another-worker"))
    thread.join(30)
    assert not thread.is_alive()
    [outcome] = outcomes
    # Neither ended nor announced by the replaced holder: that would answer beside the new one.
    assert outcome.run.finished_at is None and _from(p, "host") == []  # type: ignore[attr-defined]
    assert sandbox.agents[0].killed.is_set() and len(sandbox.started) == 1
    # The new holder closes it before its own run (no output: the message is answered once, by it).
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(lease_owner=None))
    [answered] = _pipeline(settings, db, sandbox, clock).drain_group(JID)
    assert answered.run.state == "succeeded" and _from(p, "bot") == ["done"]
    [*_, first] = list_runs(db, chat_jid=JID)
    assert first.id == outcome.run.id and first.state == "failed" and "interrupted" in (first.error or "")  # type: ignore[attr-defined]


def test_a_replaced_holder_stores_nothing_more(settings: Settings, db: Database) -> None:
    """Fencing: this host looked dead (a pause past the liveness window) and another
    worker took the group over while this one's agent still ran.  Its next output is
    refused in the transaction that would have stored it, and its agent is stopped, before
    its heartbeat even notices."""
    clock = FakeClock()

    def taken_over(index: int) -> None:
        if index == 1:
            with db.write() as session:
                session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(lease_owner="new-holder:1:x"))

    sandbox = FakeSandbox(
        Script(
            [AssistantEvent(text="first"), AssistantEvent(text="second"), ResultEvent()],
            hang=True,
            before_event=taken_over,
        )
    )
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert _from(p, "bot") == ["first"] and _from(p, "host") == []
    assert sandbox.agents[0].killed.is_set() and outcome.run.finished_at is None
    with db.read() as session:  # the lease stays the new holder's
        assert session.scalar(select(GroupRow.lease_owner).where(GroupRow.chat_jid == JID)) == "new-holder:1:x"


def test_a_holder_replaced_just_before_its_runs_end_commits_none_of_the_end(
    settings: Settings,
    db: Database,
) -> None:
    """The run's end is one transaction, fenced by the statement that lets the lease go: taken
    over after the reply but before the end, the old holder stores no record, moves no
    cursor, ends no run and frees no slot, and its outcome says the run is unfinished."""
    clock = FakeClock()

    def taken_over(index: int) -> None:
        if index == 1:  # the reply is stored; the result (no output) and the end come next
            with db.write() as session:
                session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(lease_owner="new-holder:1:x"))

    sandbox = FakeSandbox(Script([AssistantEvent(text="first"), ResultEvent()], before_event=taken_over))
    p = _pipeline(settings, db, sandbox, clock)
    asked = _say(p)
    step = p.step(JID)
    assert step.outcome is not None and step.outcome.run.finished_at is None and not step.freed_slot
    assert _from(p, "bot") == ["first"] and _from(p, "result_meta") == []
    [run] = list_runs(db, chat_jid=JID)
    assert run.finished_at is None and run.state == "running"
    group = get_group(db, JID)
    assert group.cursor_seq < asked.seq
    with db.read() as session:  # the lease stays the new holder's
        assert session.scalar(select(GroupRow.lease_owner).where(GroupRow.chat_jid == JID)) == "new-holder:1:x"


def test_the_sandbox_time_limit_ends_the_run_timed_out_without_retry(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(Script([], exit_code=137, timed_out=True))
    p = _pipeline(settings, db, sandbox, clock)
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "timed_out" and "limit" in (outcome.run.error or "")
    assert len(sandbox.started) == 1


def test_the_task_deadline_ends_the_run_timed_out_without_retry(settings: Settings, db: Database) -> None:
    clock = FakeClock()
    sandbox = FakeSandbox(Script([AssistantEvent(text="started")], raise_after_events=Deadline()))
    p = _pipeline(settings, db, sandbox, clock, deadline_exceptions=(Deadline,))
    _say(p)
    [outcome] = p.drain_group(JID)
    assert outcome.run.state == "timed_out" and len(sandbox.started) == 1
    assert sandbox.agents[0].killed.is_set()  # leaving the sandbox's context stopped it


def test_a_group_is_drained_once_by_two_pipelines_at_once(settings: Settings, db: Database) -> None:
    clock = FakeClock()
    sandboxes = [FakeSandbox(OK) for _ in range(2)]
    pipelines = [_pipeline(settings, db, sb, clock) for sb in sandboxes]
    _say(pipelines[0])
    threads = [threading.Thread(target=p.drain_group, args=(JID,)) for p in pipelines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(len(sb.started) for sb in sandboxes) == 1
    assert _from(pipelines[0], "bot") == ["done"]


def test_a_failed_attempt_parks_the_run_and_the_next_step_resumes_it_when_due(settings: Settings, db: Database) -> None:
    # The system clock: the sweeper judges "due" by it too.
    sandbox = FakeSandbox(
        Script([ToolResultEvent(tool_use_id="t1", name="bash", output="ran", exit_code=0)], exit_code=1), OK
    )
    p = _pipeline(settings, db, sandbox, SYSTEM_CLOCK)
    _say(p)
    first = p.step(JID)
    assert first.outcome is not None and first.retry_in is not None and 5 <= first.retry_in <= 10
    parked = get_run(db, first.outcome.run.id)
    assert (parked.state, parked.attempts, parked.retry_at is not None) == ("queued", 2, True)
    assert get_group(db, JID).cursor_seq == 0  # its batch is still to be answered
    with db.read() as session:  # no lease held while it waits
        assert session.scalar(select(GroupRow.lease_owner).where(GroupRow.chat_jid == JID)) is None
    # Not due: a step returns at once, and the sweeper neither closes it nor signals the group.
    assert p.step(JID).retry_in is not None and len(sandbox.started) == 1
    signals: list[str] = []
    report = sweep(db, signal=signals.append)
    assert report.interrupted_runs == [] and signals == []
    # Due (its time set back): the sweeper signals the group, the next step resumes the same run.
    with db.write() as session:
        session.execute(
            update(RunRow).where(RunRow.id == parked.id).values(retry_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    assert sweep(db, signal=signals.append).interrupted_runs == [] and signals == [JID]
    second = p.step(JID)
    assert second.outcome is not None and second.outcome.run.id == parked.id
    assert (second.outcome.run.state, second.outcome.run.attempts, second.retry_in) == ("succeeded", 2, None)
    assert [inp.run_id for _, inp in sandbox.started] == [parked.id, parked.id]  # the recorded input again
    # Outputs numbered on across attempts: the first attempt's tool record and the reply, no id reused;
    # then the run's result_meta record.
    ids = [m.id for m in get_messages_after(JID, 0, db=db) if m.id.startswith(parked.id)]
    assert ids == [f"{parked.id}-0001", f"{parked.id}-0002", f"{parked.id}-meta"] and _from(p, "bot") == ["done"]


def test_a_run_cancelled_while_parked_ends_at_the_next_step(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(CRASH, OK)
    p = _pipeline(settings, db, sandbox, clock)
    msg = _say(p)
    first = p.step(JID)
    assert first.outcome is not None and first.retry_in is not None
    cancel_run(db, first.outcome.run.id)
    clock.advance(first.retry_in)
    ended = p.step(JID)
    assert ended.outcome is not None and ended.outcome.run.state == "cancelled"
    assert len(sandbox.started) == 1 and _from(p, "host") == ["🛑 Run cancelled."]
    assert get_group(db, JID).cursor_seq == msg.seq and ended.more is False  # its batch is done with


def test_one_step_is_one_run_and_says_more_is_pending(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(OK)
    p = _pipeline(settings, db, sandbox, clock)
    _say(p, "one")
    first = p.step(JID)
    _say(p, "two")  # arrives after the first run's batch was taken
    assert first.outcome is not None and first.outcome.run.state == "succeeded" and first.more is False
    second = p.step(JID)
    assert second.outcome is not None and second.more is False and len(sandbox.started) == 2
    _say(p, "three")
    _say(p, "four")
    third = p.step(JID)  # both in one batch
    assert third.outcome is not None and p.step(JID).outcome is None and len(sandbox.started) == 3


def test_a_group_over_its_quota_starts_nothing_and_is_told_once(settings: Settings, db: Database) -> None:
    clock, sandbox = FakeClock(), FakeSandbox(OK)
    p = _pipeline(settings, db, sandbox, clock)
    update_group(db, JID, {"runs_per_hour": 1})
    _say(p, "one")
    assert p.step(JID).outcome is not None and len(sandbox.started) == 1
    later = _say(p, "two")
    waiting = p.step(JID)
    assert waiting.outcome is None and waiting.quota is not None and waiting.quota.quota == "runs_per_hour"
    assert waiting.retry_in is not None and 3500 < waiting.retry_in <= 3600  # the first run turns an hour old
    signals: list[tuple[str, float | None]] = []
    p.follow_up(JID, waiting, lambda jid, countdown: signals.append((jid, countdown)))
    assert signals == [(JID, waiting.retry_in)]
    # The same wait seen again (every sweep re-signals a pending group): no second countdown,
    # no signal at once either; the first one brings the group back.
    again = p.step(JID)
    assert again.quota is not None and again.quota.until == waiting.quota.until
    assert again.retry_in is None and not again.more
    p.follow_up(JID, again, lambda jid, countdown: signals.append((jid, countdown)))
    assert signals == [(JID, waiting.retry_in)]
    assert p.drain_group(JID) == [] and len(sandbox.started) == 1  # in process too: nothing starts
    [notice] = _from(p, "host")
    assert notice.startswith("⏳ This group reached its quota of 1 run per hour; the next run starts at ")
    assert get_group(db, JID).cursor_seq < later.seq  # "two" still waits for its run
    # The first run's hour has passed (on the database's clock): the next step runs it.
    with db.write() as session:
        session.execute(
            update(RunRow).where(RunRow.chat_jid == JID).values(created_at=datetime.now(UTC) - timedelta(hours=2))
        )
    ran = p.step(JID)
    assert ran.outcome is not None and ran.outcome.run.state == "succeeded" and len(sandbox.started) == 2
    assert len(_from(p, "host")) == 1
