"""The ``orchestrator`` command line."""

from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli import channels as cli_channels
from orchestrator.cli import egress as cli_egress
from orchestrator.cli import files as cli_files
from orchestrator.cli import fleet as cli_fleet
from orchestrator.cli import history as cli_history
from orchestrator.cli import instructions as cli_instructions
from orchestrator.cli import profile as cli_profile
from orchestrator.cli import questions as cli_questions
from orchestrator.cli import runs as cli_runs
from orchestrator.cli import slack as cli_slack
from orchestrator.cli import telegram as cli_telegram

if TYPE_CHECKING:
    from orchestrator.core.settings import Settings
    from orchestrator.root import Orchestrator
from orchestrator.cli.profile import quota_text
from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import ConfigError, OrchestratorError

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


# -- processes ----------------------------------------------------------------


@app.command()
def up(
    port: Annotated[int, typer.Option(help="HTTP port (0: no HTTP server).")] = -1,
    host: Annotated[Optional[str], typer.Option(help="HTTP bind address.")] = None,
    concurrency: Annotated[int, typer.Option(help="Worker slots (parallel runs).")] = 2,
) -> None:
    """Run everything on this machine: agent worker, delivery worker, beat and HTTP API (Ctrl-C stops all)."""
    from orchestrator.cli.supervisor import Child, Supervisor, api_argv, beat_argv, worker_argv
    from orchestrator.core.logs import write_dict_config
    from orchestrator.sandbox.containers import docker_client
    from orchestrator.sandbox.image import ensure_agent_image, image_name, settings_variant
    from orchestrator.store.groups import MAIN_JID, ensure_main_group

    root = _setup()
    settings, db = root.settings, root.db
    port = settings.api_port if port < 0 else port
    host = host or settings.api_host
    if port:
        _check_api_exposure(host, settings)
    try:
        ensure_main_group(db, settings.main_group or MAIN_JID)
        client = docker_client(settings)
        variant = settings_variant(settings)
        typer.echo(f"checking the agent image {image_name(settings, variant)} (built if missing) ...")
        ensure_agent_image(client, settings, variant=variant)
        from orchestrator.run.sweeper import live_run_ids
        from orchestrator.sandbox.containers import DockerSandbox

        removed = DockerSandbox(settings, client).remove_orphans(live_run_ids(db))
        if removed:
            typer.echo(f"removed {removed} leftover run container(s)")
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    env = dict(os.environ, ORCHESTRATOR_DATA_DIR=str(settings.data_dir), ORCHESTRATOR_API_HOST=host)
    children = [
        # Runs and deliveries in separate processes: a finished reply reaches its
        # channels while every agent slot is busy.
        Child("worker", worker_argv(concurrency, settings.log_level, queues=("agent",), name="agent@%h")),
        # Its /metrics on the next port: two workers cannot serve one (orchestrator/core/metrics.py).
        Child(
            "deliverer",
            worker_argv(2, settings.log_level, queues=("delivery",), name="delivery@%h"),
            env={"ORCHESTRATOR_METRICS_PORT": str(settings.metrics_port + 1)} if settings.metrics_port else {},
        ),
        Child("beat", beat_argv(str(settings.data_dir / "celerybeat-schedule"), settings.log_level)),
    ]
    if port:
        children.append(Child("api", api_argv(host, port, write_dict_config(settings))))
        typer.echo(f"HTTP API on http://{host}:{port}  (health: /health)")
    typer.echo(f"data in {settings.data_dir}; try: orchestrator send main@local '$ echo hello' --wait 60")
    if not port:
        raise typer.Exit(Supervisor(children, env).run())
    from orchestrator.http.endpoint import announced

    # `orchestrator send` finds the API here and stores through it (cli/send.py).
    with announced(settings, host, port):
        code = Supervisor(children, env).run()
    raise typer.Exit(code)


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option(help="Parallel tasks in this worker (runs, for the agent queue).")] = 2,
    queues: Annotated[
        str,
        typer.Option(
            help="Comma-separated: agent (runs), delivery (sends to channels, the sweeper, schedules). "
            "A worker for each keeps replies from waiting for a free agent slot.",
        ),
    ] = "agent,delivery",
    name: Annotated[Optional[str], typer.Option(help="Celery node name, e.g. delivery@%h (default celery@%h).")] = None,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain",
            help="Start no worker: tell the running worker of this host (ORCHESTRATOR_HOST_ID, on this machine) to "
            "drain, as SIGTERM does: it takes no new work, finishes its runs, its groups go to other hosts, "
            "and it stops.",
        ),
    ] = False,
    wait: Annotated[
        float,
        typer.Option(
            min=0.0, help="With --drain: wait up to this many seconds for the worker to stop (0: do not wait)."
        ),
    ] = 0.0,
) -> None:
    """Run one Celery worker (what each fleet host runs), or drain this host's (--drain)."""
    from orchestrator.cli.supervisor import worker_argv

    if drain:
        _drain_worker(wait)
        return
    root = _setup()
    settings = root.settings
    _ensure_main_group(root)
    try:
        argv = worker_argv(
            concurrency, settings.log_level, queues=tuple(q.strip() for q in queues.split(",") if q.strip()), name=name
        )
    except ValueError as exc:
        raise _fail(exc) from exc
    os.execv(argv[0], argv)


def _drain_worker(wait_s: float) -> None:
    """``worker --drain``: SIGTERM to the worker process in this host's row (Celery's warm
    shutdown: the heartbeat says ``draining`` at once, so no group is placed on the host any
    more and signals go to the shared queue; its runs finish; then ``stopped``).  Only on the
    machine the worker runs on: a pid means nothing elsewhere."""
    import signal
    import socket
    import time

    from orchestrator.store.hosts import get_host, pid_running

    root = _setup()
    host_id = root.settings.effective_host_id
    found = get_host(root.db, host_id)
    if found is None or not found.alive:
        raise _fail(
            OrchestratorError(
                f"no running worker of host {host_id!r} (see `orchestrator hosts`; ORCHESTRATOR_HOST_ID names the host)"
            )
        )
    if found.hostname != socket.gethostname():
        raise _fail(
            OrchestratorError(
                f"host {host_id!r}'s worker runs on {found.hostname}, not on this machine: "
                f"run `orchestrator worker --drain` there (or send its pid {found.pid} SIGTERM)"
            )
        )
    try:
        os.kill(found.pid, signal.SIGTERM)
    except OSError as exc:
        raise _fail(OrchestratorError(f"could not signal host {host_id!r}'s worker (pid {found.pid}): {exc}")) from exc
    typer.echo(
        f"host {host_id}: worker pid {found.pid} drains: it finishes {len(found.runs)} run(s) and stops; "
        f"its {len(found.groups)} group(s) with a lease and every group placed on it go to other hosts"
    )
    if wait_s <= 0:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        now = get_host(root.db, host_id)
        if now is None or now.instance != found.instance or now.state == "stopped" or not pid_running(found.pid):
            typer.echo(f"host {host_id}: stopped")
            return
        time.sleep(0.5)
    raise _fail(OrchestratorError(f"host {host_id!r}'s worker still runs after {wait_s:g} s (its runs go on)"))


@app.command()
def api(
    port: Annotated[int, typer.Option()] = -1,
    host: Annotated[Optional[str], typer.Option()] = None,
) -> None:
    """Run the HTTP API server alone."""
    from orchestrator.cli.supervisor import api_argv

    root = _setup()
    settings = root.settings
    host = host or settings.api_host
    _check_api_exposure(host, settings)
    _ensure_main_group(root)
    port = settings.api_port if port < 0 else port
    from orchestrator.core.logs import write_dict_config

    argv = api_argv(host, port, write_dict_config(settings))
    from orchestrator.http.endpoint import announce

    # For `orchestrator send` (cli/send.py); uvicorn keeps this pid.
    announce(settings, host, port)
    # The app checks the address again (ORCHESTRATOR_API_HOST), whoever starts it.
    os.execve(argv[0], argv, dict(os.environ, ORCHESTRATOR_API_HOST=host))


def _ensure_main_group(root: Orchestrator) -> None:
    """ORCHESTRATOR_MAIN_GROUP's group, made if missing: a fleet started service by
    service (compose) has its main group whichever service starts first."""
    if not root.settings.main_group:
        return
    from orchestrator.store.groups import ensure_main_group

    try:
        ensure_main_group(root.db, root.settings.main_group)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    finally:
        root.close()


def _check_api_exposure(host: str, settings: Settings) -> None:
    from orchestrator.http.api import check_exposure

    try:
        check_exposure(host, settings.api_token)
    except OrchestratorError as exc:
        raise _fail(exc) from exc


@app.command()
def beat() -> None:
    """Run Celery beat alone: the sweeper (and, later, scheduled tasks)."""
    from orchestrator.cli.supervisor import beat_argv

    settings = _setup().settings
    argv = beat_argv(str(settings.data_dir / "celerybeat-schedule"), settings.log_level)
    os.execv(argv[0], argv)


@app.command()
def sweep() -> None:
    """Run the sweeper once now (re-signal pending groups, close dead runs, remove orphans)."""
    from orchestrator.run.sweeper import sweep as run_sweep
    from orchestrator.store.files import FileStore

    root = _setup()
    try:
        sandbox = root.docker
    except OrchestratorError as exc:
        _echo(f"warning: {exc}; containers not checked", fg=typer.colors.YELLOW, err=True)
        sandbox = None
    report = run_sweep(
        root.db,
        signal=root.signals.group,
        sandbox=sandbox,
        signal_delivery=root.signals.delivery,
        resend_channels=root.channels.resent_after_crash(),
        files=FileStore.from_settings(root.db, root.settings),
        file_grace_s=root.settings.file_unreferenced_grace_s,
        egress_log_retention_days=root.settings.egress_log_retention_days,
    )
    typer.echo(
        f"interrupted runs: {len(report.interrupted_runs)}, re-signalled groups: "
        f"{len(report.signalled_groups)}, removed containers: {report.removed_containers}, "
        f"chats with due deliveries: {len(report.delivery_signals)}, "
        f"abandoned delivery claims: {report.abandoned_deliveries}, "
        f"unreferenced files freed: {report.freed_files}, "
        f"egress logs past their retention deleted: {report.deleted_egress_logs}"
    )


@app.command()
def flower(
    port: Annotated[int, typer.Option()] = 5555,
    address: Annotated[
        str, typer.Option(help="Listen here (beyond loopback: ORCHESTRATOR_FLOWER_BASIC_AUTH).")
    ] = "127.0.0.1",
) -> None:
    """Run Flower (Celery monitoring) against this installation's broker."""
    settings = _setup().settings  # logging, the data dir
    from orchestrator.http.api import is_loopback

    if not settings.flower_basic_auth and not is_loopback(address):
        # Flower shows every task's arguments and can stop workers: not without a login.
        raise _fail(
            ConfigError(
                f"refusing to serve Flower on {address!r} without a login: set "
                "ORCHESTRATOR_FLOWER_BASIC_AUTH=user:password, or keep it on 127.0.0.1"
            )
        )
    argv = [sys.executable, "-m", "celery", "-A", "workers.app", "flower", f"--port={port}", f"--address={address}"]
    env = dict(os.environ)
    if settings.flower_basic_auth:
        # Through the environment: a command line is readable by every user of the machine.
        env["FLOWER_BASIC_AUTH"] = settings.flower_basic_auth
        env.pop("FLOWER_UNAUTHENTICATED_API", None)
    else:
        # On loopback without a login, the JSON API goes without one too (Flower's own default refuses it).
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
    os.execve(argv[0], argv, env)


# -- groups -------------------------------------------------------------------


@groups_app.command("add")
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


@groups_app.command("usage")
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


@groups_app.command("list")
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


@groups_app.command("move")
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


@groups_app.command("reset")
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


@groups_app.command("quota")
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


@groups_app.command("unmount-volumes")
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
            release(root.db, name.removeprefix(SESSION_PREFIX), settings.effective_host_id)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    _echo(f"unmounted {len(done)} workspace volume(s){': ' + ', '.join(done) if done else ''}", err=True)


# -- messages -----------------------------------------------------------------


@app.command(
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    add_help_option=False,
)
def send(ctx: typer.Context) -> None:
    """Store TEXT as a user message in chat CHAT_JID (and wake the agent if it should); --help for more."""
    # A forwarder for --help's list and callers of this typer app: the
    # command itself is on click alone (orchestrator/cli/send.py says why),
    # and main() routes `orchestrator send` there before importing typer.
    from orchestrator.cli.send import send_command

    send_command.main(list(ctx.args), prog_name="orchestrator send")


@app.command()
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


@app.command()
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


# -- runs -----------------------------------------------------------------------


@runs_app.callback()
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


@runs_app.command("waiting")
def runs_waiting(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The fleet's run slots (ORCHESTRATOR_MAX_CONCURRENT_RUNS) and the groups waiting
    for one, in the order they will start."""
    from orchestrator.store.slots import fleet_slots

    root = _setup()
    slots = fleet_slots(root.db, root.settings.max_concurrent_runs)
    if as_json:
        typer.echo(json.dumps(slots.model_dump(mode="json"), indent=2))
        return
    cap = f"{slots.cap:,}" if slots.cap else "no cap"
    typer.echo(f"run slots: {slots.running:,} taken of {cap}; {len(slots.waiting):,} group(s) waiting")
    for w in slots.waiting:
        kind = w.lane + (", main" if w.is_main else "")
        _echo(f"  {w.position:>3}. {w.chat_jid:30} {kind:16} waiting {w.waited_s:.0f}s (since {w.since:%H:%M:%S} UTC)")


@runs_app.command("show")
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
            cli_runs.print_egress(run_egress(db, run.id))
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


@runs_app.command("cancel")
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


# -- scheduled tasks --------------------------------------------------------------


@tasks_app.command("add")
def tasks_add(
    chat_jid: str,
    prompt: Annotated[str, typer.Option(help="What the agent is asked each time.")],
    cron: Annotated[Optional[str], typer.Option(help="A cron line, e.g. '0 9 * * 1-5'.")] = None,
    every: Annotated[Optional[str], typer.Option(help="An interval: 90, 45s, 30m, 2h, 1d.")] = None,
    at: Annotated[Optional[str], typer.Option(help="Once, at an ISO-8601 time (UTC if no zone).")] = None,
    context: Annotated[str, typer.Option(help="group (history and session) or isolated (fresh).")] = "group",
) -> None:
    """Schedule a prompt for group CHAT_JID."""
    from orchestrator.run.schedules import add_task

    chosen = [(k, v) for k, v in (("cron", cron), ("interval", every), ("once", at)) if v]
    if len(chosen) != 1:
        raise _fail(OrchestratorError("give exactly one of --cron, --every, --at"))
    db = _setup().db
    kind, spec = chosen[0]
    try:
        # kind is one of the three names above; context_mode is checked by add_task.
        task = add_task(db, chat_jid=chat_jid, prompt=prompt, kind=kind, spec=spec, context_mode=context)  # type: ignore[arg-type]
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    _echo(
        f"task {task.id[:8]} ({task.kind} {task.spec}, {task.context_mode}) next at {task.next_run_at:%Y-%m-%d %H:%M:%S} UTC"
    )


@tasks_app.command("list")
def tasks_list(
    group: Annotated[
        Optional[str], typer.Option("--chat-jid", "--group", help="Only this chat (--group: its older name).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List scheduled tasks."""
    from orchestrator.run.schedules import list_tasks

    db = _setup().db
    tasks = list_tasks(db, chat_jid=group)
    if as_json:
        typer.echo(json.dumps([t.model_dump(mode="json") for t in tasks], indent=2))
        return
    for t in tasks:
        nxt = f"{t.next_run_at:%Y-%m-%d %H:%M:%S}" if t.next_run_at else "-"
        by = "agent" if t.made_by_agent else "operator"
        _echo(
            f"{t.id[:8]}  {t.state:9} {t.chat_jid:20} {t.kind:8} {t.spec:16} {t.context_mode:8} next {nxt}  "
            f"runs {t.runs}  by {by:8}  {t.prompt[:40]}"
        )


def _task_action(task_id: str, action: str) -> None:
    from orchestrator.run.schedules import change_state

    db = _setup().db
    try:
        task = change_state(db, task_id, action)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    typer.echo(f"task {task.id[:8]} is {task.state}")


@tasks_app.command("pause")
def tasks_pause(task_id: str) -> None:
    """Pause a task (it keeps its schedule)."""
    _task_action(task_id, "pause")


@tasks_app.command("resume")
def tasks_resume(task_id: str) -> None:
    """Resume a paused task (what fell due meanwhile is skipped)."""
    _task_action(task_id, "resume")


@tasks_app.command("cancel")
def tasks_cancel(task_id: str) -> None:
    """Cancel a task for good."""
    _task_action(task_id, "cancel")


# -- image ------------------------------------------------------------------------


@image_app.command("build")
def image_build(
    force: Annotated[bool, typer.Option(help="Rebuild even if current.")] = False,
    variant: Annotated[
        Optional[str],
        typer.Option(
            help="Also build this variant on top (claude-code); default: the one ORCHESTRATOR_MODEL needs, if any.",
        ),
    ] = None,
) -> None:
    """Build the agent image (and the local base image if missing), offline."""
    from orchestrator.sandbox.containers import docker_client
    from orchestrator.sandbox.image import ensure_agent_image, image_name, settings_variant

    settings = _setup().settings
    chosen = variant or settings_variant(settings)
    try:
        name = image_name(settings, chosen)
        image_id = ensure_agent_image(docker_client(settings), settings, force=force, variant=chosen)
    except OrchestratorError as exc:
        raise _fail(exc) from exc
    typer.echo(f"{name} {image_id}")


cli_history.register(app)
cli_files.register(app)
cli_instructions.register(app, groups_app)
cli_profile.register(groups_app)
cli_runs.register(runs_app)
cli_channels.register(app, groups_app)
cli_fleet.register(app)
cli_telegram.register(app)
cli_slack.register(app)
cli_questions.register(app)
cli_egress.register(app)


def main() -> None:
    app()
