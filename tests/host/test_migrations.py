"""The Alembic migrations and the table mappings describe the same schema."""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import insert, inspect, update
from sqlalchemy.exc import IntegrityError

from orchestrator.core.settings import Settings
from orchestrator.store.db import SCHEMA_HEAD, Database, open_database
from orchestrator.store.groups import list_groups
from orchestrator.store.tables import Base, GroupRow
from tests.conftest import alembic


def test_migrated_schema_matches_the_mappings(db: Database) -> None:
    with db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    assert diff == []


def test_the_known_head_is_alembics_head() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from orchestrator.store import db as dbmod

    cfg = Config()
    cfg.set_main_option("script_location", str(dbmod._MIGRATIONS))
    assert ScriptDirectory.from_config(cfg).get_current_head() == dbmod.SCHEMA_HEAD


def test_a_database_at_the_head_opens_without_alembic(db: Database, settings: Settings) -> None:
    # What every CLI command pays: one row read, no Alembic import.
    assert db.schema_revision() == SCHEMA_HEAD
    code = (
        "import sys; from orchestrator.core.settings import Settings; from orchestrator.store.db import open_database; "
        f"db = open_database(Settings.load(data_dir={str(settings.data_dir)!r}, database_url={settings.database_url!r}, "
        "env_file=None)); print(db.schema_revision(), 'alembic' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [SCHEMA_HEAD, "False"]


def test_a_new_database_is_migrated_to_the_head(settings: Settings) -> None:
    fresh = open_database(settings.replace(**{"database_url": ""}))
    try:
        assert fresh.schema_revision() == SCHEMA_HEAD
    finally:
        fresh.dispose()


# -- one main group (revision 0017, issue 29) -----------------------------------------------


def _group_row(jid: str, *, is_main: bool, created_at: datetime | None = None) -> dict[str, object]:
    return {
        "chat_jid": jid,
        "name": jid,
        "folder": jid.split("@")[0],
        "is_main": is_main,
        "requires_trigger": False,
        "cursor_seq": 0,
        "pending_seq": 0,
        "created_at": created_at or datetime.now(UTC),
    }


def test_the_database_refuses_a_second_main_group(db: Database) -> None:
    # Whoever writes the row (an import, a script, a race past add_group's look): the index refuses it.
    with db.write() as session:
        session.execute(
            insert(GroupRow),
            [
                _group_row("one@x", is_main=True),
                _group_row("plain@x", is_main=False),
                _group_row("other@x", is_main=False),
            ],
        )
    with pytest.raises(IntegrityError), db.write() as session:
        session.execute(insert(GroupRow), [_group_row("two@x", is_main=True)])
    with pytest.raises(IntegrityError), db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == "plain@x").values(is_main=True))
    assert [g.chat_jid for g in list_groups(db) if g.is_main] == ["one@x"]


def test_migration_0017_keeps_the_oldest_main_group(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    alembic(db, "downgrade", "0016")
    start = datetime(2026, 1, 1, tzinfo=UTC)
    with db.write() as session:  # what a database could hold before: three main groups
        session.execute(
            insert(GroupRow),
            [
                _group_row("newer@x", is_main=True, created_at=start + timedelta(days=2)),
                _group_row("oldest@x", is_main=True, created_at=start),
                _group_row("plain@x", is_main=False, created_at=start - timedelta(days=1)),
                _group_row("newest@x", is_main=True, created_at=start + timedelta(days=3)),
            ],
        )
    with caplog.at_level(logging.WARNING, logger="orchestrator.store.migrations"):
        alembic(db, "upgrade", "head")
    assert db.schema_revision() == SCHEMA_HEAD
    assert {g.chat_jid: g.is_main for g in list_groups(db)} == {
        "newer@x": False,
        "newest@x": False,
        "oldest@x": True,
        "plain@x": False,
    }
    assert "kept the oldest, 'oldest@x'" in caplog.text and "'newer@x', 'newest@x'" in caplog.text
    assert "uq_groups_one_main" in {i["name"] for i in inspect(db.engine).get_indexes("groups")}
    with pytest.raises(IntegrityError), db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == "newer@x").values(is_main=True))
