"""System notices are computed fresh and never stored; a run's recorded input
is rebuilt byte for byte from the stored history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestrator.core.settings import Settings
from orchestrator.run.assembly import (
    Batch,
    build_input,
    input_bytes,
    plan_batch,
    prior_messages,
    rebuild_input,
    record_input,
    stored_input,
)
from orchestrator.run.model_choice import model_settings
from orchestrator.run.notices import NoticeContext, compute_notices, scheduled_tasks_due
from orchestrator.run.schedules import add_task, change_state, get_task
from orchestrator.store.db import Database
from orchestrator.store.groups import Group, add_group, get_group
from orchestrator.store.history import edit_message
from orchestrator.store.message_log import get_messages_after, store_message_direct
from orchestrator.store.runs import create_run, finish_run
from orchestrator.store.schedules import live_tasks

JID = "dev@local"


@pytest.fixture
def group(db: Database, settings: Settings) -> Group:
    add_group(db, chat_jid=JID, name="Dev", folder="dev", requires_trigger=False)
    (settings.groups_dir / "dev").mkdir(parents=True, exist_ok=True)
    return get_group(db, JID)


def test_the_host_runs_nothing_in_a_hostile_repository(
    db: Database, settings: Settings, group: Group, tmp_path: Path
) -> None:
    """A workspace repository whose config makes git execute a command (fsmonitor
    on every status, a clean filter) and that has changes: computing the notices
    runs nothing on the host and says nothing about the workspace."""
    ws = settings.groups_dir / "dev"
    marker = tmp_path / "escaped"
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    with open(ws / ".git" / "config", "a") as fh:
        fh.write(f'[core]\n\tfsmonitor = touch {marker}\n[filter "x"]\n\tclean = touch {marker}\n')
    (ws / ".gitattributes").write_text("* filter=x\n")
    (ws / "f").write_text("x")
    with open(ws / "dump.sql", "wb") as fh:
        fh.truncate(60 * 1024 * 1024)  # sparse: no real disk use
    # The planted config does execute when git runs (as it did on the host):
    # checked on a copy, so the workspace itself is never touched by git here.
    probe = tmp_path / "probe"
    subprocess.run(["cp", "-a", str(ws), str(probe)], check=True)
    probe_marker = tmp_path / "probe-escaped"
    cfg = (probe / ".git" / "config").read_text().replace(str(marker), str(probe_marker))
    (probe / ".git" / "config").write_text(cfg)
    subprocess.run(["git", "-C", str(probe), "status", "--porcelain"], capture_output=True, check=False)
    assert probe_marker.exists(), "the planted config should run under a plain git status"

    notices = compute_notices(db, settings, group)
    assert not marker.exists()
    assert not any("uncommitted" in n or "large files" in n for n in notices), notices


def test_due_tasks_notice(db: Database, settings: Settings, group: Group) -> None:
    ctx = NoticeContext(db, settings, group)
    soon = datetime.now(UTC) + timedelta(minutes=20)
    add_task(db, chat_jid=JID, prompt="daily standup summary", kind="once", spec=soon.isoformat())
    add_task(db, chat_jid=JID, prompt="far away", kind="once", spec=(soon + timedelta(days=2)).isoformat())
    assert scheduled_tasks_due(ctx) == [
        f'Note: scheduled tasks due within the hour: "daily standup summary" at {soon:%H:%M} UTC.'
    ]


def test_the_run_path_reads_its_tasks_once_for_its_input_and_its_notice(
    db: Database, settings: Settings, group: Group
) -> None:
    soon = datetime.now(UTC) + timedelta(minutes=20)
    add_group(db, chat_jid="other@chat", name="Other", folder="other", requires_trigger=False)
    add_task(db, chat_jid=JID, prompt="daily standup summary", kind="once", spec=soon.isoformat())
    add_task(db, chat_jid="other@chat", prompt="another chat's", kind="once", spec=soon.isoformat())
    paused = add_task(db, chat_jid=JID, prompt="paused one", kind="once", spec=soon.isoformat())
    change_state(db, paused.id, "pause")
    done = add_task(db, chat_jid=JID, prompt="done one", kind="once", spec=soon.isoformat())
    change_state(db, done.id, "cancel")
    # The main group's run manages every chat's live tasks, as the list_tasks tool answers.
    tasks = live_tasks(db)
    assert [t.prompt for t in tasks] == ["daily standup summary", "another chat's", "paused one"]
    assert [t.prompt for t in live_tasks(db, JID)] == ["daily standup summary", "paused one"]
    assert tasks[0] == get_task(db, tasks[0].id)  # the same task as the ORM reads it
    # The notice, from the tasks already read: this chat's active ones only.
    want = [f'Note: scheduled tasks due within the hour: "daily standup summary" at {soon:%H:%M} UTC.']
    assert scheduled_tasks_due(NoticeContext(db, settings, group, tasks)) == want
    assert scheduled_tasks_due(NoticeContext(db, settings, group)) == want  # read here, the same


def test_notices_are_never_stored_and_a_broken_provider_is_skipped(
    db: Database, settings: Settings, group: Group
) -> None:
    run = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
    finish_run(db, run.id, state="failed", error="model said no\nsecond line")

    def broken(ctx: NoticeContext) -> list[str]:
        raise RuntimeError("provider bug")

    from orchestrator.run.notices import previous_run_failed

    notices = compute_notices(db, settings, group, [broken, previous_run_failed])
    assert notices == ["Note: the previous agent run in this chat ended as failed: model said no"]
    assert get_messages_after(JID, 0, include_superseded=True, db=db) == []


def _say(db: Database, mid: str, text: str, **meta: object) -> None:
    store_message_direct(
        db=db,
        id=mid,
        chat_jid=JID,
        sender="ann",
        sender_name="Ann",
        content=text,
        timestamp=datetime.now(UTC).isoformat(),
        metadata=meta or None,
    )


def _assemble(db: Database, settings: Settings) -> tuple[str, bytes]:
    """What the pipeline does before starting a container, for the group's pending messages."""
    group = get_group(db, JID)
    batch = plan_batch(get_messages_after(JID, group.cursor_seq, db=db))
    assert isinstance(batch, Batch)
    run = create_run(db, chat_jid=JID, cursor_from=group.cursor_seq, cursor_to=batch.cursor_to, celery_task_id=None)
    payload = build_input(
        settings=settings,
        group=group,
        run_id=run.id,
        prior=prior_messages(db, settings, group, batch, group.cursor_seq),
        batch=batch,
        assistant_name="Andy",
        notices=compute_notices(db, settings, group),
        model=model_settings(settings),
    )
    data = input_bytes(payload)
    record_input(db, run.id, data)
    return run.id, data


def test_recorded_input_rebuilds_to_the_same_bytes(db: Database, settings: Settings, group: Group) -> None:
    ws = settings.groups_dir / "dev"
    (ws / "spec.md").write_text("# Spec\nmust be fast\n")
    _say(db, "m1", "hello")
    store_message_direct(
        db=db,
        id="h1",
        chat_jid=JID,
        sender="host",
        sender_name="host",
        content="⚠️ hidden",
        timestamp=datetime.now(UTC).isoformat(),
        is_from_me=True,
        message_type="host",
    )
    _say(
        db,
        "m2",
        "read the spec",
        context=[{"type": "file", "path": "spec.md"}, {"type": "selection", "text": "must be fast"}],
    )
    run_id, sent = _assemble(db, settings)
    assert stored_input(db, run_id) == sent
    doc = json.loads(sent)
    assert [m["content"].split("\n")[0] for m in doc["messages"]] == ["hello", "read the spec"]
    assert "hidden" not in sent.decode()
    assert "<file_context>\n<path>spec.md</path>" in doc["messages"][1]["content"]
    assert doc["messages"][1]["content"].count("<selected_text>") == 1

    assert rebuild_input(db, settings, run_id) == sent

    # The rebuild reads the history as it is now: a change shows.
    (ws / "spec.md").write_text("# Spec\nmust be correct\n")
    assert rebuild_input(db, settings, run_id) != sent
    (ws / "spec.md").write_text("# Spec\nmust be fast\n")
    os.utime(ws / "spec.md", (0, 0))
    assert rebuild_input(db, settings, run_id) != sent  # mtime is part of the block
    edit_message(db, settings, JID, "m1", "hello, edited")
    assert b"hello, edited" in rebuild_input(db, settings, run_id)


def test_runs_show_input_and_verify(db: Database, settings: Settings, group: Group) -> None:
    _say(db, "m1", "hello")
    run_id, sent = _assemble(db, settings)
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
    }
    cli = [str(Path(sys.executable).parent / "orchestrator"), "runs", "show", run_id[:8]]
    shown = subprocess.run([*cli, "--input"], env=env, capture_output=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == sent + b"\n"
    ok = subprocess.run([*cli, "--verify"], env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "verified" in ok.stderr
    edit_message(db, settings, JID, "m1", "changed")
    changed = subprocess.run([*cli, "--verify"], env=env, capture_output=True, text=True, timeout=60)
    assert changed.returncode == 2
    assert '-      "content": "hello",' in changed.stderr and '+      "content": "changed",' in changed.stderr


def test_the_previous_run_notice_reads_the_chats_newest_finished_run_not_a_replay(
    db: Database, settings: Settings, group: Group
) -> None:
    from sqlalchemy import update

    from orchestrator.run.notices import previous_run_failed
    from orchestrator.store.tables import RunRow

    ctx = NoticeContext(db, settings, group)
    made = 0

    def run(**values: object) -> str:
        # Each run a minute newer than the last: created in the same millisecond they would tie.
        nonlocal made
        made += 1
        new = create_run(db, chat_jid=JID, cursor_from=0, cursor_to=0, celery_task_id=None)
        with db.write() as session:
            session.execute(
                update(RunRow)
                .where(RunRow.id == new.id)
                .values(created_at=datetime.now(UTC) - timedelta(minutes=10 - made), **values)
            )
        return new.id

    failed = run()
    finish_run(db, failed, state="timed_out", error="ran out of time")
    assert previous_run_failed(ctx) == ["Note: the previous agent run in this chat ended as timed_out: ran out of time"]
    # A newer run still going does not hide it; a newer replay that failed is not the chat's.
    run()
    replay = run(replay_of=failed)
    finish_run(db, replay, state="failed", error="the replay's own failure")
    assert previous_run_failed(ctx) == ["Note: the previous agent run in this chat ended as timed_out: ran out of time"]
    # A newer run that succeeded: nothing to say.
    finish_run(db, run(), state="succeeded", error=None)
    assert previous_run_failed(ctx) == []
