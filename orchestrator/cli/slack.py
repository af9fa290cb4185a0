"""CLI commands for Slack: ``orchestrator slack socket`` (messages in over Socket Mode, and
the runs' "working..." messages) and ``orchestrator slack progress`` (the "working..."
messages alone, where the Events API brings messages in).  They need the optional
``slack`` extra only when they run."""

from __future__ import annotations

import signal as os_signal
import threading
from typing import Annotated

import typer

from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import OrchestratorError

slack_app = typer.Typer(
    rich_markup_mode=None,
    no_args_is_help=True,
    help="Slack: messages in over Socket Mode (the channel sends them out).",
)


def register(app: typer.Typer) -> None:
    app.add_typer(slack_app, name="slack")


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (os_signal.SIGTERM, os_signal.SIGINT):
        os_signal.signal(sig, lambda *_: stop.set())
    return stop


@slack_app.command("socket")
def socket(
    seconds: Annotated[float, typer.Option(min=0, help="Stop after this long (0: until stopped).")] = 0,
    progress: Annotated[bool, typer.Option(help="Also post and update the runs' working... messages.")] = True,
) -> None:
    """Store the app's incoming Slack messages (each in the group attached to its channel) until stopped."""
    from orchestrator.channels.slack import SlackWeb
    from orchestrator.channels.slack_progress import WorkingMessages
    from orchestrator.channels.slack_socket import SlackSocket

    root = _setup()
    stop = _stop_on_signals()
    try:
        listener = SlackSocket(root.db, root.settings, signal=root.signals.group, signal_delivery=root.signals.delivery)
        listener.connect()
        follower = WorkingMessages(root.db, root.settings, SlackWeb(root.settings)) if progress else None
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    typer.echo("slack: connected (Socket Mode)")
    worker = threading.Thread(target=follower.run, args=(stop,), daemon=True) if follower else None
    if worker is not None:
        worker.start()
    try:
        stop.wait(seconds or None)
    finally:
        stop.set()
        listener.close()
        if worker is not None:
            worker.join(5)
    typer.echo(f"slack: {listener.taken} envelope(s) taken")


@slack_app.command("progress")
def progress(
    seconds: Annotated[float, typer.Option(min=0, help="Stop after this long (0: until stopped).")] = 0,
) -> None:
    """Post a working... message when a run of a group attached to Slack starts, update it, delete it
    when the first reply is out (run it where no `slack socket` runs)."""
    from orchestrator.channels.slack_progress import WorkingMessages

    root = _setup()
    stop = _stop_on_signals()
    try:
        follower = WorkingMessages(root.db, root.settings)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    if seconds:
        timer = threading.Timer(seconds, stop.set)
        timer.daemon = True
        timer.start()
    follower.run(stop)
