"""CLI commands about agent runs: ``orchestrator runs`` (the list), ``runs waiting`` (the
fleet's run slots and who waits), ``runs show`` (one run, its exact input, its egress),
``runs cancel``, and ``runs replay RUN --model M`` (a run's input against another model,
``orchestrator/run/replay.py``) and ``runs diff A B`` (two runs compared)."""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Optional

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
    runs_app.callback()(runs_list)
    runs_app.command("waiting")(runs_waiting)
    runs_app.command("show")(runs_show)
    runs_app.command("cancel")(runs_cancel)
    runs_app.command("replay")(runs_replay)
    runs_app.command("diff")(runs_diff)


def runs_list(
    ctx: typer.Context,
    group: Annotated[
        Optional[str], typer.Option("--chat-jid", "--group", help="Only this chat (--group: its older name).")
    ] = None,
    state: Annotated[Optional[str], typer.Option(help="Only runs in this state.")] = None,
    limit: Annotated[int, typer.Option()] = 50,
) -> None:
    """List agent runs, newest first."""
    from orchestrator.store.runs import list_runs

    if ctx.invoked_subcommand is not None:
        return
    db = _setup().db
    for r in list_runs(db, chat_jid=group, state=state, limit=limit):
        took = f"{r.duration_s:.2f}s" if r.duration_s is not None else "-"
        replay = f"  replay of {r.replay_of[:8]}" if r.replay_of else ""
        _echo(
            f"{r.id[:8]}  {r.state:10} {r.chat_jid:24} msgs {r.cursor_from + 1}..{r.cursor_to}  {took}  "
            f"{r.error or ''}{replay}"
        )


def runs_waiting(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The fleet's run slots (ORCHESTRATOR_MAX_CONCURRENT_RUNS) and the groups waiting
    for one, in the order they will start."""
    from orchestrator.store.slots import fleet_slots

    root = _setup()
    slots = fleet_slots(root.db, root.settings.fleet.max_concurrent_runs)
    if as_json:
        typer.echo(json.dumps(slots.model_dump(mode="json"), indent=2))
        return
    cap = f"{slots.cap:,}" if slots.cap else "no cap"
    typer.echo(f"run slots: {slots.running:,} taken of {cap}; {len(slots.waiting):,} group(s) waiting")
    for w in slots.waiting:
        kind = w.lane + (", main" if w.is_main else "")
        _echo(f"  {w.position:>3}. {w.chat_jid:30} {kind:16} waiting {w.waited_s:.0f}s (since {w.since:%H:%M:%S} UTC)")


def runs_show(
    run_id: str,
    show_input: Annotated[
        bool, typer.Option("--input", help="Print the exact ContainerInput JSON the run sent.")
    ] = False,
    verify: Annotated[bool, typer.Option(help="Rebuild the input from the stored history and compare.")] = False,
    egress: Annotated[
        bool, typer.Option("--egress", help="List the run's egress decisions (allowed and refused, and why).")
    ] = False,
) -> None:
    """Show one run (an id or a unique prefix)."""
    from orchestrator.run.assembly import rebuild_input, stored_input
    from orchestrator.run.egress_log import run_egress
    from orchestrator.store.runs import get_run

    root = _setup()
    settings, db = root.settings, root.db
    try:
        run = get_run(db, run_id)
        if egress:
            print_egress(run_egress(db, run.id))
            return
        if not (show_input or verify):
            typer.echo(json.dumps(run.model_dump(mode="json"), indent=2))
            return
        recorded = stored_input(db, run.id)
        if recorded is None:
            raise _fail(ValueError(f"run {run.id} has no recorded input (it failed before assembling one)"))
        if show_input and sys.stdout.isatty():
            # For a person: the JSON escapes C0 itself; C1 and bidi overrides shown as escapes.
            _echo(recorded.decode("utf-8", errors="replace"))
        elif show_input:  # the exact bytes, for a pipe or a file
            sys.stdout.buffer.write(recorded + b"\n")
            sys.stdout.flush()
        if verify:
            rebuilt = rebuild_input(db, settings, run.id)
            if rebuilt == recorded:
                typer.echo(
                    f"verified: the stored history rebuilds the same {len(recorded)} bytes (sha256 {run.input_sha256})",
                    err=True,
                )
                return
            diff = difflib.unified_diff(
                _pretty(recorded), _pretty(rebuilt), "sent", "rebuilt from history now", lineterm=""
            )
            _echo("\n".join(diff), err=True)
            typer.secho(
                "the history changed since this run (edited, superseded or context files changed)",
                fg=typer.colors.YELLOW,
                err=True,
            )
            raise typer.Exit(code=2)
    except OrchestratorError as exc:
        raise _fail(exc) from exc


def _pretty(data: bytes) -> list[str]:
    return json.dumps(json.loads(data), indent=2, ensure_ascii=False).splitlines()


def runs_cancel(run_id: str) -> None:
    """Cancel a run: its worker stops the container and records it as cancelled."""
    from orchestrator.store.runs import cancel_run

    db = _setup().db
    try:
        run = cancel_run(db, run_id)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    if run.state != "cancelled":
        raise _fail(OrchestratorError(f"run {run.id[:8]} already ended as {run.state}"))
    typer.echo(f"run {run.id[:8]} cancelled; its worker stops the container within a second")


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
