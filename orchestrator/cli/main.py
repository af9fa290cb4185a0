"""The ``orchestrator`` command line: the typer app, assembled from the command modules.

Each module of ``orchestrator/cli/`` registers its commands on the app or on one of its
command groups (``groups``, ``runs``, ``tasks``, ``image``, made here); the order of the
``register`` calls is the order ``--help`` lists the commands in.
"""

from __future__ import annotations

import typer

from orchestrator.cli import channels as cli_channels
from orchestrator.cli import egress as cli_egress
from orchestrator.cli import files as cli_files
from orchestrator.cli import fleet as cli_fleet
from orchestrator.cli import groups as cli_groups
from orchestrator.cli import history as cli_history
from orchestrator.cli import image as cli_image
from orchestrator.cli import instructions as cli_instructions
from orchestrator.cli import messages as cli_messages
from orchestrator.cli import processes as cli_processes
from orchestrator.cli import profile as cli_profile
from orchestrator.cli import questions as cli_questions
from orchestrator.cli import runs as cli_runs
from orchestrator.cli import slack as cli_slack
from orchestrator.cli import tasks as cli_tasks
from orchestrator.cli import telegram as cli_telegram

app = typer.Typer(
    rich_markup_mode=None, help="Task-queue agent orchestrator.", no_args_is_help=True, add_completion=False
)
groups_app = typer.Typer(rich_markup_mode=None, help="Registered groups.", no_args_is_help=True)
runs_app = typer.Typer(rich_markup_mode=None, help="Agent runs.", invoke_without_command=True)
image_app = typer.Typer(rich_markup_mode=None, help="The agent image.", no_args_is_help=True)
tasks_app = typer.Typer(rich_markup_mode=None, help="Scheduled tasks (cron, interval, once).", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
app.add_typer(groups_app, name="groups")
app.add_typer(runs_app, name="runs")
app.add_typer(image_app, name="image")

cli_processes.register(app)
cli_messages.register(app)
cli_groups.register(groups_app)
cli_runs.register(runs_app)
cli_tasks.register(tasks_app)
cli_image.register(image_app)
cli_history.register(app)
cli_files.register(app)
cli_instructions.register(app, groups_app)
cli_profile.register(groups_app)
cli_channels.register(app, groups_app)
cli_fleet.register(app)
cli_telegram.register(app)
cli_slack.register(app)
cli_questions.register(app)
cli_egress.register(app)


def main() -> None:
    app()
