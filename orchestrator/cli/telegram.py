"""CLI commands for Telegram: ``orchestrator telegram poll`` (needs the
optional ``telegram`` extra only when it runs)."""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import OrchestratorError

telegram_app = typer.Typer(
    rich_markup_mode=None, help="Telegram: messages in by long polling (the channel sends them out)."
)


def register(app: typer.Typer) -> None:
    app.add_typer(telegram_app, name="telegram")


@telegram_app.command("poll")
def poll(
    once: Annotated[bool, typer.Option("--once", help="One getUpdates call, then exit.")] = False,
    timeout: Annotated[int, typer.Option(min=0, max=50, help="Long-polling wait per call, in seconds.")] = 30,
) -> None:
    """Store the bot's incoming Telegram messages (each in the group attached to its chat) until stopped."""
    from orchestrator.channels.telegram_poller import poll_forever

    root = _setup()
    settings, db = root.settings, root.db
    try:
        stored = poll_forever(
            db, settings, once=once, timeout=timeout, signal=root.signals.group, signal_delivery=root.signals.delivery
        )
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    except KeyboardInterrupt:
        return
    if once:
        typer.echo(f"stored {stored} message(s)")
