"""CLI commands about the fleet: ``orchestrator hosts`` (every worker host, its
liveness by the database's clock, its runs, warm containers and groups)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import setup as _setup

if TYPE_CHECKING:
    from orchestrator.store.hosts import Host

# hosts.ALIVE_WINDOW_S, written out: importing the store (SQLAlchemy) for a help
# text would cost every command's start-up (tests/host/test_hosts.py checks they agree).
ALIVE_WINDOW_S = 9.0


def register(app: typer.Typer) -> None:
    app.command("hosts")(hosts)


def hosts(
    as_json: Annotated[bool, typer.Option("--json")] = False,
    window: Annotated[
        float, typer.Option(min=0.0, help="A host is alive while its last heartbeat is younger than this (seconds).")
    ] = ALIVE_WINDOW_S,
) -> None:
    """List the worker hosts: state, liveness, last heartbeat, runs, warm containers, the groups
    whose lease each holds and the groups placed on each."""
    from orchestrator.store.hosts import list_hosts

    root = _setup()
    try:
        found = list_hosts(root.db, window_s=window)
    finally:
        root.close()
    if as_json:
        typer.echo(json.dumps([h.model_dump(mode="json") for h in found], indent=2))
        return
    if not found:
        typer.echo("no hosts have registered yet (a worker registers its host when it starts)")
        return
    rows: list[tuple[str, ...]] = [
        ("HOST", "STATE", "ALIVE", "HEARTBEAT", "PID", "VERSION", "RUNS", "WARM", "PLACED", "GROUPS")
    ]
    rows += [_row(h) for h in found]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        _echo("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1])


def _row(h: Host) -> tuple[str, ...]:
    warm: Optional[int] = h.warm_containers
    return (
        h.host_id,
        h.state,
        "yes" if h.alive else "no",
        f"{_age(h.heartbeat_age_s)} ago",
        str(h.pid),
        h.version,
        str(len(h.runs)),
        "?" if warm is None else str(warm),
        _count(h.placed),
        ", ".join(h.groups) or "-",
    )


def _count(placed: list[str]) -> str:
    # The number only: a host may hold hundreds of placed groups (--json lists them).
    return str(len(placed))


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"
