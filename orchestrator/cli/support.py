"""What every CLI command shares: the composition root, error exits, printing.

``setup`` builds the :class:`~orchestrator.root.Orchestrator` and sets up the
command's process (its log lines, the secrets kept out of them, its trace
exporters); the root's parts (the database with SQLAlchemy and Alembic, Celery,
Docker) are made when a command first touches them, so ``orchestrator --help``
pays for none of them.

Lines for people go out through :func:`echo` (and errors through :func:`fail`):
what they carry from outside (a message, a tool's output, a chat's or a file's
name, an error naming them) has its control characters shown as escapes
(``orchestrator/core/terminal.py``).  Machine outputs (``--json``) are JSON
with every non-ASCII character escaped (``json.dumps``' default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal

if TYPE_CHECKING:
    from orchestrator.root import Orchestrator


def setup() -> Orchestrator:
    from orchestrator.core.logs import configure as configure_logging
    from orchestrator.core.process import set_up_process
    from orchestrator.root import Orchestrator

    try:
        root = Orchestrator.from_environment()
    except OrchestratorError as exc:  # e.g. an ORCHESTRATOR_* variable that does not convert
        raise fail(exc) from exc
    settings = root.settings
    configure_logging(settings)
    # The command's process: its secrets kept out of what it writes, its trace exporters
    # (orchestrator/core/process.py); the entry point's to set, not the root's.
    set_up_process(settings)
    settings.ensure_dirs()
    return root


def echo(text: str, *, err: bool = False, fg: str | None = None) -> None:
    """Print a line for people (stdout, or stderr with ``err``), control characters escaped."""
    if fg is None:
        typer.echo(for_terminal(text), err=err)
    else:
        typer.secho(for_terminal(text), fg=fg, err=err)


def fail(exc: Exception) -> typer.Exit:
    """Print ``exc`` as a one-line error; raise the returned Exit (status 1)."""
    echo(f"error: {exc}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=1)
