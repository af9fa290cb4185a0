"""What every CLI command shares: settings, the database, error exits.

Imports of the store (SQLAlchemy, Alembic) happen in ``setup``, when a
command needs them: ``orchestrator --help`` must not pay for them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from orchestrator.core.settings import Settings
    from orchestrator.store.db import Database


def setup() -> tuple[Settings, Database]:
    from orchestrator.core.settings import get_settings
    from orchestrator.store.db import get_database

    settings = get_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings.ensure_dirs()
    return settings, get_database(settings)


def fail(exc: Exception) -> typer.Exit:
    """Print ``exc`` as a one-line error; raise the returned Exit (status 1)."""
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)
