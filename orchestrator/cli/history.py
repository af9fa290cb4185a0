"""CLI commands that change or move a chat's history: edit, regenerate,
truncate, export, import.  Messages are named by id or by ``#seq`` (as
``orchestrator history`` prints them)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.support import echo, fail, setup
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal

if TYPE_CHECKING:
    from orchestrator.store.history import HistoryChange


def _report(change: HistoryChange, what: str) -> None:
    m = change.message
    line = f"{what} #{m.seq} ({m.id})"
    if change.superseded:
        line += f"; superseded {len(change.superseded)} message(s) after it"
    if change.rerun:
        line += "; the agent will answer again"
    echo(line, err=True)


def edit(
    chat_jid: str,
    message: Annotated[str, typer.Argument(help="Message id or #seq.")],
    text: str,
    context: Annotated[Optional[str], typer.Option(help="New context items, a JSON list.")] = None,
    rerun: Annotated[bool, typer.Option(help="Supersede what followed and have the agent answer again.")] = False,
) -> None:
    """Edit a person's message; the old text is kept in its metadata."""
    from orchestrator.store.history import edit_message
    from orchestrator.store.message_log import resolve_message

    root = setup()
    settings, db = root.settings, root.db
    try:
        items = None if context is None else json.loads(context)
        ref = resolve_message(chat_jid, message, db=db)
        change = edit_message(
            db,
            settings,
            chat_jid,
            ref.id,
            text,
            context=items,
            rerun=rerun,
            signal=root.signals.group,
            signal_delivery=root.signals.delivery,
        )
    except (OrchestratorError, ValueError) as exc:  # json's errors are ValueErrors
        raise fail(exc) from exc
    _report(change, "edited")


def regenerate_cmd(
    chat_jid: str, message: Annotated[str, typer.Argument(help="The assistant reply: id or #seq.")]
) -> None:
    """Supersede an assistant reply (and what followed) and run the agent again."""
    from orchestrator.store.history import regenerate
    from orchestrator.store.message_log import resolve_message

    root = setup()
    settings, db = root.settings, root.db
    try:
        ref = resolve_message(chat_jid, message, db=db)
        change = regenerate(
            db, settings, chat_jid, ref.id, signal=root.signals.group, signal_delivery=root.signals.delivery
        )
    except OrchestratorError as exc:
        raise fail(exc) from exc
    _report(change, "regenerating the reply")


def truncate(jid: str, message: Annotated[str, typer.Argument(help="Keep up to this message: id or #seq.")]) -> None:
    """Supersede every message after MESSAGE (kept for audit, shown nowhere)."""
    from orchestrator.store.history import truncate_after
    from orchestrator.store.message_log import resolve_message

    root = setup()
    settings, db = root.settings, root.db
    try:
        ref = resolve_message(jid, message, db=db)
        change = truncate_after(db, settings, jid, ref.id, signal_delivery=root.signals.delivery)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    _report(change, "truncated after")


def export(
    chat_jid: str,
    fmt: Annotated[str, typer.Option("--format", help="md (for people) or json (for import).")] = "md",
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="File to write (default: stdout).")] = None,
    with_files: Annotated[
        bool, typer.Option("--with-files", help="JSON only: carry the files the messages name, not just their ids.")
    ] = False,
) -> None:
    """Write a chat's history as markdown or as JSON that `import` reads back."""
    from orchestrator.store.files import FileStore
    from orchestrator.store.transfer import export_json, export_markdown

    root = setup()
    settings, db = root.settings, root.db
    if fmt not in ("md", "json"):
        raise fail(ValueError(f"--format must be md or json, not {fmt!r}"))
    if with_files and fmt != "json":
        raise fail(ValueError("--with-files needs --format json"))
    if fmt == "json":
        text = export_json(db, chat_jid, files=FileStore.from_settings(db, settings) if with_files else None)
    else:
        text = export_markdown(db, chat_jid, settings.assistant_name)
    if output is None:
        # The markdown carries the messages as they are: escaped for the terminal (the
        # JSON is ASCII, every other character escaped by its encoder: store/transfer.py).
        sys.stdout.write(for_terminal(text) + "\n")
    else:
        output.write_text(text + "\n", encoding="utf-8")
        echo(f"wrote {output}", err=True)


def import_cmd(path: Annotated[Path, typer.Argument(help="A JSON file written by `export --format json`.")]) -> None:
    """Import a chat exported as JSON (idempotent; never wakes the agent)."""
    from orchestrator.store.files import FileStore
    from orchestrator.store.transfer import import_chat, parse_export

    root = setup()
    db = root.db
    try:
        doc = parse_export(path.read_text(encoding="utf-8"))
        result = import_chat(db, doc, files=FileStore.from_settings(db, root.settings))
    except (OrchestratorError, OSError) as exc:
        raise fail(exc) from exc
    echo(
        f"imported {result.imported} message(s) into {result.chat_jid}, skipped {result.skipped} already present"
        + (" (group registered)" if result.group_created else ""),
        err=True,
    )
    if result.main_ignored:
        echo(
            f"note: the file names {result.chat_jid} the main group; it was registered as an ordinary group "
            "(an import never makes a main group)",
            err=True,
        )


def register(app: typer.Typer) -> None:
    app.command()(edit)
    app.command("regenerate")(regenerate_cmd)
    app.command()(truncate)
    app.command()(export)
    app.command("import")(import_cmd)
