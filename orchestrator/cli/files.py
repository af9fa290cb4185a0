"""CLI commands for a chat's stored files: list them, remove one, free the ones no message
names (``orchestrator/store/files.py``)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from orchestrator.cli.support import echo, fail, setup
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal

files_app = typer.Typer(rich_markup_mode=None, help="Files people sent and agents handed back.", no_args_is_help=True)


@files_app.command("list")
def list_files(
    chat_jid: str, as_json: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False
) -> None:
    """A chat's files, oldest first: id, size, type, name, when stored."""
    from orchestrator.core.sizes import human_size
    from orchestrator.store.files import FileStore

    root = setup()
    files = FileStore.from_settings(root.db, root.settings).list_chat(chat_jid)
    if as_json:
        rows = [
            {
                "id": f.id,
                "name": f.name,
                "mime": f.mime,
                "size": f.size,
                "sha256": f.sha256,
                "owner_jid": f.owner_jid,
                "created_at": f.created_at.isoformat(),
            }
            for f in files
        ]
        typer.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    for f in files:
        stored = f.created_at.isoformat(timespec="seconds")
        typer.echo(f"{f.id}  {human_size(f.size):>10}  {f.mime:<24}  {stored}  {for_terminal(f.name)}")
    echo(f"{len(files)} file(s)", err=True)


@files_app.command("rm")
def remove(chat_jid: str, file_id: str) -> None:
    """Free one of a chat's files now (messages that name it keep naming it; it is gone)."""
    from orchestrator.store.files import FileStore

    root = setup()
    try:
        stored = FileStore.from_settings(root.db, root.settings).remove(chat_jid, file_id)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    echo(f"removed {stored.id} ({for_terminal(stored.name)})", err=True)


@files_app.command()
def prune(
    chat_jid: Annotated[Optional[str], typer.Option("--chat-jid", help="Only this chat's files.")] = None,
    grace_s: Annotated[
        Optional[float], typer.Option(help="Older than this (default ORCHESTRATOR_FILE_UNREFERENCED_GRACE_S).")
    ] = None,
) -> None:
    """Free the files no live message names (the sweeper does this on its own)."""
    from orchestrator.store.files import FileStore

    root = setup()
    grace = root.settings.files.unreferenced_grace_s if grace_s is None else grace_s
    store = FileStore.from_settings(root.db, root.settings)
    freed = 0
    while batch := store.prune(grace, chat_jid=chat_jid):
        freed += len(batch)
        for f in batch:
            typer.echo(f"{f.id}  {for_terminal(f.chat_jid)}  {for_terminal(f.name)}")
    echo(f"freed {freed} file(s)", err=True)


def register(app: typer.Typer) -> None:
    app.add_typer(files_app, name="files")
