"""The database's reach: how many runs per second one PostgreSQL carries when the
workers are elsewhere, measured with the run path's own statements (issue 17).

``bench/control_plane.py`` runs the real workers on the same cores as the
database, so on a small machine the workers' CPU (Celery and the pipeline's
Python) is what saturates, not the database.  Here the database gets the same
statements from a client that costs next to nothing (``pgbench``, written in C):

1. One message and its run go through the product in this process (ingest, then
   ``Pipeline.step`` with a sandbox that answers at once, as
   ``bench/instant_app.py``'s), and every statement it sends is recorded at
   psycopg's level with its transaction.  The recording must have the shape
   this file knows (:data:`SHAPE`): a run path that changes fails here until
   this file follows it.
2. The recording becomes a ``pgbench`` script, statement for statement: the
   same SQL text, the same transactions (reads in autocommit, as the product
   sends them), each run's values fresh (its group, its run id, its messages'
   ids) or read from the statements before it as the product reads them (the
   group's cursor and pending mark from the lease's ``RETURNING``, the new
   message's seq from its ``INSERT``), the rest as the recording had them.
   One script transaction is one message and its run.  Each client keeps to a
   group set of its own, so every lease is free when taken (as with a
   worker fleet whose groups are spread over hosts).
3. ``pgbench`` runs it for ``--seconds`` with ``--clients`` connections on a
   fresh database; printed: runs/s, latency, the database's CPU per run and
   pgbench's own.

    .venv/bin/python -m bench.db_reach [--clients 8] [--seconds 20] [--groups 400] [--pg URL]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from bench.common import CpuAccount, fresh_pg_database, install
from bench.control_plane import PG, TARGET, pg_processes, tree_state
from bench.instant_app import InstantSandbox
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.store.groups import add_group

Statement = tuple[str, dict[str, Any], bool]  # SQL as sent (psycopg's %(name)s), its values, in autocommit

# The recorded run's shape: each statement's first words, "COMMIT" where a transaction ends.
SHAPE = [
    # ingest (the API's part)
    "SELECT pg_advisory_xact_lock",
    "INSERT INTO messages",
    "SELECT channel,",
    "SELECT is_main,",
    "UPDATE groups SET pending_seq",
    "COMMIT",
    # the step: the lease, with the group
    "UPDATE groups SET lease_owner = %(owner)s",
    "COMMIT",
    # reads: the unfinished runs, the batch (the history before it is the worker's kept
    # copy, orchestrator/run/history_cache.py: a group's worker has it from its last run)
    "SELECT id, chat_jid,",
    'SELECT "seq",',
    # reads for the input: the live tasks (the agent's list and the due notice), the
    # previous run's end (a notice)
    "SELECT id, chat_jid,",
    "SELECT state,",
    # the run row, its input with it
    "INSERT INTO runs",
    "COMMIT",
    # read: how long the batch waited
    "SELECT MIN(stored_at)",
    # the container's id
    "UPDATE runs SET container_id",
    "COMMIT",
    # the reply: the fence, the channels and the clock, then the message under the seq lock
    "SELECT lease_owner",
    "SELECT channel,",
    "SELECT now()",
    "SELECT pg_advisory_xact_lock",
    "INSERT INTO messages",
    "COMMIT",
    # the record's duration (a read), then the run's end: the run row, the record under the
    # seq lock, the cursor and the lease (the fence)
    "SELECT now()",
    "UPDATE runs SET state",
    "SELECT pg_advisory_xact_lock",
    "INSERT INTO messages",
    "UPDATE groups SET cursor_seq",
    "COMMIT",
]


def record(url: str, data_dir: Path) -> list[Statement | None]:
    """One message and its run through the product, every statement as sent (None: a COMMIT)."""
    settings, db = install(data_dir, "orchestrator-agent:unused", database_url=url)
    jid = "reach-recorded@bench"
    add_group(db, chat_jid=jid, name=jid, folder="reach-recorded", requires_trigger=False)
    pipeline = Pipeline(settings, db, ChannelRegistry(), InstantSandbox())
    for i in range(3):  # warm: the history has earlier runs, as a busy group's has
        ingest(db, settings, IncomingMessage(chat_jid=jid, sender="bench", content=f"warm {i}"), signal=None)
        pipeline.step(jid)
    log: list[Statement | None] = []
    execute, commit = psycopg.Cursor.execute, psycopg.Connection.commit

    def recording_execute(cur: psycopg.Cursor[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        sql = query.decode() if isinstance(query, bytes) else str(query)
        log.append((sql, dict(params or {}), cur.connection.autocommit))
        return execute(cur, query, params, **kw)

    def recording_commit(conn: psycopg.Connection[Any]) -> None:
        log.append(None)
        commit(conn)

    psycopg.Cursor.execute = recording_execute  # type: ignore[method-assign,assignment]
    psycopg.Connection.commit = recording_commit  # type: ignore[method-assign]
    try:
        ingest(db, settings, IncomingMessage(chat_jid=jid, sender="bench", content="the message"), signal=None)
        step = pipeline.step(jid)
    finally:
        psycopg.Cursor.execute, psycopg.Connection.commit = execute, commit  # type: ignore[method-assign]
        db.dispose()
    assert step.outcome is not None and step.outcome.run.state == "succeeded", step
    shape = [_shape(entry) for entry in log]
    if shape != SHAPE:
        wanted = SHAPE + [""] * max(0, len(shape) - len(SHAPE))
        got = shape + [""] * max(0, len(SHAPE) - len(shape))
        raise SystemExit(
            "the run path's statements changed; make bench/db_reach.py's SHAPE and script follow:\n"
            + "\n".join(f"  {g!r:45} {w!r}" for g, w in zip(got, wanted, strict=True))
        )
    return log


def _shape(entry: Statement | None) -> str:
    """The :data:`SHAPE` entry a recorded statement matches (its own first words if none does)."""
    if entry is None:
        return "COMMIT"
    text = " ".join(entry[0].split())
    return next((p for p in SHAPE if text.startswith(p)), text[:40])


_PARAM = re.compile(r"%\((\w+)\)s")


def literal(value: Any) -> str:
    """A recorded value written into the statement (what pgbench cannot vary per run)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"'\\x{bytes(value).hex()}'::bytea"
    return "'" + str(value).replace("'", "''") + "'"


def script(log: list[Statement | None]) -> tuple[str, dict[str, str]]:
    """The recording as a pgbench script (one script transaction: one message and its run),
    and the values it takes from pgbench's ``-D``: a text with a colon in it (a run's owner,
    ``host:pid:nonce``), which pgbench would read as variables even inside quotes."""
    defines: dict[str, str] = {}
    lines = [
        # This run's own values: its group (of the client's own set), its run id, its messages' ids.
        "\\set gid :client_id * :per_client + random(0, :per_client - 1)",
        "SELECT 'reach' || :gid || '@bench' AS chat_jid, r AS run_id,"
        " 'msg-' || replace(gen_random_uuid()::text, '-', '') AS msg_id, r || '-0001' AS reply_id,"
        " r || '-meta' AS meta_id FROM (SELECT gen_random_uuid()::text AS r) AS fresh \\gset",
    ]
    inserts = iter(["msg_id", "reply_id", "meta_id"])
    in_tx = False
    for entry in log:
        if entry is None:
            lines.append("COMMIT;")
            in_tx = False
            continue
        sql, params, autocommit = entry
        if not autocommit and not in_tx:
            lines.append("BEGIN;")
            in_tx = True
        text = " ".join(sql.split())
        names: dict[str, str] = {"chat_jid": "chat_jid", "run_id": "run_id"}
        suffix = ""
        if text.startswith("INSERT INTO messages"):
            names["id"] = next(inserts)
            suffix = " \\gset new_" if names["id"] == "msg_id" else ""
        elif text.startswith("INSERT INTO runs"):
            names.update(id="run_id", cursor_from="g_cursor_seq", cursor_to="g_pending_seq")
        elif text.startswith("UPDATE groups SET pending_seq"):
            names["seq"] = "new_seq"
        elif text.startswith("UPDATE groups SET lease_owner = %(owner)s"):
            suffix = " \\gset g_"  # the group as the lease's statement reads it
        elif text.startswith('SELECT "seq",'):
            names["seq"] = "g_cursor_seq"  # the batch: above the group's cursor
        elif text.startswith("SELECT MIN(stored_at)"):
            names.update(after_seq="g_cursor_seq", upto_seq="g_pending_seq")
        elif text.startswith("UPDATE groups SET cursor_seq"):
            names["cursor_to"] = "g_pending_seq"

        def bind(match: re.Match[str], names: dict[str, str] = names, params: dict[str, Any] = params) -> str:
            name = match.group(1)
            if name in names:
                return f":{names[name]}"
            value = params[name]
            if isinstance(value, str) and ":" in value:
                defines[f"text{len(defines)}"] = value
                return f":text{len(defines) - 1}"
            return literal(value)

        lines.append(_PARAM.sub(bind, text.replace("%%", "%")) + suffix + ("" if suffix else ";"))
    return "\n".join(lines) + "\n", defines


def seed_groups(url: str, data_dir: Path, clients: int, per_client: int) -> None:
    settings, db = install(data_dir, "orchestrator-agent:unused", database_url=url)
    for i in range(clients * per_client):
        add_group(db, chat_jid=f"reach{i}@bench", name=f"reach{i}", folder=f"reach{i}", requires_trigger=False)
    db.dispose()


@contextlib.contextmanager
def watched(url: str) -> Iterator[CpuAccount]:
    """CPU of the database's backends (pgbench's connections: each one's last reading, taken
    every 0.2 s while it lives), PostgreSQL's own processes, pgbench (a child of this
    process: "bench driver") and the rest of the machine."""
    server = pg_processes(url)[1]
    # Their own CPU only: the postmaster's "children" times would count the backends it reaped again.
    server0 = _own_cpu(server)
    children0 = sum(os.times()[2:4])
    cpu = CpuAccount({}).start()
    last: dict[int, float] = {}
    done = threading.Event()

    def loop() -> None:
        while not done.wait(0.2):
            for p in pg_processes(url)[0]:
                last[p.pid] = _own_cpu([p])

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield cpu
    finally:
        done.set()
        thread.join()
        cpu.stop()
        backends = sum(last.values())
        pgbench = sum(os.times()[2:4]) - children0
        named = {
            "postgres backends of this database": backends,
            "postgres server processes (shared)": _own_cpu(server) - server0,
            "pgbench (the clients)": pgbench,
            "this script (sampling the processes)": cpu.used["bench driver"] - pgbench,
        }
        cpu.used = {**named, "other (shims, runc, kernel, other users)": max(0.0, cpu.busy - sum(named.values()))}


def _own_cpu(procs: list[Any]) -> float:
    total = 0.0
    for p in procs:
        with contextlib.suppress(Exception):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8, help="pgbench connections (workers elsewhere)")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--per-client", type=int, default=50, help="groups of each client's own")
    ap.add_argument("--pg", default=PG, help="a PostgreSQL server (a role that may create databases)")
    args = ap.parse_args()
    pgbench = shutil.which("pgbench") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pgbench"))), None)
    if pgbench is None:
        raise SystemExit("no pgbench (it comes with PostgreSQL's server package)")
    print(
        f"tree: {tree_state()}; {os.cpu_count()} CPUs; {args.clients} pgbench clients, "
        f"{args.clients * args.per_client} groups, {args.seconds:.0f} s"
    )
    with tempfile.TemporaryDirectory() as tmp, fresh_pg_database(args.pg) as url:
        log = record(url, Path(tmp) / "recorded")
        seed_groups(url, Path(tmp) / "seeded", args.clients, args.per_client)
        path = Path(tmp) / "run.sql"
        text, defines = script(log)
        path.write_text(text)
        statements = sum(1 for e in log if e is not None)
        commits = sum(1 for e in log if e is None)
        with watched(url) as cpu:
            started = time.monotonic()
            out = subprocess.run(
                [
                    str(pgbench),
                    "-n",
                    "-M",
                    "prepared",
                    "-c",
                    str(args.clients),
                    "-j",
                    "2",
                    "-T",
                    str(int(args.seconds)),
                    "-D",
                    f"per_client={args.per_client}",
                    *(f"-D{k}={v}" for k, v in defines.items()),
                    "-f",
                    str(path),
                    url,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            wall = time.monotonic() - started
        if out.returncode != 0 or "tps =" not in out.stdout:
            raise SystemExit(f"pgbench failed (script: {path}):\n{out.stdout}\n{out.stderr[-3000:]}")
        processed = int(re.search(r"actually processed: (\d+)", out.stdout).group(1))  # type: ignore[union-attr]
        failed = re.search(r"number of failed transactions: (\d+)", out.stdout)
        rate = float(re.search(r"tps = ([\d.]+)", out.stdout).group(1))  # type: ignore[union-attr]
        latency = re.search(r"latency average = ([\d.]+) ms", out.stdout)
    print(
        f"the run path as recorded: {statements} statements and {commits} COMMITs a message and its run"
        f" (+1 for pgbench's fresh values), {wall:.1f} s of pgbench"
    )
    print(
        f"\n{rate:.1f} runs/s (target {TARGET:.0f}: {'met' if rate >= TARGET else 'MISSED'}), {processed} runs,"
        f" {failed.group(1) if failed else '?'} failed; latency {latency.group(1) if latency else '?'} ms a run"
        f" at {args.clients} clients"
    )
    print("\n".join(cpu.lines(processed, "run")))


if __name__ == "__main__":
    main()
