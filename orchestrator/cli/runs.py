"""CLI commands that replay a run against another model and compare runs:
``orchestrator runs replay RUN --model M`` and ``orchestrator runs diff A B``
(``orchestrator/run/replay.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.terminal import for_terminal

if TYPE_CHECKING:
    from orchestrator.run.egress_log import EgressLog
    from orchestrator.run.run_diff import RunDiff, RunSummary


def register(runs_app: typer.Typer) -> None:
    runs_app.command("replay")(runs_replay)
    runs_app.command("diff")(runs_diff)


def runs_replay(
    run_id: str,
    model: Annotated[
        str,
        typer.Option(
            help="The model to ask: 'offline', 'anthropic:<model id>' or "
            "'openai:<model id>', as ORCHESTRATOR_MODEL spells it."
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False,
) -> None:
    """Run a recorded run's exact input against another model, here and now, in a scratch copy of
    the group's workspace (the chat, its workspace and its session are never touched), then show
    both runs side by side."""
    from orchestrator.run.replay import create_replay, execute_replay
    from orchestrator.run.run_diff import diff_runs

    root = _setup()
    try:
        replay = create_replay(root.db, root.settings, run_id, model)
        _echo(f"replay {replay.id} of run {replay.replay_of} with {model}: running ...", err=True)
        done = execute_replay(root.db, root.settings, root.docker, replay.id)
        assert done.replay_of is not None
        diff = diff_runs(root.db, done.replay_of, done.id)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    finally:
        root.close()
    _show(diff, as_json)
    if done.state != "succeeded":
        raise typer.Exit(code=1)


def runs_diff(
    a: str, b: str, as_json: Annotated[bool, typer.Option("--json", help="Print the diff as JSON.")] = False
) -> None:
    """Two runs side by side (an original and its replay, or two replays): replies, tool calls and
    their exit codes, tokens, cost estimate, duration, stop reason, turns."""
    from orchestrator.run.run_diff import diff_runs

    root = _setup()
    try:
        diff = diff_runs(root.db, a, b)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    finally:
        root.close()
    _show(diff, as_json)


def _show(diff: RunDiff, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(diff.model_dump(mode="json"), indent=2))  # ASCII: every other character escaped
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(show_lines=True)
    table.add_column("")
    table.add_column(f"A {diff.a.run_id[:8]}", overflow="fold")
    table.add_column(f"B {diff.b.run_id[:8]}", overflow="fold")
    for name, show in _ROWS:
        # Text cells: the replies and tool calls are the agent's; no markup read in them
        # (``[link=...]`` would be a hyperlink), their control characters escaped.
        table.add_row(name, Text(for_terminal(show(diff.a))), Text(for_terminal(show(diff.b))))
    # Wide enough for two runs side by side when the output is a file or a pipe.
    console = Console(width=None if Console().is_terminal else 160, highlight=False, soft_wrap=False)
    console.print(table)
    if not diff.same_input_messages:
        typer.secho("note: the two runs' recorded inputs hold different messages", fg=typer.colors.YELLOW, err=True)


def _tokens(s: RunSummary) -> str:
    text = f"{s.input_tokens:,} in / {s.output_tokens:,} out"
    if s.cache_read_input_tokens or s.cache_creation_input_tokens:
        text += f"\n(cache {s.cache_read_input_tokens:,} read, {s.cache_creation_input_tokens:,} written)"
    return text


def _calls(s: RunSummary) -> str:
    lines = []
    for i, call in enumerate(s.tool_calls, 1):
        code = "-" if call.exit_code is None else str(call.exit_code)
        lines.append(f"{i}. {call.name}: {call.input[:160]}  → exit {code}")
    return "\n".join(lines) or "-"


_ROWS: list[tuple[str, Callable[[RunSummary], str]]] = [
    ("run", lambda s: s.run_id + (f"\nreplay of {s.replay_of[:8]}" if s.replay_of else "")),
    ("model", lambda s: s.model),
    ("state", lambda s: s.state + (f"\n{s.error}" if s.error else "")),
    ("stop reason", lambda s: s.stop_reason or "-"),
    ("turns", lambda s: "-" if s.num_turns is None else str(s.num_turns)),
    ("duration", lambda s: "-" if s.duration_s is None else f"{s.duration_s:.1f} s"),
    ("tokens", _tokens),
    ("cost", lambda s: "no estimate" if s.cost_usd is None else f"≈ ${s.cost_usd:.4f}"),
    ("replies", lambda s: "\n\n".join(s.replies) or "-"),
    ("tool calls", _calls),
]


def print_egress(log: EgressLog) -> None:
    """The run's egress decisions, one line each."""
    if not log.decisions:
        _echo(
            f"run {log.run_id[:8]}: no egress (its group's network policy was off, nothing was asked, "
            "or its log is past its retention)"
        )
        return
    for d in log.decisions:
        verdict = "allowed" if d.allowed else "refused"
        moved = f"  {d.sent}/{d.received} bytes" if d.allowed else ""
        _echo(f"{verdict:8} {d.method} {d.host}:{d.port}{d.path or ''}  {d.reason}{moved}")
    if log.left_out:
        _echo(f"... and {log.left_out} more decision(s) not kept (the run's log is capped)")
