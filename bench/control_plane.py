"""The control plane past one machine, by simulation: runs/s that one PostgreSQL
and one Redis sustain for N hosts, the statements and database time per run, and
where it saturates.

N ``celery worker`` processes (``--concurrency`` pool children each), each with
a host id of its own (``ORCHESTRATOR_HOST_ID``: N hosts of one fleet), run the
product's app with a sandbox that answers at once (``bench/instant_app.py``: no
Docker, no model), on a fresh PostgreSQL database and a Redis database (flushed).
``--groups`` groups are kept busy by the driver: a group whose last message was
answered gets its next one at once (in-process ingest, the signal through the
root's placement), so runs are queued continuously.  After ``--warmup`` seconds,
``--seconds`` of sustained load are measured; then the driver stops sending and
waits for every run to end.

Per N it prints:

* runs/s in the window, and the load average (the machine may be shared);
* the baseline from the same workers: empty Celery tasks/s (``bench.noop``, a
  backlog of ``--noop`` tasks on the shared queue), i.e. the broker and Celery alone;
* statements per run by kind and table, counted in every worker process at the
  driver (psycopg) with the time waited for each (``bench/query_counts.py``),
  and the driver's ingest statements per message beside them;
* database time per run from PostgreSQL itself (``pg_stat_database.active_time``,
  the fresh database's backends), and commits per run;
* CPU by process: the workers, the database's backends, PostgreSQL's own
  processes, redis-server, the driver, and the rest of the machine.

    .venv/bin/python -m bench.control_plane [--workers 1,2,4,8] [--concurrency 2] [--groups 200]
        [--seconds 20] [--pg URL] [--redis URL]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil
import psycopg
from sqlalchemy import func, select, text

from bench import query_counts
from bench.common import (
    ROOT,
    CpuAccount,
    Workers,
    cpu_seconds,
    flush_broker,
    fresh_pg_database,
    install,
)
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.queue import AGENT_QUEUE
from orchestrator.store.groups import add_group
from orchestrator.store.tables import HostRow, RunRow

# The CPU accounts: the workers, and the services one fleet shares.
WORKERS = "celery workers (parents + pool children)"
SHARED = ("postgres backends of this database", "postgres server processes (shared)", "redis-server (shared)")
TARGET = 300.0  # runs/s: 100 hosts at 3 cold runs/s each (issue 17)
PG = "postgresql://orchestrator:orchestrator@127.0.0.1:5432/orchestrator"
REDIS = "redis://127.0.0.1:6379/13"
POLL_S = 0.2


def tree_state() -> str:
    """The commit measured, and whether the work tree differs from it (a figure's "before" or "after")."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    diff = (
        subprocess.run(
            ["git", "diff", "--stat", "--", "orchestrator", "workers"], cwd=ROOT, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()
    )
    return f"{head.strip() or '?'}" + (f" + uncommitted changes ({diff[-1].strip()})" if diff else "")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Fleet(Workers):
    """N worker processes of the instant app as N hosts, on the bench's installation."""

    def __init__(self, settings: Settings, n: int, concurrency: int) -> None:
        super().__init__(settings, n, app="bench.instant_app", concurrency=concurrency, host_ids=True)

    def check(self) -> None:
        dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
        if dead:
            raise SystemExit(f"worker(s) {dead} exited; logs:\n{self.logs()}")


def wait(cond: object, timeout: float, what: str, fleet: Fleet) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        fleet.check()
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:.0f} s; logs:\n{fleet.logs()}")
        time.sleep(0.05)


class Load:
    """Keeps every group busy: a group with nothing pending gets its next message at once."""

    def __init__(self, root: Orchestrator, jids: list[str]) -> None:
        self.root, self.jids = root, jids
        self.sent = 0
        self.ingest_counts: query_counts.Counts = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load", daemon=True)
        self.error: BaseException | None = None

    def _idle(self) -> list[str]:
        with self.root.db.read() as session:
            return list(
                session.execute(
                    text("SELECT chat_jid FROM groups WHERE cursor_seq >= pending_seq AND chat_jid LIKE 'cp%'")
                ).scalars()
            )

    def _loop(self) -> None:
        query_counts.only_thread = threading.get_ident()
        try:
            while not self._stop.is_set():
                idle = self._idle()
                for jid in idle:
                    with self.lock:  # the count of messages and of their statements move together
                        query_counts.enabled = True  # the driver counts its ingest alone
                        try:
                            ingest(
                                self.root.db,
                                self.root.settings,
                                IncomingMessage(chat_jid=jid, sender="bench", content=f"m{self.sent}"),
                                signal=self.root.signals.group,
                            )
                            self.sent += 1
                        finally:
                            query_counts.enabled = False
                # A fifth of a second between looks: a backlog of --groups runs outlasts it at
                # hundreds of runs/s, and the driver's reads stay a small part of the database's work.
                self._stop.wait(POLL_S)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise SystemExit(f"the load stopped: {self.error!r}")

    def all_idle(self) -> bool:
        return len(self._idle()) == len(self.jids)


def runs_done(root: Orchestrator) -> int:
    with root.db.read() as session:
        return int(
            session.execute(select(func.count()).select_from(RunRow).where(RunRow.state == "succeeded")).scalar_one()
        )


def not_succeeded(root: Orchestrator) -> int:
    with root.db.read() as session:
        return int(
            session.execute(select(func.count()).select_from(RunRow).where(RunRow.state != "succeeded")).scalar_one()
        )


def pg_stats(url: str) -> dict[str, float]:
    """The fresh database's own counters (every backend of it, the driver's included)."""
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_stat_force_next_flush()").fetchone()  # this session's own, none else's
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, active_time, tup_returned, tup_fetched, tup_inserted,"
            " tup_updated, tup_deleted FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    keys = ("commits", "rollbacks", "active_ms", "returned", "fetched", "inserted", "updated", "deleted")
    return {k: float(v or 0) for k, v in zip(keys, row, strict=True)}


def pg_processes(url: str) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The fresh database's backends, and PostgreSQL's other processes (shared with other users)."""
    from sqlalchemy.engine import make_url

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        pids = {
            r[0]
            for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        }
    backends, server = [], []
    for p in psutil.process_iter(["name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.pid in pids:
                backends.append(p)
            elif p.info["name"] == "postgres" and not any(
                "postgres: " in c and "orchestrator" in c for c in p.info["cmdline"] or []
            ):
                server.append(p)
    return backends, server


def redis_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "redis-server"]


def noop_rate(settings: Settings, root: Orchestrator, k: int, fleet: Fleet) -> tuple[float, float]:
    """Empty tasks/s through the same workers, and the workers' CPU per empty task (ms:
    Celery's own handling of a task, its receipt, ack and events; the floor under a
    run's): ``k`` queued on the shared queue behind a closed gate (the first task each
    pool child takes waits for it: the backlog builds up faster than one publisher could
    feed it), then the gate opened; timed from 10 % to 90 % of them done (the counts are
    written every FLUSH_S)."""
    folder = settings.data_dir / query_counts.FOLDER
    gate = settings.data_dir / query_counts.NOOP_GATE
    app = root.signals.app

    def done() -> int:
        return int(query_counts.read_folder(folder).get(query_counts.NOOP_TASK, [0, 0.0])[0])

    for attempt in range(3):
        gate.unlink(missing_ok=True)
        base = done()
        cpu0 = cpu_seconds(fleet.trees())
        with app.producer_or_acquire() as producer:
            for _ in range(k):
                app.send_task(query_counts.NOOP_TASK, queue=AGENT_QUEUE, producer=producer)
        time.sleep(1)
        gate.touch()
        marks: dict[int, float] = {}
        last, moved = base, time.monotonic()
        while (n := done() - base) < k:
            fleet.check()
            for pct in (10, 90):
                if pct not in marks and n >= k * pct / 100:
                    marks[pct] = time.monotonic()
            if n != last:
                last, moved = n, time.monotonic()
            elif time.monotonic() - moved > 20:
                break
            time.sleep(query_counts.FLUSH_S / 4)
        else:
            marks.setdefault(90, time.monotonic())
            marks.setdefault(10, marks[90])
            return 0.8 * k / max(marks[90] - marks[10], 1e-3), (cpu_seconds(fleet.trees()) - cpu0) / k * 1000
        # Another process emptied the Redis database (a benchmark sharing it flushes it).
        print(f"    note: the empty tasks stopped at {n} of {k} (attempt {attempt + 1}); queued again")
    raise SystemExit(f"noop tasks: not done in 3 attempts; logs:\n{fleet.logs()}")


def measure(n: int, args: argparse.Namespace, url: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        settings, db = install(Path(tmp), "orchestrator-agent:unused", database_url=url, broker_url=args.redis)
        db.dispose()
        flush_broker(settings)
        root = Orchestrator(settings, migrate=False)
        jids = [f"cp{i}@bench" for i in range(args.groups)]
        for i, jid in enumerate(jids):
            add_group(root.db, chat_jid=jid, name=jid, folder=f"cp{i}", requires_trigger=False)
        folder = settings.data_dir / query_counts.FOLDER
        try:
            with Fleet(settings, n, args.concurrency) as fleet:

                def hosts_up() -> bool:
                    with root.db.read() as session:
                        return (
                            int(
                                session.execute(
                                    select(func.count()).select_from(HostRow).where(HostRow.state == "up")
                                ).scalar_one()
                            )
                            >= n
                        )

                wait(hosts_up, 120, f"{n} hosts up", fleet)
                noop, noop_cpu = noop_rate(settings, root, args.noop, fleet)
                loader = Load(root, jids).start()
                time.sleep(args.warmup)
                backends0, server = pg_processes(url)
                cpu = CpuAccount(
                    {
                        WORKERS: fleet.trees(),
                        "postgres server processes (shared)": server,
                        "redis-server (shared)": redis_processes(),
                    }
                ).start()
                backend_cpu0 = {p.pid: cpu_seconds([p]) for p in backends0}
                # Runs first: every message sent after sent0 is answered by a run counted after runs0.
                runs0, t0 = runs_done(root), time.monotonic()
                with loader.lock:
                    ingest0, sent0 = query_counts.snapshot(), loader.sent
                counts0, stats0 = query_counts.read_folder(folder), pg_stats(url)
                load_before = load()
                time.sleep(args.seconds)
                runs1, t1 = runs_done(root), time.monotonic()
                backends1, _ = pg_processes(url)
                cpu.stop()
                # Backends come and go with the pools: each one's CPU since the start, or since it began.
                backend_cpu = sum(
                    cpu_seconds([p]) - backend_cpu0.get(p.pid, 0.0)
                    for p in {p.pid: p for p in backends0 + backends1}.values()
                )
                cpu.used = {"postgres backends of this database": backend_cpu, **cpu.used}
                cpu.used["other (shims, runc, kernel, other users)"] = max(
                    0.0, cpu.used["other (shims, runc, kernel, other users)"] - backend_cpu
                )
                load_after = load()
                loader.stop()
                wait(loader.all_idle, 120, "every run ended", fleet)
                time.sleep(3 * query_counts.FLUSH_S)
                counts1, ingest1, runs2 = query_counts.read_folder(folder), query_counts.snapshot(), runs_done(root)
                sent = loader.sent - sent0
            # The workers are stopped: their backends have reported everything.
            stats1 = pg_stats(url)
            failed = not_succeeded(root)
        finally:
            root.close()
    runs = runs2 - runs0
    return {
        "n": n,
        "rate": (runs1 - runs0) / (t1 - t0),
        "window_runs": runs1 - runs0,
        "runs": runs,
        "sent": sent,
        "noop": noop,
        "noop_cpu": noop_cpu,
        "counts": query_counts.minus(counts1, counts0),
        "ingest": query_counts.minus(ingest1, ingest0),
        "stats": {k: stats1[k] - stats0[k] for k in stats0},
        "cpu": cpu,
        "failed": failed,
        "load": f"{load_before} -> {load_after}",
    }


def table(counts: query_counts.Counts, per: int) -> list[str]:
    total = sum(v[0] for v in counts.values())
    secs = sum(v[1] for v in counts.values())
    out = [f"      {'kind':28} {'per run':>8} {'ms/run':>8}"]
    for key, (k, s) in sorted(counts.items(), key=lambda kv: -kv[1][0]):
        out.append(f"      {key:28} {k / per:8.2f} {s / per * 1000:8.2f}")
    out.append(f"      {'all statements and commits':28} {total / per:8.2f} {secs / per * 1000:8.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,4,8", help="worker processes (hosts) to measure, in turn")
    ap.add_argument("--concurrency", type=int, default=2, help="pool children per worker")
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=20, help="the measured window of sustained load")
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--noop", type=int, default=3000, help="empty tasks for the baseline")
    ap.add_argument("--pg", default=PG, help="a PostgreSQL server (a role that may create databases)")
    ap.add_argument("--redis", default=REDIS, help="the broker's Redis database (flushed)")
    args = ap.parse_args()
    query_counts.install()
    query_counts.enabled = False
    print(f"tree: {tree_state()}; load {load()}")
    print(
        f"{os.cpu_count()} CPUs, {args.groups} groups, {args.concurrency} pool children per worker,"
        f" {args.seconds:.0f} s windows; instant sandbox (bench/instant_app.py)"
    )
    results = []
    for n in (int(w) for w in args.workers.split(",")):
        with fresh_pg_database(args.pg) as url:
            r = measure(n, args, url)
        results.append(r)
        runs, window = int(r["runs"]), int(r["window_runs"])  # type: ignore[call-overload]
        stats: dict[str, float] = r["stats"]  # type: ignore[assignment]
        counts: query_counts.Counts = r["counts"]  # type: ignore[assignment]
        print(
            f"\n{n} worker(s) x {args.concurrency}: {r['rate']:6.1f} runs/s ({window} runs in the window,"
            f" target {TARGET:.0f}); baseline, empty tasks through the same workers: {r['noop']:6.1f} tasks/s;"
            f" load {r['load']}"
        )
        print(f"    {runs} runs measured, {r['sent']} messages sent, {r['failed']} runs not succeeded")
        print("    statements per run sent by the workers (driver-side wait per run):")
        print("\n".join(table(counts, runs)))
        print("    the driver's ingest, per message:")
        print("\n".join(table(r["ingest"], int(r["sent"]) or 1)))  # type: ignore[arg-type]
        print(
            f"    PostgreSQL (this database): {stats['active_ms'] / runs:.2f} ms of statements executing per run,"
            f" {stats['commits'] / runs:.1f} commits, {stats['rollbacks'] / runs:.2f} rollbacks,"
            f" rows: {stats['inserted'] / runs:.1f} inserted, {stats['updated'] / runs:.1f} updated,"
            f" {stats['deleted'] / runs:.1f} deleted, {stats['fetched'] / runs:.0f} fetched per run"
        )
        cpu: CpuAccount = r["cpu"]  # type: ignore[assignment]
        print("\n".join(cpu.lines(window, "run")))
        per_run = {name: secs / max(window, 1) * 1000 for name, secs in cpu.used.items()}
        shared = sum(per_run[name] for name in SHARED)
        cores = os.cpu_count() or 1
        print(
            f"    Celery alone (the empty tasks): {r['noop_cpu']:.1f} ms of the workers' CPU per task;"
            f" a run: {per_run[WORKERS]:.1f} ms"
        )
        print(
            f"    the shared services (PostgreSQL and Redis): {shared:.1f} ms of CPU per run; {cores} cores"
            f" of them alone would carry ~{cores * 1000 / max(shared, 1e-3):.0f} runs/s (the workers elsewhere)"
        )
    best = max(results, key=lambda r: r["rate"])  # type: ignore[arg-type,return-value]
    print(
        f"\nbest: {best['rate']:.1f} runs/s with {best['n']} worker(s) (target {TARGET:.0f}:"
        f" {'met' if best['rate'] >= TARGET else 'MISSED'})"
    )  # type: ignore[operator]


if __name__ == "__main__":
    main()
