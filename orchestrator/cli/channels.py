"""CLI commands for channels and deliveries: ``groups attach`` / ``detach`` /
``channels``, ``deliveries`` (list) and ``deliveries flush``."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import OrchestratorError

# deliveries.STATES, written out: importing the deliveries module (SQLAlchemy)
# to print a help text would cost every command's start-up
# (tests/host/test_entry_points.py checks the two agree).
DELIVERY_STATES = ("pending", "sending", "sent", "failed", "cancelled")

deliveries_app = typer.Typer(
    rich_markup_mode=None, help="Deliveries of stored messages to channels.", invoke_without_command=True
)


def register(app: typer.Typer, groups_app: typer.Typer) -> None:
    groups_app.command("attach")(groups_attach)
    groups_app.command("detach")(groups_detach)
    groups_app.command("channels")(groups_channels)
    app.add_typer(deliveries_app, name="deliveries")


def groups_attach(
    chat_jid: str,
    channel: str,
    address: Annotated[Optional[str], typer.Option(help="Where on the channel (default: the chat id).")] = None,
    config: Annotated[Optional[str], typer.Option(help="The channel's settings for this group, a JSON object.")] = None,
) -> None:
    """Show group CHAT_JID's messages on CHANNEL from now on (again: change its address)."""
    from orchestrator.store.attachments import attach_channel

    root = _setup()
    try:
        conf = None if config is None else json.loads(config)
        try:
            a = attach_channel(root.db, chat_jid, channel, address=address, config=conf, registry=root.channels)
        finally:
            root.close()
    except (OrchestratorError, ValueError) as exc:
        raise _fail(exc) from exc
    _echo(f"{a.chat_jid}: attached to {a.channel} at {a.address}")


def groups_detach(jid: str, channel: str) -> None:
    """Stop showing group CHAT_JID's messages on CHANNEL (its unsent deliveries are cancelled)."""
    from orchestrator.store.attachments import detach_channel

    db = _setup().db
    if not detach_channel(db, jid, channel):
        raise _fail(OrchestratorError(f"{jid} is not attached to {channel!r}"))
    _echo(f"{jid}: detached from {channel}")


def groups_channels(
    jid: Annotated[Optional[str], typer.Argument(help="Only this group.")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List the channels each group is attached to."""
    from orchestrator.store.attachments import list_attachments

    db = _setup().db
    attachments = list_attachments(db, jid)
    if as_json:
        typer.echo(json.dumps([a.model_dump() for a in attachments], indent=2))
        return
    for a in attachments:
        _echo(f"{a.chat_jid:30} {a.channel:16} {a.address}")


@deliveries_app.callback()
def deliveries_list(
    ctx: typer.Context,
    group: Annotated[
        Optional[str], typer.Option("--chat-jid", "--group", help="Only this chat (--group: its older name).")
    ] = None,
    state: Annotated[Optional[str], typer.Option(help=f"Only this state: {', '.join(DELIVERY_STATES)}.")] = None,
    limit: Annotated[int, typer.Option()] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List deliveries, newest message first."""
    from orchestrator.store.deliveries import list_deliveries

    if ctx.invoked_subcommand is not None:
        return
    db = _setup().db
    rows = list_deliveries(db, chat_jid=group, state=state, limit=limit)
    if as_json:
        typer.echo(json.dumps([d.model_dump(mode="json") for d in rows], indent=2))
        return
    for d in rows:
        when = f"sent {d.sent_at:%H:%M:%S}" if d.sent_at else f"next {d.next_attempt_at:%H:%M:%S}"
        _echo(
            f"#{d.message_seq:<6} {d.chat_jid:24} {d.channel:12} {d.state:9} attempts {d.attempts}  "
            f"{when}  {d.last_error or ''}"
        )


@deliveries_app.command("flush")
def deliveries_flush(
    group: Annotated[
        Optional[str], typer.Option("--chat-jid", "--group", help="Only this chat (--group: its older name).")
    ] = None,
) -> None:
    """Send due deliveries now, from this process (on the channels it knows)."""
    root = _setup()
    try:
        deliverer = root.deliverer()
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    try:
        report = deliverer.deliver_due(group)
    finally:
        root.close()
    retry = "" if report.retry_in is None else f", next retry in {report.retry_in:.1f}s"
    typer.echo(f"sent {report.sent}, failed attempts {report.failed_attempts}, cancelled {report.cancelled}{retry}")
