"""Invalid metadata is refused, naming the field, by every public entry point,
and nothing is stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.core.errors import InvalidMessageMetadata
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after, store_message_direct

JID = "main@local"
BAD = {"message_type": "CODE_EDIT", "payload": {"edits": [{"file_path": "a.py", "diff": "+x"}]}}
FIELD = "metadata.payload.edits[0].diff"


def _nothing_stored(db: Database) -> None:
    assert get_messages_after(JID, 0, include_superseded=True, db=db) == []


def test_store_message_direct(db: Database) -> None:
    with pytest.raises(InvalidMessageMetadata) as err:
        store_message_direct(
            db=db, id="m", chat_jid=JID, sender="u", content="x", timestamp="2026-11-26T10:00:00+00:00", metadata=BAD
        )
    assert err.value.field == FIELD and "unknown field" in str(err.value)
    _nothing_stored(db)


def test_ingest(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    signals: list[str] = []
    with pytest.raises(InvalidMessageMetadata) as err:
        ingest(
            db, settings, IncomingMessage(chat_jid=JID, sender="u", content="x", metadata=BAD), signal=signals.append
        )
    assert err.value.field == FIELD
    assert signals == []
    _nothing_stored(db)


def test_cli_send(db: Database, settings: Settings) -> None:
    ensure_main_group(db)
    env = {
        **os.environ,
        "ORCHESTRATOR_DATA_DIR": str(settings.data_dir),
        "ORCHESTRATOR_DATABASE_URL": settings.database_url,
    }
    cli = str(Path(sys.executable).parent / "orchestrator")
    for metadata, expected in [(json.dumps(BAD), FIELD), ("{not json", "Expecting property name")]:
        done = subprocess.run(
            [cli, "send", JID, "hi", "--metadata", metadata], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, done.stderr
        assert expected in done.stderr
    _nothing_stored(db)


def test_the_cli_lists_every_delivery_state() -> None:
    # cli_channels writes the states out so that --help need not import the store.
    from orchestrator.cli.channels import DELIVERY_STATES
    from orchestrator.store.deliveries import STATES

    assert DELIVERY_STATES == STATES


def test_help_imports_neither_the_store_nor_celery() -> None:
    """``orchestrator --help`` starts at once: no SQLAlchemy, Alembic, Celery,
    pydantic or httpx is imported to print it (bench/cli.py times it)."""
    import subprocess
    import sys

    probe = (
        "import sys; sys.argv = ['orchestrator', '--help']\n"
        "from orchestrator.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('sqlalchemy', 'alembic', 'celery', 'kombu', 'pydantic', 'httpx', 'docker')"
        " if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Usage: orchestrator" in done.stdout
    assert "HEAVY []" in done.stdout, done.stdout
