"""Replays and run diffs (orchestrator/run/replay.py, orchestrator/run/run_diff.py) on both databases.

The scratch copy of the group's workspace against hostile workspaces: a
symlink to /etc/passwd and to another group's folder (copied as the link,
never followed), a FIFO and a socket (skipped, without hanging), a huge file
and too many files (refused, the scratch copy removed).  A replay through the
fake sandbox (Docker itself is in tests/integration/test_replay.py): the
container gets the scratch copy, never the real workspace; the input is the
original's messages with the new model, a new run id and no session; nothing
is stored as a message, delivered, or moved (cursor, session, pending work,
run slots, the sweeper); the outputs and the diff; the CLI and the API.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import tracemalloc
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from agent_runner.protocol import (
    AssistantEvent,
    ResultEvent,
    SendMessageEvent,
    TextDeltaEvent,
    ToolResultEvent,
    ToolUseEvent,
    Usage,
    decode_input,
)
from fakes.channel import attach_recorder
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.errors import ConfigError, ReplayRefused
from orchestrator.core.settings import Settings
from orchestrator.http.api import create_app
from orchestrator.http.endpoint import CLIENT_HEADER
from orchestrator.root import Orchestrator
from orchestrator.run.assembly import stored_input
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.run.replay import SKIPPED_KEPT, copy_workspace, create_replay, execute_replay
from orchestrator.run.run_diff import diff_runs
from orchestrator.run.sweeper import recover_group, sweep
from orchestrator.store.db import Database
from orchestrator.store.drafts import chat_drafts
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import get_run, list_runs
from orchestrator.store.slots import fleet_slots
from orchestrator.store.usage import group_usage

JID = "main@local"
MB = 1024 * 1024


# -- the scratch copy ------------------------------------------------------------------------


def _copy(src: Path, dest: Path, max_bytes: int = 10 * MB, max_files: int = 1000) -> object:
    """copy_workspace in a thread, so a copy that hangs (on a FIFO) fails the test instead."""
    out: list[object] = []

    def go() -> None:
        try:
            out.append(copy_workspace(src, dest, max_bytes=max_bytes, max_files=max_files))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the copy hung"
    return out[0]


def test_the_copy_keeps_files_folders_modes_and_times(tmp_path: Path) -> None:
    src = tmp_path / "ws"
    (src / "src" / "deep").mkdir(parents=True)
    (src / "src" / "deep" / "a.py").write_text("print('a')\n")
    script = src / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    os.utime(script, (1_600_000_000, 1_600_000_000))
    (src / "empty").mkdir()
    report = _copy(src, tmp_path / "scratch")
    assert not isinstance(report, BaseException), report
    dest = tmp_path / "scratch"
    assert (dest / "src" / "deep" / "a.py").read_text() == "print('a')\n"
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (dest / "run.sh").stat().st_mtime == 1_600_000_000
    assert (dest / "empty").is_dir()
    assert (report.files, report.folders, report.symlinks, report.skipped) == (2, 3, 0, [])  # type: ignore[attr-defined]


def test_a_symlink_is_copied_as_the_link_never_followed(tmp_path: Path) -> None:
    other = tmp_path / "groups" / "other"
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("the other group's secret")
    src = tmp_path / "groups" / "mine"
    src.mkdir()
    (src / "passwd").symlink_to("/etc/passwd")
    (src / "theirs").symlink_to(other)
    (src / "up").symlink_to("../other/secret.txt")
    report = _copy(src, tmp_path / "scratch")
    assert not isinstance(report, BaseException), report
    dest = tmp_path / "scratch"
    for name, target in (("passwd", "/etc/passwd"), ("theirs", str(other)), ("up", "../other/secret.txt")):
        assert (dest / name).is_symlink() and os.readlink(dest / name) == target
    assert report.symlinks == 3 and report.bytes == 0  # type: ignore[attr-defined]
    # Nothing of what they name was read into the copy.
    found = [p.read_bytes() for p in dest.rglob("*") if p.is_file() and not p.is_symlink()]
    assert found == []


def test_fifos_and_sockets_are_skipped_without_hanging(tmp_path: Path) -> None:
    src = tmp_path / "ws"
    src.mkdir()
    os.mkfifo(src / "pipe")  # nobody writes: a blocking open would hang for ever
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(src / "agent.sock"))
    (src / "ok.txt").write_text("ok")
    try:
        report = _copy(src, tmp_path / "scratch")
    finally:
        sock.close()
    assert not isinstance(report, BaseException), report
    assert sorted(report.skipped) == ["agent.sock: a socket, not copied", "pipe: a FIFO, not copied"]  # type: ignore[attr-defined]
    assert sorted(p.name for p in (tmp_path / "scratch").iterdir()) == ["ok.txt"]


def test_a_huge_file_or_too_many_files_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "ws"
    src.mkdir()
    with open(src / "huge.bin", "wb") as f:
        f.truncate(64 * MB)  # sparse: cheap to make, 64 MiB to read
    refused = _copy(src, tmp_path / "s1", max_bytes=8 * MB)
    assert isinstance(refused, ReplayRefused) and "ORCHESTRATOR_REPLAY_MAX_BYTES" in str(refused)
    assert sum(p.stat().st_size for p in (tmp_path / "s1").rglob("*")) <= 8 * MB  # never read past the bound

    many = tmp_path / "many"
    many.mkdir()
    for i in range(60):
        (many / f"f{i}").write_text("x")
    refused = _copy(many, tmp_path / "s2", max_files=50)
    assert isinstance(refused, ReplayRefused) and "ORCHESTRATOR_REPLAY_MAX_FILES" in str(refused)


def test_fifos_sockets_and_links_count_toward_the_cap(tmp_path: Path) -> None:
    """Every entry met counts toward ORCHESTRATOR_REPLAY_MAX_FILES, skipped or not: a
    workspace of FIFOs and sockets (they did not count) is refused, not walked without end."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "pipe")
    for i in range(30):
        os.link(ws / "pipe", ws / f"pipe{i}")  # a name, no inode: as many as the folder holds
    for i in range(15):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(ws / f"s{i}.sock"))
        sock.close()  # the socket file stays
    for i in range(4):
        (ws / f"link{i}").symlink_to("/dev/null")
    # 50 entries: within a cap of 50, every skipped one counted, the first SKIPPED_KEPT named.
    report = _copy(ws, tmp_path / "s1", max_files=50)
    assert not isinstance(report, BaseException), report
    assert (report.skipped_count, report.symlinks, len(report.skipped)) == (46, 4, 46)  # type: ignore[attr-defined]
    (ws / "one-more").symlink_to("/dev/null")
    refused = _copy(ws, tmp_path / "s2", max_files=50)
    assert isinstance(refused, ReplayRefused) and "more than 50 entries (ORCHESTRATOR_REPLAY_MAX_FILES)" in str(refused)

    many = tmp_path / "many"
    many.mkdir()
    os.mkfifo(many / "pipe")
    for i in range(SKIPPED_KEPT + 50):
        os.link(many / "pipe", many / f"p{i}")
    report = _copy(many, tmp_path / "s3")
    assert not isinstance(report, BaseException), report
    assert report.skipped_count == SKIPPED_KEPT + 51 and len(report.skipped) == SKIPPED_KEPT  # type: ignore[attr-defined]
    assert report.as_json()["skipped_count"] == SKIPPED_KEPT + 51  # type: ignore[attr-defined]


def test_the_copy_refuses_a_huge_folder_without_listing_it(tmp_path: Path) -> None:
    """A folder of 100,000 hard links to FIFOs (no inode each, nothing copied): the copy
    reads it as it goes and stops at its cap; listing it whole (as it did) costs memory in
    proportion, measured here as the baseline."""
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "pipe0")
    os.mkfifo(ws / "pipe1")  # ext4 allows 65,000 links an inode
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(100_000):
            os.link(f"pipe{i % 2}", f"p{i:06d}", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    tracemalloc.start()
    try:
        with os.scandir(ws) as it:
            entries = list(it)
        listing = tracemalloc.get_traced_memory()[1]
        del entries
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        refused = _copy(ws, tmp_path / "scratch", max_files=1000)
        copy = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
        shutil.rmtree(ws)
    assert isinstance(refused, ReplayRefused) and "ORCHESTRATOR_REPLAY_MAX_FILES" in str(refused)
    assert listing > 10_000_000  # ~140 bytes an entry
    assert copy < listing / 50, (copy, listing)


# -- replays ---------------------------------------------------------------------------------


ORIGINAL = Script(
    [
        ToolUseEvent(id="t1", name="bash", input={"command": "ls"}),
        ToolResultEvent(tool_use_id="t1", name="bash", output="notes.txt\n", exit_code=0),
        AssistantEvent(text="There is notes.txt."),
        ResultEvent(usage=Usage(input_tokens=100, output_tokens=10), stop_reason="end_turn", num_turns=2),
    ]
)
REPLAYED = Script(
    [
        ToolUseEvent(id="r1", name="bash", input={"command": "cat notes.txt > copy.txt; false"}),
        ToolResultEvent(tool_use_id="r1", name="bash", output="", exit_code=1),
        SendMessageEvent(chat_jid=JID, text="a message it wanted to send"),
        AssistantEvent(text="I copied it (or tried)."),
        ResultEvent(usage=Usage(input_tokens=300, output_tokens=30), stop_reason="end_turn", num_turns=3),
    ]
)


def _chat(settings: Settings, db: Database, sandbox: FakeSandbox) -> tuple[Pipeline, str]:
    """The main group, a file in its workspace, one message answered by one (original) run."""
    ensure_main_group(db)
    attach_recorder(db, JID)
    workspace = settings.groups_dir / get_group(db, JID).folder
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "notes.txt").write_text("remember the milk\n")
    p = Pipeline(settings.replace(max_attempts=1), db, ChannelRegistry([]), sandbox, clock=FakeClock())
    ingest(db, p.settings, IncomingMessage(chat_jid=JID, sender="u", content="what is here?"), signal=None)
    [outcome] = p.drain_group(JID)
    return p, outcome.run.id


def test_a_replay_runs_the_same_input_on_a_scratch_copy_and_touches_nothing_of_the_chat(
    settings: Settings, db: Database
) -> None:
    sandbox = FakeSandbox(ORIGINAL, REPLAYED)
    p, original = _chat(settings, db, sandbox)
    group = get_group(db, JID)
    before = get_messages_after(JID, 0, db=db)
    workspace = settings.groups_dir / group.folder

    replay = create_replay(db, settings, original[:8], "openai:gpt-test")
    assert (replay.state, replay.replay_of, replay.chat_jid) == ("queued", original, JID)
    # Queued, it is no work of the chat's: the sweeper and a new lease holder leave it alone.
    assert sweep(db, signal=None).interrupted_runs == []
    assert recover_group(db, JID, "someone-else") == []
    assert fleet_slots(db, 1).running == 0

    done = execute_replay(db, settings.replace(openai_base_url="http://127.0.0.1:9"), sandbox, replay.id)
    assert done.state == "succeeded" and done.finished_at is not None
    # Tokens as the model gateway counted them (nothing reached it here), never as the container claims.
    assert (done.input_tokens, done.output_tokens) == (0, 0)

    # The container got the recorded input with the new model, a new id, no session: same messages.
    spec, sent = sandbox.started[1]
    recorded = decode_input(stored_input(db, original) or b"")
    assert sent.messages == recorded.messages and sent.system_notices == recorded.system_notices
    assert (sent.run_id, sent.session_id) == (replay.id, None)
    assert (sent.model.provider, sent.model.model, sent.model.max_tokens) == (
        "openai",
        "gpt-test",
        settings.provider.max_tokens,
    )
    assert sent.model.socket_path == "/run/gateway/model.sock"
    # ... and a scratch copy of the workspace, removed afterwards, never the workspace itself.
    assert spec.workspace != workspace and spec.workspace.parent.parent == settings.runs_dir
    assert not spec.workspace.parent.exists() and not (settings.runs_dir / replay.id).exists()
    assert workspace not in [Path(h) for h in (*spec.extra_mounts, *spec.readonly_mounts)]
    assert sorted(p.name for p in workspace.iterdir()) == ["notes.txt"]

    # Nothing stored as a message, nothing delivered, no cursor, session or pending work moved.
    assert get_messages_after(JID, 0, db=db) == before
    after = get_group(db, JID)
    assert (after.cursor_seq, after.pending_seq, after.session_id) == (
        group.cursor_seq,
        group.pending_seq,
        group.session_id,
    )

    diff = diff_runs(db, original, replay.id)
    assert diff.same_input_messages
    a, b = diff.a, diff.b
    assert (a.run_id, a.model, a.replies, a.stop_reason, a.num_turns) == (
        original,
        "offline",
        ["There is notes.txt."],
        "end_turn",
        2,
    )
    assert [(c.name, c.input, c.exit_code) for c in a.tool_calls] == [("bash", "ls", 0)]
    assert (a.input_tokens, a.output_tokens) == (100, 10)
    assert (b.run_id, b.replay_of, b.model, b.state) == (replay.id, original, "openai:gpt-test", "succeeded")
    assert b.replies == [f"[send_message to {JID}, not sent] a message it wanted to send", "I copied it (or tried)."]
    assert [(c.name, c.input, c.exit_code) for c in b.tool_calls] == [("bash", "cat notes.txt > copy.txt; false", 1)]
    assert (b.input_tokens, b.output_tokens, b.num_turns, b.stop_reason) == (0, 0, 3, "end_turn")
    assert b.duration_s is not None and b.duration_s >= 0
    assert [r.id for r in list_runs(db, chat_jid=JID)][0] == replay.id  # listed, marked by replay_of

    # Run again (a task delivered twice): it is not run a second time.
    assert execute_replay(db, settings, sandbox, replay.id).state == "succeeded" and len(sandbox.started) == 2
    # And a replay of the replay compares with it as any two runs do.
    again = create_replay(db, settings, replay.id, "offline")
    assert decode_input(stored_input(db, again.id) or b"").messages == recorded.messages


def test_what_cannot_be_replayed_is_refused(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(ORIGINAL)
    _, original = _chat(settings, db, sandbox)
    with pytest.raises(ConfigError):
        create_replay(db, settings, original, "gpt-4")
    with pytest.raises(Exception, match="no run"):
        create_replay(db, settings, "no-such-run", "offline")
    from orchestrator.run.assembly import record_input

    record_input(db, original, b'{"messages": []}')
    with pytest.raises(ReplayRefused, match="does not decode"):
        create_replay(db, settings, original, "offline")


def test_a_workspace_over_the_bound_fails_the_replay_and_leaves_no_copy(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(ORIGINAL, REPLAYED)
    p, original = _chat(settings, db, sandbox)
    workspace = settings.groups_dir / get_group(db, JID).folder
    with open(workspace / "big.bin", "wb") as f:
        f.truncate(2 * MB)
    replay = create_replay(db, settings, original, "offline")
    done = execute_replay(db, settings.replace(replay_max_bytes=MB), sandbox, replay.id)
    assert done.state == "failed" and "ORCHESTRATOR_REPLAY_MAX_BYTES" in (done.error or "")
    assert len(sandbox.started) == 1  # no container for it
    assert not any(p.name.startswith(replay.id) for p in settings.runs_dir.iterdir())
    assert diff_runs(db, original, replay.id).b.state == "failed"
    # The chat's next run is not told that "the previous run failed": that was no run of the chat's.
    ingest(db, p.settings, IncomingMessage(chat_jid=JID, sender="u", content="next"), signal=None)
    p.drain_group(JID)
    assert sandbox.started[-1][1].system_notices == []


def test_a_streamed_replay_keeps_no_draft_and_its_deltas_are_bounded(settings: Settings, db: Database) -> None:
    # Far more delta lines than ORCHESTRATOR_MAX_RUN_EVENTS: free up to the pipeline's allowance...
    deltas = [TextDeltaEvent(block="1.0", text=f"w{i} ") for i in range(200)]
    streamed = Script(
        [*deltas, AssistantEvent(text="streamed answer"), ResultEvent(usage=Usage(input_tokens=10, output_tokens=1))]
    )
    sandbox = FakeSandbox(ORIGINAL, streamed)
    _, original = _chat(settings, db, sandbox)
    replay = create_replay(db, settings, original, "offline")
    done = execute_replay(db, settings.replace(max_run_events=50), sandbox, replay.id)
    assert done.state == "succeeded", done.error
    assert diff_runs(db, original, replay.id).b.replies == ["streamed answer"]  # no delta kept
    assert chat_drafts(db, JID) == []  # nothing shown in the chat
    # ... and past it, each counts like any line: an endless stream ends the replay.
    flood = Script([TextDeltaEvent(block="1.0", text="x") for _ in range(600)])
    sandbox = FakeSandbox(flood)
    replay = create_replay(db, settings, original, "offline")
    done = execute_replay(db, settings.replace(max_run_events=50), sandbox, replay.id)
    assert done.state == "failed" and "ORCHESTRATOR_MAX_RUN_EVENTS" in (done.error or ""), done.error


def test_the_sweeper_ends_a_replay_whose_worker_host_died(settings: Settings, db: Database) -> None:
    from sqlalchemy import update

    from orchestrator.store.hosts import mark_stopped, register
    from orchestrator.store.tables import RunRow

    sandbox = FakeSandbox(ORIGINAL)
    _, original = _chat(settings, db, sandbox)
    alive, dead = create_replay(db, settings, original, "offline"), create_replay(db, settings, original, "offline")
    for host, run in (("host-a", alive), ("host-b", dead)):
        register(db, host_id=host, instance=f"{host}-1", version="t", concurrency=1)
        with db.write() as session:  # taken by a worker of that host, as execute_replay takes it
            session.execute(
                update(RunRow).where(RunRow.id == run.id).values(owner=f"{host}:1234:abcd", state="running")
            )
    mark_stopped(db, "host-b", "host-b-1")
    assert sweep(db, signal=None).interrupted_runs == [dead.id]
    assert (get_run(db, dead.id).state, get_run(db, alive.id).state) == ("failed", "running")
    assert get_messages_after(JID, 0, db=db)[-1].sender == "result_meta"  # the original's; nothing added


def test_a_cancelled_replay_ends_cancelled(settings: Settings, db: Database) -> None:
    from orchestrator.store.runs import cancel_run

    sandbox = FakeSandbox(ORIGINAL, Script([AssistantEvent(text="working")], hang=True))
    _, original = _chat(settings, db, sandbox)
    replay = create_replay(db, settings, original, "offline")
    sandbox.agent_started.clear()
    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(execute_replay(db, settings, sandbox, replay.id)))
    t.start()
    assert sandbox.agent_started.wait(10) and sandbox.agents[-1].started_reading.wait(10)
    cancel_run(db, replay.id)
    t.join(20)
    assert not t.is_alive()
    assert get_run(db, replay.id).state == "cancelled"
    assert diff_runs(db, original, replay.id).b.replies == ["working"]


def test_the_cli_diffs_two_runs_side_by_side(settings: Settings, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    sandbox = FakeSandbox(ORIGINAL, REPLAYED)
    _, original = _chat(settings, db, sandbox)
    replay = create_replay(db, settings, original, "offline")
    execute_replay(db, settings, sandbox, replay.id)
    # The offline model has no gateway: the runner's count, and it counts against the group's quotas.
    assert group_usage(db, settings, get_group(db, JID)).tokens_today == 110 + 330
    from orchestrator.cli.main import app

    monkeypatch.setenv("ORCHESTRATOR_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("ORCHESTRATOR_DATABASE_URL", settings.database_url)
    runner = CliRunner()
    shown = runner.invoke(app, ["runs", "diff", original[:8], replay.id])
    assert shown.exit_code == 0, shown.output
    for text in (
        "There is notes.txt.",
        "I copied it (or tried).",
        "bash: ls  → exit 0",
        "→ exit 1",
        "100 in / 10 out",
        "300 in / 30 out",
        "end_turn",
        original[:8],
        replay.id[:8],
    ):
        assert text in shown.output, (text, shown.output)
    as_json = runner.invoke(app, ["runs", "diff", original, replay.id, "--json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["b"]["replay_of"] == original
    listed = runner.invoke(app, ["runs"])
    assert f"replay of {original[:8]}" in listed.output
    missing = runner.invoke(app, ["runs", "diff", original, "nope"])
    assert missing.exit_code == 1 and "no run" in missing.output


def test_the_api_queues_a_replay_and_diffs_runs(settings: Settings, db: Database) -> None:
    sandbox = FakeSandbox(ORIGINAL, REPLAYED)
    _, original = _chat(settings, db, sandbox)
    root = Orchestrator(settings)
    sent: list[tuple[str, str]] = []
    root.signals.replay = lambda run_id, chat_jid: sent.append((run_id, chat_jid)) or "task"  # type: ignore[method-assign]
    client = TestClient(create_app(root), headers={CLIENT_HEADER: "tests"})
    r = client.post(f"/api/runs/{original}/replay", json={"model": "openai:gpt-test"})
    assert r.status_code == 202, r.text
    made = r.json()
    assert made["replay_of"] == original and made["state"] == "queued" and sent == [(made["id"], JID)]
    # The worker's task, as workers/tasks.py runs it.
    execute_replay(db, settings, sandbox, made["id"])
    d = client.get(f"/api/runs/{original}/diff/{made['id']}")
    assert d.status_code == 200 and d.json()["b"]["replies"][-1] == "I copied it (or tried)."
    assert client.get(f"/api/runs/{original}/diff/nope").status_code == 404
    assert client.post("/api/runs/nope/replay", json={"model": "offline"}).status_code == 404
    bad = client.post(f"/api/runs/{original}/replay", json={"model": "gpt-4"})
    assert bad.status_code == 400 and bad.json()["field"] == "model"

    def broken(run_id: str, chat_jid: str) -> str:
        raise ConnectionError("broker down")

    root.signals.replay = broken  # type: ignore[method-assign]
    down = client.post(f"/api/runs/{original}/replay", json={"model": "offline"})
    assert down.status_code == 503 and "broker down" in down.json()["detail"]
    failed = [r for r in list_runs(db, chat_jid=JID) if r.replay_of and r.state == "failed"]
    assert len(failed) == 1 and failed[0].finished_at is not None
