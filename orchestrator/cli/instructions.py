"""``orchestrator instructions`` and ``orchestrator groups instructions JID``: the host-owned
instructions every run's system prompt carries, the installation's and a group's
(``orchestrator/run/instructions.py``).  Without ``--file`` or ``--clear`` they print what is set."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.support import echo, fail, setup
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal

if TYPE_CHECKING:
    from orchestrator.root import Orchestrator

FileOption = Annotated[
    Optional[Path], typer.Option("--file", help="A UTF-8 text file to set them from ('-': standard input).")
]
ClearOption = Annotated[bool, typer.Option("--clear", help="Remove them.")]


def _change(root: Orchestrator, folder: str | None, what: str, file: Path | None, clear: bool) -> None:
    from orchestrator.run.instructions import read_instructions_file, write_instructions

    if file is not None and clear:
        raise fail(ValueError("give one of --file, --clear"))
    try:
        if clear:
            write_instructions(root.settings, folder, None)
            echo(f"{what}: cleared", err=True)
        elif file is not None:
            text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
            write_instructions(root.settings, folder, text)
            echo(f"{what}: set ({len(text.encode('utf-8'))} bytes); every run from now on gets them", err=True)
        else:
            text = read_instructions_file(root.settings, folder)
            typer.echo(for_terminal(text) if text else f"({what}: none)")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise fail(exc) from exc


def installation_instructions(file: FileOption = None, clear: ClearOption = False) -> None:
    """The instructions every group's agent gets, after the base prompt."""
    _change(setup(), None, "the installation's instructions", file, clear)


def group_instructions(chat_jid: str, file: FileOption = None, clear: ClearOption = False) -> None:
    """A group's own instructions, after the installation's."""
    from orchestrator.store.groups import get_group

    root = setup()
    try:
        group = get_group(root.db, chat_jid)
    except OrchestratorError as exc:
        raise fail(exc) from exc
    _change(root, group.folder, f"{chat_jid}'s instructions", file, clear)


def register(app: typer.Typer, groups_app: typer.Typer) -> None:
    app.command("instructions")(installation_instructions)
    groups_app.command("instructions")(group_instructions)
