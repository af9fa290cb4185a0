"""History scale: the time to assemble a run's input (plan_batch +
prior_messages + build_input, as the pipeline does, then the JSON bytes) for
the last ``--new`` new messages of a group with 1k, 10k and 100k messages,
in a table of ``--total`` messages (default 1M) across ``--groups`` chats.

The 1k group is measured twice: alone in the table, then in the full table
(the table's size must not matter); a "quiet" group as big as the biggest,
busy long ago and with its last 100 messages spread over the newest 90% of
the table, is the layout that misleads a planner assuming even spread; the
100k group is also measured with 10x the new messages (the cost should
follow the new messages).  The statements the assembly ran are then
EXPLAINed: both message queries should use ``idx_messages_chat_seq`` (or,
on PostgreSQL, the table's seq index over a range the planner knows is
small: the rows stored since the cursor).

    .venv/bin/python -m bench.history [--total 1000000] [--pg SERVER_URL]

Bulk load: one executemany transaction (SQLite), COPY (PostgreSQL, into a
fresh database created on ``--pg``'s server and dropped afterwards).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, update

from bench.common import fresh_pg_database
from orchestrator.core.settings import Settings
from orchestrator.run.assembly import build_input, input_bytes, plan_batch, prior_messages
from orchestrator.run.model_choice import model_settings
from orchestrator.store import db as store_db
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after, get_recent_messages
from orchestrator.store.tables import GroupRow

TARGET_MS = 20.0
COLUMNS = (
    "id",
    "chat_jid",
    "seq",
    "sender",
    "sender_name",
    "content",
    "timestamp",
    "is_from_me",
    "message_type",
    "metadata",
)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def rows(jids: list[str], first_seq: int) -> Iterator[tuple[object, ...]]:
    """Messages for ``jids`` (one per entry, in that order): a person asks, the bot answers."""
    for i, jid in enumerate(jids):
        seq = first_seq + i
        mine = seq % 2 == 0
        yield (
            f"m{seq}",
            jid,
            seq,
            "bot" if mine else "u1",
            "Andy" if mine else "Ann",
            (
                f"reply {seq}: sure, here is what I found about that."
                if mine
                else f"message {seq}: could you look at the build log and tell me what broke?"
            ),
            (T0 + timedelta(milliseconds=seq)).isoformat(),
            mine,
            "assistant" if mine else "user",
            "null",
        )


def bulk_load(db: Database, jids: list[str], first_seq: int) -> float:
    t0 = time.perf_counter()
    placeholders = ", ".join("?" for _ in COLUMNS)
    raw = db.engine.raw_connection()
    try:
        if db.is_sqlite:
            cur = raw.cursor()
            cur.execute("BEGIN IMMEDIATE")
            cur.executemany(
                f"INSERT INTO messages ({', '.join(COLUMNS)}) VALUES ({placeholders})", rows(jids, first_seq)
            )
            raw.commit()
        else:
            with raw.cursor() as cur, cur.copy(f"COPY messages ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for row in rows(jids, first_seq):
                    copy.write_row(row)
            raw.commit()
            with db.engine.begin() as conn:
                conn.exec_driver_sql("ANALYZE messages")  # fresh statistics, as autovacuum would give
    finally:
        raw.close()
    return time.perf_counter() - t0


class Captured:
    """The SELECTs on ``messages`` that the assembly runs (to EXPLAIN them).

    The assembly's reads are fixed statements on the driver (``store/db.py``'s
    ``driver_execute``, through ``Database.read_fixed``), below SQLAlchemy's events:
    they are recorded by wrapping that function where ``read_fixed`` finds it."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.statements: list[tuple[str, Mapping[str, object]]] = []
        self.on = False
        inner = store_db.driver_execute

        def recording(conn: Connection, sql: str, params: Mapping[str, object] | None = None) -> Any:
            if self.on and sql.lstrip().upper().startswith("SELECT") and "FROM messages" in sql:
                self.statements.append((sql, dict(params or {})))
            return inner(conn, sql, params)

        store_db.driver_execute = recording  # type: ignore[assignment]

    def plans(self) -> list[tuple[str, list[str]]]:
        out = []
        for statement, params in self.statements:
            with self.db.engine.connect() as conn:
                if self.db.is_sqlite:
                    lines = [
                        str(r[-1])
                        for r in store_db.driver_execute(conn, "EXPLAIN QUERY PLAN " + statement, params).fetchall()
                    ]
                else:
                    lines = [
                        str(r[0]) for r in store_db.driver_execute(conn, "EXPLAIN " + statement, params).fetchall()
                    ]
            out.append((" ".join(statement.split()), lines))
        return out


def assemble(db: Database, settings: Settings, jid: str) -> int:
    """What the pipeline does to build a run's input; returns the input's size."""
    group = get_group(db, jid)
    batch = plan_batch(get_messages_after(jid, group.cursor_seq, db=db))
    assert batch is not None and not isinstance(batch, int)
    prior = prior_messages(db, settings, group, batch, group.cursor_seq)
    payload = build_input(
        settings=settings,
        group=group,
        run_id="bench",
        prior=prior,
        batch=batch,
        assistant_name="Andy",
        notices=[],
        model=model_settings(settings),
    )
    return len(input_bytes(payload))


def set_new(db: Database, jid: str, new: int) -> None:
    """Make the last ``new`` messages of ``jid`` the ones a run has not seen yet."""
    seqs = [m.seq for m in get_recent_messages(jid, new + 1, db=db)]
    with db.write() as session:
        session.execute(
            update(GroupRow).where(GroupRow.chat_jid == jid).values(cursor_seq=seqs[0], pending_seq=seqs[-1])
        )


def time_group(db: Database, settings: Settings, jid: str, new: int, reps: int) -> tuple[float, float, int]:
    """Median and max ms to assemble the input for ``jid``'s last ``new`` messages."""
    set_new(db, jid, new)
    size = assemble(db, settings, jid)  # not timed: first use of the statements
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        assemble(db, settings, jid)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), max(times), size


def run(name: str, settings: Settings, total: int, n_groups: int, sizes: list[int], new: int, reps: int) -> None:
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    targets = {size: f"h{size}@bench" for size in sizes}
    for size, jid in targets.items():
        add_group(db, chat_jid=jid, name=jid, folder=f"h{size}")
    small = min(sizes)
    captured = Captured(db)
    print(
        f"{name}: assembling the input for the last {new} new messages (+ {settings.context.messages}"
        f" messages of context), median / max of {reps}, target < {TARGET_MS:.0f} ms"
    )
    bulk_load(db, [targets[small]] * small, 1)
    med, worst, size = time_group(db, settings, targets[small], new, reps)
    print(
        f"  {small:>7,}-message group, table of {small:>9,} messages: {med:6.2f} ms (max {worst:6.2f}),"
        f" input {size:,} bytes"
    )

    # The rest, interleaved at random, plus a "quiet" chat: as big as the
    # biggest, all of it long ago, then its last 100 messages spread thinly
    # over the newest 90% of the table (the layout that misleads a planner
    # assuming each chat's messages are spread evenly).
    quiet = "quiet@bench"
    add_group(db, chat_jid=quiet, name=quiet, folder="quiet")
    big = max(sizes)
    mixed = [targets[s] for s in sizes if s != small for _ in range(s)]
    mixed += [f"c{i % (n_groups - len(sizes) - 1)}@bench" for i in range(total - sum(sizes) - big - 100)]
    random.Random(7).shuffle(mixed)
    step = len(mixed) // 100
    for i in range(100):
        mixed.insert(i * (step + 1) + step // 2, quiet)
    jids = [quiet] * big + mixed
    took = bulk_load(db, jids, small + 1)
    print(
        f"  bulk load of {len(jids):,} more messages ({n_groups} chats): {took:.1f} s ({len(jids) / took:,.0f} rows/s)"
    )
    for s in sizes:
        med, worst, size = time_group(db, settings, targets[s], new, reps)
        print(
            f"  {s:>7,}-message group, table of {total:>9,} messages: {med:6.2f} ms (max {worst:6.2f}),"
            f" input {size:,} bytes  [{'met' if med < TARGET_MS else 'MISSED'}]"
        )
    med, worst, size = time_group(db, settings, quiet, new, reps)
    print(
        f"  {big + 100:>7,}-message group, busy long ago, quiet now: {med:6.2f} ms (max {worst:6.2f}),"
        f" input {size:,} bytes  [{'met' if med < TARGET_MS else 'MISSED'}]"
    )
    med, worst, size = time_group(db, settings, targets[big], new * 10, reps)
    print(
        f"  {big:>7,}-message group, {new * 10} new messages:       {med:6.2f} ms (max {worst:6.2f}),"
        f" input {size:,} bytes (grows with the new messages)"
    )
    print("  query plans of the assembly's message queries:")
    for jid in (targets[big], quiet):
        set_new(db, jid, new)
        captured.statements.clear()
        captured.on = True
        assemble(db, settings, jid)
        captured.on = False
        for statement, lines in captured.plans():
            kind = "after cursor" if "seq >" in statement else "before cursor"
            scan = next((line.strip().lstrip("-> ") for line in lines if "Scan" in line or "SEARCH" in line), lines[0])
            print(f"    {jid:14} {kind:13} {scan[:110]}")
    db.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total", type=int, default=1_000_000)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--new", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--pg", default="", help="a PostgreSQL server URL whose role may create databases")
    args = ap.parse_args()
    sizes = sorted(int(s) for s in args.sizes.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = Settings.load(data_dir=Path(tmp) / "sqlite", env_file=None)
        run("sqlite", sqlite, args.total, args.groups, sizes, args.new, args.reps)
        if args.pg:
            with fresh_pg_database(args.pg) as url:
                pg = Settings.load(data_dir=Path(tmp) / "pg", database_url=url, env_file=None)
                run("postgresql", pg, args.total, args.groups, sizes, args.new, args.reps)


if __name__ == "__main__":
    main()
