"""Run throughput: agent runs per second with 1 and 2 worker processes.

``--groups`` groups (default 100) each hold a conversation of ``--messages``
triggering messages (default 5): a group's next message is sent as soon as
the run that answered its previous one has finished, so up to ``--groups``
runs are waiting at any time.  Offline model (no model time), the real path:
ingest, Celery signal (filesystem:// broker unless ``--pg``/``--redis``),
``celery worker`` processes with one pool child each, the sandbox; cold
containers, then warm sessions (``ORCHESTRATOR_WARM_IDLE_S``).

Baseline measured in the same command: the raw docker-py start rate of the
same image (create + start + wait + remove of ``true``), from 1 and 2
threads.  For each configuration it prints runs/s, container starts/s and
where the CPU went (workers, dockerd, containerd, the rest), which is what
bounds the 2-worker speed-up when it falls short of the 1.7x target.

    .venv/bin/python -m bench.throughput [--groups 100] [--messages 5] [--raw 20]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import docker
from sqlalchemy import func, select

from bench.common import CpuAccount, Workers, daemon_processes, install, remove_install_containers, signals_for
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.tables import GroupRow, RunRow

TARGET = 1.7
WARM_IDLE_S = 900.0  # longer than any group waits for its next run here


def raw_start_rate(image: str, n: int, threads: int) -> tuple[float, CpuAccount]:
    """Containers per second: create + start + wait + remove of ``true``, from ``threads`` threads."""
    client = docker.from_env()

    def loop(count: int) -> None:
        for _ in range(count):
            c = client.containers.create(image, entrypoint=["true"], network_mode="none")
            c.start()
            c.wait()
            c.remove()

    loop(1)  # not timed: the image's first use
    cpu = CpuAccount(daemon_processes()).start()
    workers = [threading.Thread(target=loop, args=(n,)) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    cpu.stop()
    return n * threads / cpu.wall, cpu


def _send(db: Database, settings: Settings, jid: str, text: str) -> int:
    return ingest(
        db, settings, IncomingMessage(chat_jid=jid, sender="bench", content=text), signal=signals_for(settings).group
    ).message.seq


def _cursors(db: Database) -> dict[str, int]:
    with db.read() as session:
        return {jid: cur for jid, cur in session.execute(select(GroupRow.chat_jid, GroupRow.cursor_seq))}


def _wait_answered(db: Database, last: dict[str, int], timeout: float, workers: Workers) -> None:
    deadline = time.monotonic() + timeout
    while True:
        cursors = _cursors(db)
        if all(cursors[j] >= s for j, s in last.items()):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"not answered within {timeout:.0f} s; worker logs:\n{workers.logs()}")
        time.sleep(0.02)


def measure(
    base: Path, image: str, groups: int, per_group: int, n_workers: int, warm_idle_s: float, db_extra: dict[str, str]
) -> dict[str, float]:
    settings, db = install(base, image, warm_idle_s, **db_extra)
    jids = [f"g{i}@bench" for i in range(groups)]
    for i, jid in enumerate(jids):
        add_group(db, chat_jid=jid, name=jid, folder=f"g{i}", requires_trigger=False)
    warmups = [f"warmup{i}@bench" for i in range(n_workers)]
    for i, jid in enumerate(warmups):
        add_group(db, chat_jid=jid, name=jid, folder=f"warmup{i}", requires_trigger=False)
    try:
        with Workers(settings, n_workers) as workers:
            time.sleep(3)  # the workers' start-up, not part of any run
            # One run per worker first: connections, imports, the image's page cache.
            _wait_answered(db, {j: _send(db, settings, j, "warm-up") for j in warmups}, 180, workers)
            cpu = CpuAccount({"celery workers (parent + pool child)": workers.trees(), **daemon_processes()}).start()
            last = {jid: _send(db, settings, jid, f"hello 0 from {jid}") for jid in jids}
            sent = dict.fromkeys(jids, 1)
            deadline = time.monotonic() + 60 + groups * per_group * 5
            while True:
                cursors = _cursors(db)
                waiting = 0
                for jid in jids:
                    if cursors[jid] < last[jid]:
                        waiting += 1
                    elif sent[jid] < per_group:
                        last[jid] = _send(db, settings, jid, f"hello {sent[jid]} from {jid}")
                        sent[jid] += 1
                        waiting += 1
                if not waiting:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"runs did not finish in time; worker logs:\n{workers.logs()}")
                time.sleep(0.1)  # the queue holds every group: the workers never wait on us
            cpu.stop()
        with db.read() as session:
            runs, containers, failed = session.execute(
                select(
                    func.count().filter(RunRow.state == "succeeded"),
                    func.count(func.distinct(RunRow.container_id)),
                    func.count().filter(RunRow.state != "succeeded"),
                ).where(RunRow.chat_jid.in_(jids))
            ).one()
    finally:
        remove_install_containers(settings)
        db.dispose()
    return {"runs": runs, "containers": containers, "failed": failed, "elapsed": cpu.wall, "cpu": cpu}  # type: ignore[dict-item]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--messages", type=int, default=5, help="triggering messages per group, one after another")
    ap.add_argument("--raw", type=int, default=20, help="containers per thread for the docker-py baseline")
    ap.add_argument("--modes", default="cold,warm")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--pg", default="", help="PostgreSQL URL of a database the benchmark may fill (default SQLite)")
    ap.add_argument("--redis", default="", help="Redis URL for the broker (default filesystem://)")
    args = ap.parse_args()
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    image = settings.sandbox.agent_image
    db_extra = {k: v for k, v in (("database_url", args.pg), ("broker_url", args.redis)) if v}
    if args.pg:
        print("note: --pg is used as is; give it an empty database")

    print(f"raw docker-py, create + start + wait + remove of `true` in {image} ({args.raw} per thread):")
    raw: dict[int, float] = {}
    for threads in (1, 2):
        raw[threads], cpu = raw_start_rate(image, args.raw, threads)
        print(f"  {threads} thread(s): {raw[threads]:5.2f} containers/s")
        print("\n".join(cpu.lines(args.raw * threads, "start")))
    print(f"  2 threads / 1 thread: {raw[2] / raw[1]:.2f}x")

    results: dict[tuple[str, int], dict[str, float]] = {}
    for mode in args.modes.split(","):
        idle = 0.0 if mode == "cold" else WARM_IDLE_S
        for n in (int(w) for w in args.workers.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                r = measure(Path(tmp), image, args.groups, args.messages, n, idle, db_extra)
            results[(mode, n)] = r
            print(
                f"{mode:4} {n} worker(s): {r['runs']:4.0f} runs in {r['elapsed']:6.1f} s ="
                f" {r['runs'] / r['elapsed']:5.2f} runs/s, {r['containers'] / r['elapsed']:5.2f} container starts/s"
                f" ({r['containers']:.0f} containers, {r['failed']:.0f} failed runs)"
            )
            print("\n".join(r["cpu"].lines(int(r["runs"]), "run")))  # type: ignore[attr-defined]
        ones, twos = results.get((mode, 1)), results.get((mode, 2))
        if ones and twos:
            ratio = (twos["runs"] / twos["elapsed"]) / (ones["runs"] / ones["elapsed"])
            print(
                f"{mode}: 2 workers / 1 worker = {ratio:.2f}x runs/s (target {TARGET}x:"
                f" {'met' if ratio >= TARGET else 'MISSED'}); raw docker 2 threads / 1 = {raw[2] / raw[1]:.2f}x"
                + (
                    f"; container starts: 1 worker at {ones['containers'] / ones['elapsed'] / raw[1]:.0%} and"
                    f" 2 workers at {twos['containers'] / twos['elapsed'] / raw[2]:.0%} of the raw rate with"
                    " as many threads"
                    if mode == "cold"
                    else ""
                )
            )


if __name__ == "__main__":
    main()
