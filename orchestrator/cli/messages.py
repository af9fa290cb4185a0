"""CLI commands about a chat's messages: ``send`` (a forwarder: the command is send.py's,
on click alone), ``chat`` (the terminal chat of chat.py) and ``history`` (the stored
messages printed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import setup as _setup


def register(app: typer.Typer) -> None:
    app.command(
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
        add_help_option=False,
    )(send)
    app.command()(chat)
    app.command()(history)


def send(ctx: typer.Context) -> None:
    """Store TEXT as a user message in chat CHAT_JID (and wake the agent if it should); --help for more."""
    # A forwarder for --help's list and callers of this typer app: the
    # command itself is on click alone (orchestrator/cli/send.py says why),
    # and entry.py's main() routes `orchestrator send` there before importing typer.
    from orchestrator.cli.send import send_command

    send_command.main(list(ctx.args), prog_name="orchestrator send")


def chat(
    chat_jid: str,
    sender: Annotated[str, typer.Option(help="Your name in the chat.")] = "cli-user",
    linger: Annotated[float, typer.Option(help="Piped input: keep following this many seconds after EOF.")] = 60.0,
    downloads: Annotated[Path, typer.Option(help="Where the files the agent sends are saved.")] = Path("downloads"),
) -> None:
    """Chat with the agent in chat CHAT_JID from this terminal (live replies; /help for commands)."""
    from orchestrator.cli.chat import run_chat

    root = _setup()
    settings, db = root.settings, root.db
    raise typer.Exit(
        run_chat(db, settings, chat_jid, sender, signal=root.signals.group, linger_s=linger, downloads=downloads)
    )


def history(
    chat_jid: str,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array of stored messages.")] = False,
    limit: Annotated[int, typer.Option(help="Newest N messages.")] = 200,
    include_superseded: Annotated[bool, typer.Option("--all", help="Include superseded messages (audit).")] = False,
) -> None:
    """Print a chat's stored messages, oldest first."""
    from orchestrator.model.render import render_text
    from orchestrator.store.message_log import get_recent_messages

    root = _setup()
    settings, db = root.settings, root.db
    msgs = get_recent_messages(chat_jid, limit, include_superseded=include_superseded, db=db)
    if as_json:
        # ASCII JSON: control characters, C1 and bidi overrides arrive as \u escapes.
        typer.echo(json.dumps([m.model_dump(mode="json") for m in msgs], indent=2))
        return
    for m in msgs:
        mark = " (superseded)" if m.superseded_at else " (edited)" if m.edited_at else ""
        _echo(f"#{m.seq:<5} {m.timestamp[:19]} [{m.message_type}]{mark} {render_text(m, settings.assistant_name)}")
