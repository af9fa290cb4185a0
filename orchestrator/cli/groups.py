"""CLI commands about registered groups: ``groups add``, ``usage``, ``list``, ``move``,
``reset``, ``quota`` and ``unmount-volumes`` (the other ``groups`` commands are
instructions.py's, profile.py's and channels.py's)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from orchestrator.cli.profile import quota_text
from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import OrchestratorError


def register(groups_app: typer.Typer) -> None:
    groups_app.command("add")(groups_add)
    groups_app.command("usage")(groups_usage)
    groups_app.command("list")(groups_list)
    groups_app.command("move")(groups_move)
    groups_app.command("reset")(groups_reset)
    groups_app.command("quota")(groups_quota)
    groups_app.command("unmount-volumes")(groups_unmount_volumes)


def groups_add(
    chat_jid: str,
    name: Annotated[str, typer.Option(help="Display name.")],
    folder: Annotated[str, typer.Option(help="Workspace folder (a slug).")],
    main: Annotated[bool, typer.Option("--main", help="The main group (never needs the trigger).")] = False,
    trigger: Annotated[bool, typer.Option("--trigger/--no-trigger", help="Require @Name to wake the agent.")] = True,
) -> None:
    """Register a chat as a group."""
    from orchestrator.store.groups import add_group

    db = _setup().db
    try:
        g = add_group(db, chat_jid=chat_jid, name=name, folder=folder, is_main=main, requires_trigger=trigger)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    _echo(f"registered {g.chat_jid} ({g.name}, folder {g.folder}, trigger {'on' if g.requires_trigger else 'off'})")


def groups_usage(chat_jid: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A group's runs in the last hour and model tokens today against its quotas (by the
    database's clock), the sender rate limit, and when the next run may start."""
    from orchestrator.store.groups import get_group
    from orchestrator.store.usage import group_usage

    root = _setup()
    try:
        u = group_usage(root.db, root.settings, get_group(root.db, chat_jid))
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    if as_json:
        typer.echo(json.dumps(u.model_dump(mode="json"), indent=2))
        return

    def of(used: int, limit: int, own: int | None) -> str:
        return f"{used:,} of {quota_text(own, limit)}" if limit else f"{used:,}, {quota_text(own, limit)}"

    _echo(f"{u.chat_jid} at {u.now:%Y-%m-%d %H:%M:%S} UTC (the database's clock)")
    typer.echo(f"  runs in the last hour: {of(u.runs_last_hour, u.runs_per_hour, u.runs_per_hour_override)}")
    typer.echo(f"  tokens today (UTC):    {of(u.tokens_today, u.tokens_per_day, u.tokens_per_day_override)}")
    rate = u.sender_messages_per_minute
    typer.echo(f"  messages per sender:   {f'{rate} per minute' if rate else 'no limit'}")
    if u.waiting is None:
        typer.echo("  next run: now (no quota reached)")
    else:
        w = u.waiting
        typer.echo(
            f"  next run: waits for {w.quota.replace('_', ' ')} ({w.used:,} of {w.limit:,}) until "
            f"{w.until:%Y-%m-%d %H:%M:%S} UTC, in {w.wait_s:.0f}s"
        )


def groups_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List registered groups."""
    from orchestrator.store.groups import list_groups

    db = _setup().db
    groups = list_groups(db)
    if as_json:
        typer.echo(json.dumps([g.model_dump() for g in groups], indent=2))
        return
    for g in groups:
        flags = ("main " if g.is_main else "") + ("trigger" if g.requires_trigger else "no-trigger")
        _echo(
            f"{g.chat_jid:30} {g.name:16} folder={g.folder:16} {flags} cursor={g.cursor_seq} "
            f"host={g.placed_host or '-'}"
        )


def groups_move(chat_jid: str, host: str) -> None:
    """Place group CHAT_JID on worker host HOST (an ORCHESTRATOR_HOST_ID that is up: see
    `orchestrator hosts`): its next runs go there; a run in progress finishes where it is,
    and the old host stops the group's warm container."""
    from orchestrator.store.placement import move

    root = _setup()
    try:
        moved = move(root.db, chat_jid, host)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    was = f" (was {moved.previous_host})" if moved.previous_host and moved.previous_host != host else ""
    _echo(f"{chat_jid} placed on {host}{was}")
    if moved.pending:
        try:
            root.signals.group(chat_jid)
            _echo(f"work is pending: signalled {host}")
        except Exception as exc:  # noqa: BLE001 - the sweeper re-signals pending groups
            _echo(f"warning: could not signal {host} now ({exc}); the sweeper will", fg=typer.colors.YELLOW, err=True)


def groups_reset(jid: str) -> None:
    """Start a group afresh: forget its model session and stop its warm container."""
    from orchestrator.sandbox.sessions import reset_session

    root = _setup()
    settings, db = root.settings, root.db
    try:
        stopped = reset_session(db, settings, jid)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    _echo(f"reset {jid}: session forgotten, {stopped} warm container(s) stopped", err=True)


def groups_quota(jid: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """A group's workspace disk usage against its quota, and how the quota is kept."""
    from dataclasses import asdict

    from orchestrator.core.sizes import human_size as human
    from orchestrator.sandbox.config import workspace_quota
    from orchestrator.sandbox.quota import report
    from orchestrator.store.groups import get_group

    root = _setup()
    settings, db = root.settings, root.db
    try:
        g = get_group(db, jid)
        r = report(settings, g.folder, workspace_quota(settings, g.container_config))
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    if as_json:
        typer.echo(json.dumps({"chat_jid": g.chat_jid, **asdict(r)}, indent=2))
        return
    limit = human(r.quota) if r.quota else "no quota"
    _echo(f"{g.chat_jid}: workspace {human(r.used)} used of {limit} (mode {r.mode}: {r.note})")
    if r.volume:
        state = "mounted" if r.mounted else "not mounted"
        typer.echo(f"  volume {r.volume}: {human(r.size)}, {state}, {human(r.allocated)} on the data dir's disk")


def groups_unmount_volumes() -> None:
    """Unmount every group's workspace volume of this data dir (the images and
    files stay; the next run mounts its group's again).  Stop the workers
    first; needed before the data dir can be deleted or moved."""
    from orchestrator.sandbox.quota import SESSION_PREFIX, unmount_all
    from orchestrator.store.volume_holds import release

    root = _setup()
    settings = root.settings
    try:
        done = unmount_all(settings)
        # Unmounted on this machine: another host's machine may mount them now.
        for name in done:
            release(root.db, name.removeprefix(SESSION_PREFIX), settings.fleet.effective_host_id)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    _echo(f"unmounted {len(done)} workspace volume(s){': ' + ', '.join(done) if done else ''}", err=True)
