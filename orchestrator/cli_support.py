"""What every CLI command shares: settings, the database, error exits."""

from __future__ import annotations

import logging

import typer

from .db import Database, get_database
from .settings import Settings, get_settings


def setup() -> tuple[Settings, Database]:
    settings = get_settings()
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    settings.ensure_dirs()
    return settings, get_database(settings)


def fail(exc: Exception) -> typer.Exit:
    """Print ``exc`` as a one-line error; raise the returned Exit (status 1)."""
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)
