"""What every CLI command shares: the composition root, error exits.

``setup`` builds the :class:`~orchestrator.root.Orchestrator`; its parts (the
database with SQLAlchemy and Alembic, Celery, Docker) are made when a command
first touches them, so ``orchestrator --help`` pays for none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.core.errors import OrchestratorError

if TYPE_CHECKING:
    from orchestrator.root import Orchestrator


def setup() -> Orchestrator:
    from orchestrator.core.logs import configure as configure_logging
    from orchestrator.root import Orchestrator

    try:
        root = Orchestrator.from_environment()
    except OrchestratorError as exc:  # e.g. an ORCHESTRATOR_* variable that does not convert
        raise fail(exc) from exc
    settings = root.settings
    configure_logging(settings)
    settings.ensure_dirs()
    return root


def fail(exc: Exception) -> typer.Exit:
    """Print ``exc`` as a one-line error; raise the returned Exit (status 1)."""
    typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)
