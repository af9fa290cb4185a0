"""Failures end in the right state, with the container gone and the right
host message: crashes (retried while no reply was stored), partial output
(never replayed), garbage, hangs, cancels, and runs whose worker died.

Real Docker and a real agent image with a misbehaving front end
(``faulty_agent/fault.py``); the pipeline runs in-process.
"""

from __future__ import annotations

import threading
import time

import docker
import pytest

from fakes.channel import RecordingChannel, attach_recorder
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.sweeper import sweep
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after, now_iso, store_message_direct
from orchestrator.store.runs import cancel_run, create_run, get_run, list_runs


@pytest.fixture
def faulty(settings: Settings, db: Database, faulty_image: str) -> tuple[Pipeline, RecordingChannel]:
    s = settings.replace(**{"agent_image": faulty_image, "run_timeout_s": 4.0, "retry_base_s": 0.05, "max_attempts": 3})
    s.ensure_dirs()
    ensure_main_group(db)
    rec = attach_recorder(db, "main@local")
    return Pipeline(s, db, ChannelRegistry([rec])), rec


def _say(p: Pipeline, text: str) -> StoredMessage:
    return ingest(
        p.db, p.settings, IncomingMessage(chat_jid="main@local", sender="u", content=text), signal=None
    ).message


def _no_containers_left(p: Pipeline) -> bool:
    """None of this test's installation's containers is left (another test process may have its own)."""
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={p.settings.install_id}"]
    return docker.from_env().containers.list(all=True, filters={"label": labels}) == []


def _hosts(rec: RecordingChannel) -> list[str]:
    return [m.content for m in rec.sent if m.message_type == "host"]


def test_crash_before_output_is_retried_then_fails(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    p, rec = faulty
    _say(p, "crash")
    [outcome] = p.drain_group("main@local")
    assert outcome.run.state == "failed" and outcome.run.attempts == 3
    assert "status 3" in (outcome.run.error or "")
    assert [m.message_type for m in rec.sent] == ["user", "host"]  # the person's message is shown too
    assert _hosts(rec)[0].startswith("⚠️ Agent error")
    assert _no_containers_left(p)


def test_flaky_container_succeeds_on_a_later_attempt(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    p, rec = faulty
    _say(p, "flaky 1\n$ echo recovered")
    [outcome] = p.drain_group("main@local")
    assert outcome.run.state == "succeeded" and outcome.run.attempts == 2
    replies = [m for m in rec.sent if m.sender == "bot"]
    assert len(replies) == 1 and "recovered" in replies[0].content
    assert _hosts(rec) == []


def test_output_then_crash_is_never_replayed(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    p, rec = faulty
    sent = _say(p, "partial-crash")
    [outcome] = p.drain_group("main@local")
    assert outcome.run.state == "failed" and outcome.run.attempts == 1
    assert [m.content for m in rec.sent if m.sender == "bot"] == ["half an answer"]
    assert len(_hosts(rec)) == 1
    assert get_group(p.db, "main@local").cursor_seq == sent.seq
    assert p.drain_group("main@local") == []  # nothing pending: no replay


def test_the_token_budget_is_the_runs_across_its_retries(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    """An attempt spends through the gateway, then crashes; the retry starts
    from what the run has spent, not from zero (each attempt has its own
    gateway), so the budget refuses the retry's first request."""
    from fakes.anthropic_api import FakeAnthropic, message

    p, _ = faulty
    fake = FakeAnthropic(message([{"type": "text", "text": "spent"}], "end_turn", n=90))  # 900 in + 90 out
    with fake.serve() as base_url:
        p.settings = p.settings.replace(
            **{
                "model": "anthropic:claude-fake-1",
                "anthropic_base_url": base_url,
                "anthropic_api_key": "k",
                "run_token_budget": 1000,
                "max_tokens": 16,
                "max_attempts": 2,
                # The Anthropic SDK's import alone takes seconds of CPU on a loaded
                # 2-core machine: the fixture's 4 s limit is for the hang tests.
                "run_timeout_s": 60,
            }
        )
        _say(p, "spend-crash")
        [outcome] = p.drain_group("main@local")
    run = outcome.run
    assert run.state == "failed" and run.attempts == 2, run
    assert "budget" in (run.error or ""), run.error
    assert len(fake.calls) == 1  # the retry's request never went upstream
    assert (run.input_tokens, run.output_tokens) == (900, 90)


def test_garbage_output_fails_cleanly(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    p, rec = faulty
    _say(p, "garbage")
    [outcome] = p.drain_group("main@local")
    assert outcome.run.state == "failed"
    assert "2 unreadable output line(s)" in (outcome.run.error or "")
    assert len(_hosts(rec)) == 1 and _no_containers_left(p)


def test_hang_past_the_hard_limit_times_out(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    p, rec = faulty
    _say(p, "hang")
    t0 = time.monotonic()
    [outcome] = p.drain_group("main@local")
    assert outcome.run.state == "timed_out" and outcome.run.attempts == 1
    assert time.monotonic() - t0 < 20
    assert "limit" in _hosts(rec)[0] and _no_containers_left(p)


def test_memory_hog_ends_the_run_with_a_host_message(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    p, rec = faulty
    p.settings = p.settings.replace(**{"container_memory": "64m", "max_attempts": 1})
    _say(p, "memhog")
    [outcome] = p.drain_group("main@local")
    assert outcome.run.state == "failed" and "137" in (outcome.run.error or "")
    assert len(_hosts(rec)) == 1 and _no_containers_left(p)


def test_cancel_stops_the_container(faulty: tuple[Pipeline, RecordingChannel]) -> None:
    p, rec = faulty
    p.settings = p.settings.replace(**{"run_timeout_s": 60.0})
    _say(p, "$ sleep 50")

    def cancel_when_running() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = [r for r in list_runs(p.db) if r.state == "running" and r.container_id]
            if running:
                cancel_run(p.db, running[0].id)
                return
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_when_running)
    canceller.start()
    t0 = time.monotonic()
    [outcome] = p.drain_group("main@local")
    canceller.join()
    assert outcome.run.state == "cancelled"
    assert time.monotonic() - t0 < 15
    assert _hosts(rec) == ["🛑 Run cancelled."] and _no_containers_left(p)


def test_sweeper_closes_a_dead_workers_run(settings: Settings, db: Database) -> None:
    ensure_main_group(db)
    signals: list[str] = []
    # A run that died before replying: closed, and its message stays pending.
    msg = ingest(db, settings, IncomingMessage(chat_jid="main@local", sender="u", content="hi"), signal=None).message
    assert leases.acquire(db, "main@local", "dead-worker", 0.1)
    quiet = create_run(
        db, chat_jid="main@local", cursor_from=0, cursor_to=msg.seq, celery_task_id=None, owner="dead-worker"
    )
    time.sleep(0.2)
    report = sweep(db, signal=signals.append)
    assert report.interrupted_runs == [quiet.id] and signals == ["main@local"]
    assert get_run(db, quiet.id).state == "failed"
    assert get_group(db, "main@local").cursor_seq == 0  # still pending: will be answered

    # A run that died after replying: closed, cursor moved on, host message.
    assert leases.acquire(db, "main@local", "dead-worker-2", 0.1)
    loud = create_run(
        db, chat_jid="main@local", cursor_from=0, cursor_to=msg.seq, celery_task_id=None, owner="dead-worker-2"
    )
    store_message_direct(
        db=db,
        id=f"{loud.id}-0001",
        chat_jid="main@local",
        sender="bot",
        sender_name="Andy",
        content="partial",
        timestamp=now_iso(),
        is_from_me=True,
        message_type="assistant",
    )
    time.sleep(0.2)
    signals.clear()
    report = sweep(db, signal=signals.append)
    assert report.interrupted_runs == [loud.id] and signals == []
    assert get_group(db, "main@local").cursor_seq == msg.seq
    hosts = [m for m in get_messages_after("main@local", 0, db=db) if m.message_type == "host"]
    assert len(hosts) == 1 and "interrupted" in hosts[0].content
    assert all(m.role != "host" for m in format_messages_for_sdk(get_messages_after("main@local", 0, db=db)))

    # A live run (lease held and fresh) is left alone.
    assert leases.acquire(db, "main@local", "live-worker", 30)
    live = create_run(
        db, chat_jid="main@local", cursor_from=msg.seq, cursor_to=msg.seq, celery_task_id=None, owner="live-worker"
    )
    assert sweep(db, signal=signals.append).interrupted_runs == []
    assert get_run(db, live.id).state == "queued"
