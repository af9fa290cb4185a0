"""The run pipeline in-process against the real Docker engine and agent image
(no broker: the Celery task is only a thin wrapper around this), on SQLite and
on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from agent_runner.protocol import ContainerInput
from fakes.channel import RecordingChannel, attach_recorder
from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.sandbox.containers import LABEL_INSTALL, LABEL_MANAGED
from orchestrator.store import leases
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs


@pytest.fixture
def pipe(tmp_path: Path, agent_image: str, database_url: str) -> Iterator[tuple[Pipeline, Database, RecordingChannel]]:
    # database_url is parametrized (tests/conftest.py): SQLite or a fresh PostgreSQL database.
    settings = Settings.load(
        data_dir=tmp_path / "data",
        agent_image=agent_image,
        run_timeout_s=4,
        database_url=database_url,
        env_file=None,
    )
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    rec = attach_recorder(db, "main@local")
    yield Pipeline(settings, db, ChannelRegistry([rec])), db, rec
    db.dispose()


def _say(pipeline: Pipeline, db: Database, text: str) -> StoredMessage:
    return ingest(
        db, pipeline.settings, IncomingMessage(chat_jid="main@local", sender="u", content=text), signal=None
    ).message


def _managed_containers(pipeline: Pipeline) -> list[object]:
    """This test's installation's containers (another test process may have its own)."""
    labels = [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={pipeline.settings.install_id}"]
    return docker.from_env().containers.list(all=True, filters={"label": labels})


def test_run_stores_and_delivers_in_order(pipe: tuple[Pipeline, Database, RecordingChannel]) -> None:
    pipeline, db, rec = pipe
    sent = _say(pipeline, db, "$ printf 'a\\nb\\n'")
    outcomes = pipeline.drain_group("main@local")
    assert [o.run.state for o in outcomes] == ["succeeded"]
    stored = get_messages_after("main@local", sent.seq, db=db)
    # The person's message, then every output but the stored-only records (tool_use, the
    # run's result_meta last), in order.
    assert stored[-1].sender == "result_meta"
    assert [m.seq for m in rec.sent] == [sent.seq] + [
        m.seq for m in stored if m.sender not in ("tool_use", "result_meta")
    ]
    rendered = rec.rendered
    assert rendered[0] == "u: $ printf 'a\\nb\\n'"
    assert rendered[1].startswith("🔧 ✅ exit 0 · bash") and "a\nb" in rendered[1]
    assert rendered[2].startswith("Andy: ")
    assert get_group(db, "main@local").cursor_seq == sent.seq
    # A second drain finds nothing to do.
    assert pipeline.drain_group("main@local") == []


def test_output_with_nul_bytes_is_stored(pipe: tuple[Pipeline, Database, RecordingChannel]) -> None:
    # PostgreSQL text cannot hold NUL; a command may print it anyway.
    pipeline, db, _ = pipe
    sent = _say(pipeline, db, "$ printf 'a\\000b\\n'")
    outcomes = pipeline.drain_group("main@local")
    assert [o.run.state for o in outcomes] == ["succeeded"], outcomes[0].run.error
    tool = [m for m in get_messages_after("main@local", sent.seq, db=db) if m.message_type == "tool_result"]
    assert len(tool) == 1 and "a\ufffdb" in tool[0].content


def test_busy_group_is_left_to_its_lease_holder(pipe: tuple[Pipeline, Database, RecordingChannel]) -> None:
    pipeline, db, rec = pipe
    _say(pipeline, db, "hello")
    assert leases.acquire(db, "main@local", "another-worker", 30)
    assert pipeline.drain_group("main@local") == []
    assert rec.sent == [] and list_runs(db) == []
    leases.release(db, "main@local", "another-worker")
    assert [o.run.state for o in pipeline.drain_group("main@local")] == ["succeeded"]


def test_messages_during_a_run_are_picked_up_once(pipe: tuple[Pipeline, Database, RecordingChannel]) -> None:
    pipeline, db, _ = pipe
    _say(pipeline, db, "first")
    _say(pipeline, db, "second")
    outcomes = pipeline.drain_group("main@local")
    # Both were pending before the run started: one run sees both.
    assert len(outcomes) == 1
    run = outcomes[0].run
    assert run.cursor_to - run.cursor_from >= 2
    _say(pipeline, db, "third")
    again = pipeline.drain_group("main@local")
    assert len(again) == 1 and again[0].run.cursor_from == run.cursor_to


def test_hung_command_is_killed_at_the_time_limit(pipe: tuple[Pipeline, Database, RecordingChannel]) -> None:
    pipeline, db, rec = pipe
    _say(pipeline, db, "$ sleep 60")
    outcomes = pipeline.drain_group("main@local")
    assert [o.run.state for o in outcomes] == ["timed_out"]
    assert outcomes[0].run.duration_s is not None and outcomes[0].run.duration_s < 30
    hosts = [m for m in rec.sent if m.message_type == "host"]
    # Which limit stopped it, and how to raise it.
    assert len(hosts) == 1 and hosts[0].content.startswith("⏱️ The run stopped at its time limit of 4 s")
    assert "ORCHESTRATOR_RUN_TIMEOUT_S" in hosts[0].content
    assert _managed_containers(pipeline) == []
    # The host message is for people only.
    view = format_messages_for_sdk(get_messages_after("main@local", 0, db=db))
    assert all("time limit" not in m.content for m in view)
    # The next run is told the previous one failed (an ephemeral notice).
    from orchestrator.run.notices import compute_notices

    assert any("timed_out" in n for n in compute_notices(db, pipeline.settings, get_group(db, "main@local")))


def test_scheduled_tasks_run_as_ordinary_runs_in_their_context_mode(
    pipe: tuple[Pipeline, Database, RecordingChannel], monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import UTC, datetime, timedelta

    from orchestrator.run.schedules import add_task, fire_due

    pipeline, db, rec = pipe
    seen: list[ContainerInput] = []
    real = pipeline._attempt

    def capture(outputs, payload, *args):  # type: ignore[no-untyped-def]
        seen.append(payload)
        return real(outputs, payload, *args)

    monkeypatch.setattr(pipeline, "_attempt", capture)
    _say(pipeline, db, "remember: the answer is blue")
    pipeline.drain_group("main@local")
    now = datetime.now(UTC)
    add_task(
        db,
        chat_jid="main@local",
        prompt="$ echo isolated-task",
        kind="interval",
        spec="1m",
        context_mode="isolated",
        now=now - timedelta(minutes=2),
    )
    add_task(
        db,
        chat_jid="main@local",
        prompt="$ echo group-task",
        kind="interval",
        spec="1m",
        context_mode="group",
        now=now - timedelta(minutes=2),
    )
    assert len(fire_due(db, signal=None, now=now)) == 2
    outcomes = pipeline.drain_group("main@local")
    assert [o.run.state for o in outcomes] == ["succeeded", "succeeded"]  # one run each, same records
    iso = next(p for p in seen if p.messages[-1].content == "$ echo isolated-task")
    grp = next(p for p in seen if any(m.content == "$ echo group-task" for m in p.messages))
    assert [m.content for m in iso.messages] == ["$ echo isolated-task"] and iso.session_id is None
    assert any("the answer is blue" in m.content for m in grp.messages)
    assert grp.session_id is not None  # the group's session carries on
    replies = [m.content for m in rec.sent if m.sender == "bot"]
    assert any("isolated-task" in r for r in replies) and any("group-task" in r for r in replies)
