"""Recovery time: a worker SIGKILLed mid-run, until its group's answer is stored.

Two ``celery worker`` processes (one pool child each) and ``celery beat`` (the
sweeper every 15 s, the default), the offline model, cold containers.  A
group's message runs ``$ sleep 5 && echo ...``; once the command has started,
the worker running it (found by the pid in the run's owner,
``host:pid:nonce``) is SIGKILLed with its pool child.  Timed from the kill:

* taken: the group's lease leaves the dead holder (the other worker took it);
* rerun: the new run's container is up;
* answer: the answer is stored (the whole recovery; the 5 s command included).

Then it checks that the answer is stored exactly once and the dead run was
closed as interrupted.  Each trial starts a fresh pair of workers.  Two fleets:

* ``same host``: both workers have one host id (two workers on one machine);
  the survivor sees the dead holder's pid is gone from this machine;
* ``two hosts``: the workers have host ids of their own (as on two machines);
  the survivor can only see the dead host's heartbeat stop
  (``hosts.ALIVE_WINDOW_S``, 15 s).

Baseline measured in the same command: each fleet with the workers' recovery
watch off (``ORCHESTRATOR_RECOVERY_INTERVAL_S=0``), i.e. beat's sweep alone, as
before the watch existed: it waits for the lease to expire (60 s) on one host.
Embedded stack (SQLite + filesystem://); with ``--pg`` and ``--redis`` the
fleet stack too (PostgreSQL + Redis; the Redis database is flushed).

With ``--volumes on`` (root, loop devices) the group's workspace is a loop-mounted
image, as on the default install: the survivor must take the dead host's volume over
(both hosts are of this machine: its mount, at once) before the run starts again.

    .venv/bin/python -m bench.recovery [--trials 3] [--baseline-trials 1] [--fleets same,two]
        [--volumes off,on] [--pg URL --redis URL]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
from sqlalchemy import select

from bench.common import (
    ROOT,
    Extra,
    install,
    remove_install_containers,
    signals_for,
    stacks,
    stop_processes,
    wait_for,
    worker_env,
)
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.sandbox.quota import unmount_all, volume_problem
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.hosts import ALIVE_WINDOW_S, owner_pid
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import Run, list_runs
from orchestrator.store.tables import GroupRow

JID = "recovery@bench"
TARGET_S = 20.0
SLEEP_S = 5
# With --volumes on: the group's workspace is an image this size (the default install's way).
VOLUME_QUOTA = "64m"


@dataclass
class Trial:
    taken: float  # s from the kill until the lease left the dead holder
    rerun: float  # ... until the new run's container was up
    answer: float  # ... until the answer was stored
    answers: int  # how many times it was stored (must be 1)
    closed: bool  # the dead run ended failed, "interrupted"


@contextlib.contextmanager
def processes(settings: Settings, host_ids: list[str], watch: bool) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``celery beat`` and one worker per host id, each in a session of its own."""
    env = worker_env(settings)
    if not watch:
        env["ORCHESTRATOR_RECOVERY_INTERVAL_S"] = "0"
    procs: list[subprocess.Popen[bytes]] = []
    logs = settings.data_dir / "logs"
    logs.mkdir(exist_ok=True)

    def spawn(argv: list[str], name: str, extra: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(logs / f"{name}.log", "ab") as fh:
            proc = subprocess.Popen(
                argv, env={**env, **extra}, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=fh, start_new_session=True
            )
        procs.append(proc)
        return proc

    spawn(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "beat",
            "-l",
            "WARNING",
            "-s",
            str(settings.data_dir / "beat-schedule"),
        ],
        "beat",
        {},
    )
    workers = [
        spawn(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers.app",
                "worker",
                "-Q",
                "agent,delivery",
                "--concurrency",
                "1",
                "-l",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-n",
                f"recovery{i}@%h",
            ],
            f"worker{i}",
            {"ORCHESTRATOR_HOST_ID": host_id},
        )
        for i, host_id in enumerate(host_ids)
    ]
    try:
        yield workers
    finally:
        stop_processes(procs)


def _answers(db: Database, marker: str) -> int:
    return sum(marker in m.content for m in get_messages_after(JID, 0, db=db) if m.sender == "bot")


def _holder(db: Database) -> str | None:
    with db.read() as session:
        return session.scalar(select(GroupRow.lease_owner).where(GroupRow.chat_jid == JID))


def _runs(db: Database) -> list[Run]:
    return list_runs(db, chat_jid=JID, limit=50)


def trial(settings: Settings, db: Database, n: int, host_ids: list[str], watch: bool) -> Trial:
    marker = f"recovered-{n}"
    with processes(settings, host_ids, watch) as workers:
        seq = ingest(
            db,
            settings,
            IncomingMessage(chat_jid=JID, sender="bench", content=f"$ sleep {SLEEP_S} && echo {marker}"),
            signal=signals_for(settings).group,
        ).message.seq
        started: list[Run] = []

        def command_started() -> bool:
            started[:] = [r for r in _runs(db) if r.cursor_to >= seq and r.state == "running" and r.container_id]
            return bool(started) and any(m.sender == "tool_use" for m in get_messages_after(JID, seq, db=db))

        wait_for(command_started, 120, "the run to start", settings)
        dead = started[0]
        pid = owner_pid(dead.owner)
        victims = [w for w in workers if pid in {c.pid for c in psutil.Process(w.pid).children(recursive=True)}]
        if len(victims) != 1:
            raise SystemExit(f"cannot tell which worker runs pid {pid} (owner {dead.owner})")
        os.killpg(victims[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        victims[0].wait()
        limit = 180.0
        taken = wait_for(lambda: _holder(db) != dead.owner, limit, "the lease taken", settings)
        rerun = taken + wait_for(
            lambda: any(r.id != dead.id and r.container_id and r.cursor_to >= seq for r in _runs(db)),
            limit,
            "the new run",
            settings,
        )
        wait_for(lambda: _answers(db, marker) >= 1, limit, "the answer", settings)
        answer = time.monotonic() - t0
        time.sleep(2)  # anything more would come now
        closed = next(r for r in _runs(db) if r.id == dead.id)
    remove_install_containers(settings)
    return Trial(
        taken, rerun, answer, _answers(db, marker), closed.state == "failed" and "interrupted" in (closed.error or "")
    )


def measure(settings: Settings, db: Database, trials: int, host_ids: list[str], watch: bool, label: str) -> None:
    results: list[Trial] = []
    for n in range(trials):
        results.append(trial(settings, db, n, host_ids, watch))
        r = results[-1]
        print(
            f"    trial {n + 1}: lease taken {r.taken:5.1f} s, new run up {r.rerun:5.1f} s, answer {r.answer:5.1f} s"
            f" ({r.answers} answer(s), dead run closed: {'yes' if r.closed else 'NO'})",
            flush=True,
        )
    answers = [r.answer for r in results]
    once = all(r.answers == 1 and r.closed for r in results)
    verdict = ("met" if max(answers) <= TARGET_S else "MISSED") if watch else "baseline"
    print(
        f"  {label}: answer {statistics.median(answers):5.1f} s median, {max(answers):5.1f} s max after the SIGKILL"
        f" over {len(results)} trial(s); lease TTL {settings.fleet.lease_ttl_s:.0f} s, target <= {TARGET_S:.0f} s:"
        f" {verdict}; exactly once: {'yes' if once else 'NO'}",
        flush=True,
    )


# The worker pair's host ids: one machine, or two.
FLEETS = [("same host", ["bench-host", "bench-host"]), ("two hosts", ["bench-a", "bench-b"])]


def run_backend(
    base: Path,
    image: str,
    name: str,
    args: argparse.Namespace,
    extra: Extra,
) -> None:
    print(
        f"{name}: 2 workers + beat (sweep every 15 s), cold containers, `$ sleep {SLEEP_S}`;"
        f" a host is dead after {ALIVE_WINDOW_S:.0f} s without a heartbeat"
    )
    fleets = [(fleet, ids) for fleet, ids in FLEETS if fleet.split()[0] in args.fleets.split(",")]
    modes = [(True, args.trials, "recovery watch"), (False, args.baseline_trials, "beat's sweep alone (baseline)")]
    for volumes in args.volumes.split(","):
        for fleet, host_ids in fleets:
            for watch, trials, how in modes:
                if not trials or (volumes == "on" and not watch):
                    continue  # the baseline is the sweep's; volumes change the recovery watch's path
                with tempfile.TemporaryDirectory(dir=base) as tmp, extra() as more:
                    quota = VOLUME_QUOTA if volumes == "on" else "0"
                    settings, db = install(Path(tmp), image, **more, workspace_quota=quota)
                    add_group(db, chat_jid=JID, name="recovery", folder="recovery", requires_trigger=False)
                    if settings.broker_url.startswith("redis"):
                        import redis

                        redis.Redis.from_url(settings.broker_url).flushdb()
                    try:
                        label = f"{fleet}, {how}" if volumes == "off" else f"{fleet}, volumes on, {how}"
                        measure(settings, db, trials, host_ids, watch, label)
                    finally:
                        remove_install_containers(settings)
                        db.dispose()
                        if volumes == "on":
                            unmount_all(settings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=3, help="kills per fleet with the recovery watch on")
    ap.add_argument("--baseline-trials", type=int, default=1, help="kills per fleet with beat's sweep alone (0: none)")
    ap.add_argument("--fleets", default="same,two", help="which fleets: same (one host id), two (two host ids)")
    ap.add_argument("--pg", default="", help="PostgreSQL server URL (a role that may create databases)")
    ap.add_argument("--redis", default="", help="Redis URL of a database the benchmark may flush (with --pg)")
    ap.add_argument(
        "--volumes",
        default="off",
        help="workspace volumes: off, on (a loop-mounted image per group, as root), or off,on",
    )
    args = ap.parse_args()
    if not set(args.volumes.split(",")) <= {"off", "on"}:
        ap.error(f"--volumes: 'off', 'on' or both (comma-separated), not {args.volumes!r}")
    if "on" in args.volumes.split(",") and volume_problem() is not None:
        ap.error(f"--volumes on: {volume_problem()}")
    if not set(args.fleets.split(",")) <= {"same", "two"}:
        ap.error(f"--fleets: 'same', 'two' or both (comma-separated), not {args.fleets!r}")
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in stacks(args.pg, args.redis):
            run_backend(Path(tmp), settings.sandbox.agent_image, name, args, extra)


if __name__ == "__main__":
    main()
