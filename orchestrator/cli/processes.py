"""CLI commands that run this installation's processes: ``up`` (all of them under the
supervisor), ``worker`` (and ``worker --drain``), ``api``, ``beat``, ``flower``, and
``sweep`` (the sweeper once, in this process)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from orchestrator.cli.support import echo as _echo
from orchestrator.cli.support import fail as _fail
from orchestrator.cli.support import setup as _setup
from orchestrator.core.errors import ConfigError, OrchestratorError

if TYPE_CHECKING:
    from orchestrator.core.settings import Settings
    from orchestrator.root import Orchestrator


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(worker)
    app.command()(api)
    app.command()(beat)
    app.command()(sweep)
    app.command()(flower)


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
    port = settings.api.port if port < 0 else port
    host = host or settings.api.host
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
        Child("worker", worker_argv(concurrency, settings.telemetry.log_level, queues=("agent",), name="agent@%h")),
        # Its /metrics on the next port: two workers cannot serve one (orchestrator/core/metrics.py).
        Child(
            "deliverer",
            worker_argv(2, settings.telemetry.log_level, queues=("delivery",), name="delivery@%h"),
            env={"ORCHESTRATOR_METRICS_PORT": str(settings.telemetry.metrics_port + 1)}
            if settings.telemetry.metrics_port
            else {},
        ),
        Child("beat", beat_argv(str(settings.data_dir / "celerybeat-schedule"), settings.telemetry.log_level)),
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
            concurrency,
            settings.telemetry.log_level,
            queues=tuple(q.strip() for q in queues.split(",") if q.strip()),
            name=name,
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
    host_id = root.settings.fleet.effective_host_id
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


def api(
    port: Annotated[int, typer.Option()] = -1,
    host: Annotated[Optional[str], typer.Option()] = None,
) -> None:
    """Run the HTTP API server alone."""
    from orchestrator.cli.supervisor import api_argv

    root = _setup()
    settings = root.settings
    host = host or settings.api.host
    _check_api_exposure(host, settings)
    _ensure_main_group(root)
    port = settings.api.port if port < 0 else port
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
        check_exposure(host, settings.api.token)
    except OrchestratorError as exc:
        raise _fail(exc) from exc


def beat() -> None:
    """Run Celery beat alone: the sweeper (and, later, scheduled tasks)."""
    from orchestrator.cli.supervisor import beat_argv

    settings = _setup().settings
    argv = beat_argv(str(settings.data_dir / "celerybeat-schedule"), settings.telemetry.log_level)
    os.execv(argv[0], argv)


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
        file_grace_s=root.settings.files.unreferenced_grace_s,
        egress_log_retention_days=root.settings.egress.log_retention_days,
    )
    typer.echo(
        f"interrupted runs: {len(report.interrupted_runs)}, re-signalled groups: "
        f"{len(report.signalled_groups)}, removed containers: {report.removed_containers}, "
        f"chats with due deliveries: {len(report.delivery_signals)}, "
        f"abandoned delivery claims: {report.abandoned_deliveries}, "
        f"unreferenced files freed: {report.freed_files}, "
        f"egress logs past their retention deleted: {report.deleted_egress_logs}"
    )


def flower(
    port: Annotated[int, typer.Option()] = 5555,
    address: Annotated[
        str, typer.Option(help="Listen here (beyond loopback: ORCHESTRATOR_FLOWER_BASIC_AUTH).")
    ] = "127.0.0.1",
) -> None:
    """Run Flower (Celery monitoring) against this installation's broker."""
    settings = _setup().settings  # logging, the data dir
    from orchestrator.http.api import is_loopback

    if not settings.api.flower_basic_auth and not is_loopback(address):
        # Flower shows every task's arguments and can stop workers: not without a login.
        raise _fail(
            ConfigError(
                f"refusing to serve Flower on {address!r} without a login: set "
                "ORCHESTRATOR_FLOWER_BASIC_AUTH=user:password, or keep it on 127.0.0.1"
            )
        )
    argv = [sys.executable, "-m", "celery", "-A", "workers.app", "flower", f"--port={port}", f"--address={address}"]
    env = dict(os.environ)
    if settings.api.flower_basic_auth:
        # Through the environment: a command line is readable by every user of the machine.
        env["FLOWER_BASIC_AUTH"] = settings.api.flower_basic_auth
        env.pop("FLOWER_UNAUTHENTICATED_API", None)
    else:
        # On loopback without a login, the JSON API goes without one too (Flower's own default refuses it).
        env["FLOWER_UNAUTHENTICATED_API"] = "true"
    os.execve(argv[0], argv, env)
