"""The Alembic migrations and the table mappings describe the same schema."""

from __future__ import annotations

import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from orchestrator.core.settings import Settings
from orchestrator.store.db import SCHEMA_HEAD, Database, open_database
from orchestrator.store.tables import Base


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
