"""The ``orchestrator`` executable: picks the command's implementation before
importing it.

``send`` has a start-up target (≤ 0.5 s of CPU until the message is stored)
and runs on click alone (orchestrator/cli/send.py); every other command is
the typer app in orchestrator/cli/main.py, whose import costs typer's.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["send"]:
        from orchestrator.cli.send import send_command

        send_command.main(sys.argv[2:], prog_name="orchestrator send")
        return
    from orchestrator.cli.main import main as typer_main

    typer_main()
