"""Upgrading a legacy (pre-Alembic) database in place.

The legacy databases are real SQLite files written by the legacy schema
(``tests/data/legacy_v1.db``: no message_type/metadata; ``legacy_v2.db``:
with them), made by ``tests/data/make_legacy_dbs.py``.  Each test copies one,
points the orchestrator at it and lets the normal startup migration upgrade it.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text

from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.store.db import Database, open_database
from orchestrator.store.message_log import get_messages_after, store_message_direct, to_stored
from orchestrator.store.migrations import legacy
from orchestrator.store.tables import Base, MessageRow
from tests.conftest import fresh_pg_database

DATA = Path(__file__).resolve().parents[1] / "data"
LEGACY_FILES = ["legacy_v1.db", "legacy_v2.db"]
GROUP = "120363000000000001@g.us"
DM = "15551234567@s.whatsapp.net"
LEGACY_TABLES = {"chats", "router_state", "legacy_scheduled_tasks"}

# (timestamp, rowid) order of the legacy rows: m04 was inserted before m03,
# m07b before m07a at the same second, DM's m01 last but earliest.
SEQ_ORDER = [
    (DM, "m01"),
    (GROUP, "m01"),
    (GROUP, "m02"),
    (GROUP, "m03"),
    (GROUP, "m04"),
    (GROUP, "m05"),
    (DM, "m06"),
    (GROUP, "m07b"),
    (GROUP, "m07a"),
    (DM, "m08"),
    (DM, "m09"),
    (DM, "m10"),
    (DM, "m11"),
    (DM, "m12"),
]
# Backfilled from the sender: host/command_output/bot/system, anyone else a user.
TYPES_V1 = {
    (DM, "m01"): "user",
    (GROUP, "m01"): "user",
    (GROUP, "m02"): "assistant",
    (GROUP, "m03"): "host",
    (GROUP, "m04"): "tool_result",
    (GROUP, "m05"): "system",
    (DM, "m06"): "user",
    (GROUP, "m07b"): "user",
    (GROUP, "m07a"): "user",
    (DM, "m08"): "assistant",
    (DM, "m09"): "host",
    (DM, "m10"): "tool_result",
    (DM, "m11"): "system",
    (DM, "m12"): "user",
}
# v2 rows keep a valid stored type (m11 was recorded as host, not system);
# empty ones and the unknown "reaction" are backfilled.
TYPES_V2 = {**TYPES_V1, (DM, "m11"): "host"}
METADATA_V2 = {
    (GROUP, "m02"): {"model": "claude"},
    (GROUP, "m04"): {"exit_code": 0},
    (GROUP, "m05"): {"legacy_metadata": "not json{"},
    (GROUP, "m07a"): {"legacy_metadata": "[1, 2]"},
    (DM, "m10"): {"exit_code": 2},
    (DM, "m12"): {"legacy_message_type": "reaction"},
}


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("make_legacy_dbs", DATA / "make_legacy_dbs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _legacy_rows(path: Path, table: str, order: str = "rowid") -> list[dict[str, Any]]:
    """A table of a legacy file (opened read-only, so the committed files never change)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY {order}")]
    finally:
        conn.close()


def _dump(path: Path) -> list[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def _messages(db: Database) -> list[StoredMessage]:
    with db.read() as session:
        return [to_stored(r) for r in session.scalars(select(MessageRow).order_by(MessageRow.seq))]


def _snapshot(db: Database) -> dict[str, Any]:
    with db.engine.connect() as conn:
        tables = inspect(conn).get_table_names()
        rows = {t: sorted((tuple(r) for r in conn.execute(text(f'SELECT * FROM "{t}"'))), key=repr) for t in tables}
        schema = sorted(tuple(r) for r in conn.execute(text("SELECT type, name, sql FROM sqlite_master")))
    return {"rows": rows, "schema": schema}


@pytest.fixture(params=LEGACY_FILES)
def legacy_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def version(legacy_name: str) -> int:
    return 2 if legacy_name == "legacy_v2.db" else 1


@pytest.fixture
def legacy_file(legacy_name: str, tmp_path: Path) -> Path:
    path = tmp_path / "legacy" / "orchestrator.db"
    path.parent.mkdir()
    shutil.copyfile(DATA / legacy_name, path)
    return path


@pytest.fixture
def original(legacy_file: Path) -> dict[str, list[dict[str, Any]]]:
    """The legacy file's tables as they were before the upgrade."""
    return {t: _legacy_rows(legacy_file, t) for t in ("messages", "chats", "scheduled_tasks", "router_state")}


@pytest.fixture
def settings(legacy_file: Path, tmp_path: Path) -> Settings:
    return Settings.load(data_dir=tmp_path / "data", database_url=f"sqlite:///{legacy_file}", env_file=None)


@pytest.fixture
def upgraded(original: dict[str, Any], settings: Settings) -> Database:
    # The orchestrator's own startup path: the first get_database migrates.
    return open_database(settings)


def test_the_files_are_legacy_and_match_their_script(tmp_path: Path) -> None:
    for name in LEGACY_FILES:
        tables = {r["name"] for r in _legacy_rows(DATA / name, "sqlite_master WHERE type = 'table'", "name")}
        assert tables == {"chats", "messages", "scheduled_tasks", "router_state"}, name
        columns = [r["name"] for r in _legacy_rows(DATA / name, "pragma_table_info('messages')", "cid")]
        assert "seq" not in columns and ("message_type" in columns) == (name == "legacy_v2.db"), columns
    subprocess.run([sys.executable, str(DATA / "make_legacy_dbs.py"), str(tmp_path)], check=True, timeout=60)
    for name in LEGACY_FILES:
        assert _dump(tmp_path / name) == _dump(DATA / name), f"{name} is not what make_legacy_dbs.py writes"


def test_every_row_is_kept_with_its_content(upgraded: Database, original: dict[str, Any]) -> None:
    got = {(m.chat_jid, m.id): m for m in _messages(upgraded)}
    assert len(got) == len(original["messages"]) == len(SEQ_ORDER)
    for old in original["messages"]:
        m = got[(old["chat_jid"], old["id"])]
        assert (m.sender, m.sender_name, m.content, m.timestamp, m.is_from_me) == (
            old["sender"],
            old["sender_name"] or "",
            old["content"] or "",
            old["timestamp"],
            bool(old["is_from_me"]),
        ), old
    # The row with NULLs, and text that must survive byte for byte.
    assert (got[(GROUP, "m07b")].sender_name, got[(GROUP, "m07b")].content, got[(GROUP, "m07b")].is_from_me) == (
        "",
        "",
        False,
    )
    assert got[(GROUP, "m04")].content == "$ uptime\n up 3 days"
    assert got[(DM, "m12")].content == "👍"
    assert got[(DM, "m01")].content == "same id, other chat"


def test_message_type_is_backfilled_from_the_sender(upgraded: Database, version: int) -> None:
    got = {(m.chat_jid, m.id): m.message_type for m in _messages(upgraded)}
    assert got == (TYPES_V2 if version == 2 else TYPES_V1)


def test_seq_follows_timestamp_then_rowid(upgraded: Database, legacy_file: Path) -> None:
    messages = _messages(upgraded)
    assert [m.seq for m in messages] == list(range(1, len(SEQ_ORDER) + 1))
    assert [(m.chat_jid, m.id) for m in messages] == SEQ_ORDER


def test_metadata_is_parsed_or_kept_as_text(upgraded: Database, version: int) -> None:
    got = {(m.chat_jid, m.id): m.metadata for m in _messages(upgraded)}
    expected = {key: (METADATA_V2.get(key) if version == 2 else None) for key in SEQ_ORDER}
    assert got == expected
    with upgraded.engine.connect() as conn:  # absent metadata is SQL NULL, not JSON null
        nulls = conn.scalar(text("SELECT count(*) FROM messages WHERE metadata IS NULL"))
    assert nulls == len(SEQ_ORDER) - (len(METADATA_V2) if version == 2 else 0)


def test_legacy_tables_are_kept_and_ours_created(upgraded: Database, original: dict[str, Any]) -> None:
    with upgraded.engine.connect() as conn:
        insp = inspect(conn)
        tables = set(insp.get_table_names())
        assert {
            "chats",
            "router_state",
            "legacy_scheduled_tasks",
            "scheduled_tasks",
            "messages",
            "groups",
            "runs",
            "alembic_version",
        } <= tables
        assert legacy.OLD_MESSAGES not in tables
        assert "idx_timestamp" not in {i["name"] for i in insp.get_indexes("messages")}

        def rows(table: str) -> list[dict[str, Any]]:
            return [dict(r) for r in conn.execute(text(f"SELECT * FROM {table} ORDER BY rowid")).mappings()]

        assert rows("chats") == original["chats"]
        assert rows("router_state") == original["router_state"]
        assert rows("legacy_scheduled_tasks") == original["scheduled_tasks"]
        assert original["scheduled_tasks"][0]["prompt"] == "Send a morning summary"
        ours = {c["name"] for c in insp.get_columns("scheduled_tasks")}
        assert {"kind", "spec", "context_mode", "next_run_at"} <= ours
        assert conn.scalar(text("SELECT count(*) FROM scheduled_tasks")) == 0


def test_the_store_and_the_model_view_read_upgraded_data(upgraded: Database, version: int) -> None:
    group = get_messages_after(GROUP, 0, db=upgraded)
    assert [m.id for m in group] == ["m01", "m02", "m03", "m04", "m05", "m07b", "m07a"]
    after_m03 = get_messages_after(GROUP, group[3].seq - 1, db=upgraded)
    assert [m.id for m in after_m03] == ["m04", "m05", "m07b", "m07a"]

    view = format_messages_for_sdk(get_messages_after(DM, 0, db=upgraded))
    # m09 (sender host) never reaches the model; in v2 neither does m11 (stored as host).
    expected = [
        ("user", "same id, other chat"),
        ("user", "hi in private"),
        ("assistant", "hello Alice"),
        ("tool_result", "ls: cannot access 'x'"),
    ]
    expected += [] if version == 2 else [("system", "Scheduled task ran")]
    expected += [("user", "👍")]
    assert [(m.role, m.content) for m in view] == expected
    tool = next(m for m in view if m.role == "tool_result")
    assert tool.metadata == {"exit_code": 2 if version == 2 else None}
    assert "Session reset" not in {m.content for m in view}

    group_view = format_messages_for_sdk(group)
    assert "host" not in {m.role for m in group_view} and "Container started" not in {m.content for m in group_view}
    assert [m.sender_name for m in group_view if m.content == ""] == [None]  # m07b: NULL name -> "" -> None


def test_a_new_message_gets_the_next_seq(upgraded: Database) -> None:
    stored = store_message_direct(
        db=upgraded,
        id="new-1",
        chat_jid=DM,
        sender=DM,
        sender_name="Alice",
        content="after the upgrade",
        timestamp="2024-03-02T08:00:00+00:00",
    )
    assert stored.seq == len(SEQ_ORDER) + 1
    assert [m.id for m in get_messages_after(DM, len(SEQ_ORDER), db=upgraded)] == ["new-1"]
    # An id the legacy chat already had is still recognized (idempotent store).
    again = store_message_direct(
        db=upgraded, id="m01", chat_jid=DM, sender=DM, content="dup", timestamp="2024-03-02T08:00:00+00:00"
    )
    assert (again.seq, again.content) == (1, "same id, other chat")


def test_a_second_migrate_is_a_no_op(upgraded: Database, caplog: pytest.LogCaptureFixture) -> None:
    before = _snapshot(upgraded)
    with caplog.at_level(logging.INFO, logger="orchestrator.store.migrations.legacy"):
        upgraded.migrate()
        other = Database(upgraded.url)  # a second process starting on the upgraded file
        other.migrate()
        other.dispose()
    assert _snapshot(upgraded) == before
    assert not [r for r in caplog.records if r.name == "orchestrator.store.migrations.legacy"]


def test_the_upgrade_logs_how_many_rows_it_copied(
    original: dict[str, Any], settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="orchestrator.store.migrations.legacy"):
        open_database(settings)
    messages = [r.getMessage() for r in caplog.records if r.name == "orchestrator.store.migrations.legacy"]
    assert any(f"copied {len(original['messages'])} messages" in m for m in messages), messages


def test_the_upgraded_schema_matches_a_fresh_one(upgraded: Database, tmp_path: Path) -> None:
    def ours(name: str | None, type_: str, parent: dict[str, Any]) -> bool:
        return not (type_ == "table" and name in LEGACY_TABLES)

    with upgraded.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": ours})
        assert compare_metadata(ctx, Base.metadata) == []

    fresh = Database(f"sqlite:///{tmp_path / 'fresh.db'}")
    fresh.migrate()
    try:
        assert _schema(upgraded) == _schema(fresh) | dict.fromkeys(LEGACY_TABLES)
    finally:
        fresh.dispose()


def _schema(db: Database) -> dict[str, Any]:
    """Every table's columns, keys and indexes (legacy tables: just their name)."""
    out: dict[str, Any] = {}
    with db.engine.connect() as conn:
        insp = inspect(conn)
        for t in insp.get_table_names():
            if t in LEGACY_TABLES:
                out[t] = None
                continue
            out[t] = (
                [(c["name"], str(c["type"]), c["nullable"], c["default"]) for c in insp.get_columns(t)],
                insp.get_pk_constraint(t)["constrained_columns"],
                sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in insp.get_indexes(t)),
                sorted(tuple(u["column_names"]) for u in insp.get_unique_constraints(t)),
                insp.get_foreign_keys(t),
            )
    return out


def test_a_failed_upgrade_leaves_the_legacy_file_as_it_was(
    legacy_file: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _dump(legacy_file)
    real = legacy.convert

    def fail_on_the_fifth(row: Any, seq: int) -> dict[str, Any]:
        if seq == 5:
            raise RuntimeError("disk on fire")
        return real(row, seq)

    monkeypatch.setattr(legacy, "convert", fail_on_the_fifth)
    db = Database(settings.effective_database_url)
    with pytest.raises(RuntimeError, match="disk on fire"):
        db.migrate()
    db.dispose()
    assert _dump(legacy_file) == before
    monkeypatch.setattr(legacy, "convert", real)
    db = Database(settings.effective_database_url)
    db.migrate()  # and a later start upgrades it after all
    assert len(_messages(db)) == len(SEQ_ORDER)
    db.dispose()


def test_a_legacy_table_on_postgresql_upgrades_too() -> None:
    rows = _legacy_rows(DATA / "legacy_v2.db", "messages")
    script = _script()
    with fresh_pg_database() as url:
        db = Database(url)
        try:
            with db.engine.begin() as conn:
                for statement in (script.LEGACY_DDL + script.V2_COLUMNS).split(";"):
                    if statement.strip():
                        conn.execute(text(statement))
                for chat in _legacy_rows(DATA / "legacy_v2.db", "chats"):
                    conn.execute(text("INSERT INTO chats VALUES (:jid, :name, :last_message_time)"), chat)
                conn.execute(
                    text(
                        "INSERT INTO scheduled_tasks (id, group_folder, chat_jid, prompt, schedule_type, "
                        "schedule_value, created_at) VALUES ('task-1', 'family', :jid, 'p', 'cron', "
                        "'0 9 * * *', '2024-02-28')"
                    ),
                    {"jid": GROUP},
                )
                conn.execute(
                    text(
                        "INSERT INTO messages VALUES (:id, :chat_jid, :sender, :sender_name, :content, "
                        ":timestamp, :is_from_me, :message_type, :metadata)"
                    ),
                    rows,
                )
                # A NULL type too (the column was nullable on some installs).
                conn.execute(text("ALTER TABLE messages ALTER COLUMN message_type DROP NOT NULL"))
                conn.execute(text("UPDATE messages SET message_type = NULL WHERE id = 'm04'"))
            db.migrate()
            db.migrate()
            messages = _messages(db)
            # No rowid on PostgreSQL: equal timestamps fall back to (chat, id) order.
            pg_order = [k for k in SEQ_ORDER if k != (GROUP, "m07b")]
            pg_order.insert(pg_order.index((GROUP, "m07a")) + 1, (GROUP, "m07b"))
            assert [(m.chat_jid, m.id) for m in messages] == pg_order
            assert [m.seq for m in messages] == list(range(1, len(rows) + 1))
            assert {(m.chat_jid, m.id): m.message_type for m in messages} == TYPES_V2
            assert {(m.chat_jid, m.id): m.metadata for m in messages} == {k: METADATA_V2.get(k) for k in SEQ_ORDER}
            with db.engine.connect() as conn:
                insp = inspect(conn)
                tables = set(insp.get_table_names())
                # Our keys have the names a fresh database gives them (the legacy ones were renamed).
                assert [insp.get_pk_constraint(t)["name"] for t in ("messages", "scheduled_tasks")] == [
                    "messages_pkey",
                    "scheduled_tasks_pkey",
                ]
                assert LEGACY_TABLES | {"scheduled_tasks", "messages"} <= tables
                assert conn.scalar(text("SELECT prompt FROM legacy_scheduled_tasks")) == "p"
                ctx = MigrationContext.configure(
                    conn,
                    opts={
                        "compare_type": True,
                        "include_name": lambda name, type_, parent: not (type_ == "table" and name in LEGACY_TABLES),
                    },
                )
                assert compare_metadata(ctx, Base.metadata) == []
            assert (
                store_message_direct(db=db, id="new", chat_jid=DM, sender=DM, timestamp="2024-03-02T08:00:00+00:00").seq
                == len(rows) + 1
            )
        finally:
            db.dispose()


@pytest.mark.parametrize(
    ("sender", "stored", "expected"),
    [
        ("bot", "user", "assistant"),
        ("host", "user", "host"),
        ("alice", "user", "user"),
        ("bot", "assistant", "assistant"),
        ("command_output", None, "tool_result"),
        ("alice", "system", "system"),
    ],
)
def test_the_legacy_user_default_yields_to_a_harness_sender(sender: str, stored: str | None, expected: str) -> None:
    # Rows older than the legacy message_type column all got its DEFAULT 'user'.
    row = {"id": "m", "chat_jid": "c", "sender": sender, "content": "x", "timestamp": "t", "message_type": stored}
    assert legacy.convert(row, 1)["message_type"] == expected
