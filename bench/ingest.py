"""Ingest throughput: messages per second through the real ingest path
(validate, store with the next seq, routing, pending mark, commit, Celery
signal), against plain SQLAlchemy inserts of the same rows with the same
commit-per-message pattern (the database's floor), measured in the same
process.

    .venv/bin/python -m bench.ingest [--messages N] [--rounds R] [--pg URL --redis URL] [--profile]

Three kinds of block, interleaved over R rounds so that a busy machine slows
them alike; each figure is the median over the rounds:

* ``plain insert``: the floor;
* ``ingest, one busy group``: every message to one registered group (a burst
  into a chat whose first message already signalled a worker);
* ``ingest, idle groups``: every message to a different idle group, so every
  one of them publishes a Celery signal (the worst case for the broker).

The ratio that has a target (>= 0.5) is the busy-group ingest over the floor.
PostgreSQL runs in a fresh database created (and dropped) on ``--pg``'s server.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, Text, create_engine

from bench.common import fresh_pg_database
from orchestrator.core.settings import Settings
from orchestrator.root import Orchestrator
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group

TARGET = 0.5


class PlainInserts:
    """Commit one row at a time into a table shaped like ``messages``."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self.meta = MetaData()
        self.table = Table(
            f"plain_{uuid.uuid4().hex[:8]}",
            self.meta,
            Column("id", Text, primary_key=True),
            Column("chat_jid", Text, primary_key=True),
            Column("seq", Integer),
            Column("sender", Text),
            Column("sender_name", Text),
            Column("content", Text),
            Column("timestamp", Text),
            Column("message_type", Text),
        )
        self.meta.create_all(self.engine)
        if url.startswith("sqlite"):
            with self.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
                conn.exec_driver_sql("PRAGMA synchronous=NORMAL")
        self.i = 0

    def one(self) -> None:
        self.i += 1
        with self.engine.begin() as conn:
            conn.execute(
                self.table.insert().values(
                    id=f"m{self.i}",
                    chat_jid="main@local",
                    seq=self.i,
                    sender="u",
                    sender_name="u",
                    content=f"message {self.i}",
                    timestamp="2026-11-26T00:00:00+00:00",
                    message_type="user",
                )
            )

    def close(self) -> None:
        self.meta.drop_all(self.engine)
        self.engine.dispose()


def rate(fn: Callable[[], object], n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - t0)


def run_backend(name: str, settings: Settings, n: int, rounds: int, profile: bool) -> None:
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    per_block = max(1, n // rounds)
    idle = [f"idle{i}@bench" for i in range(per_block * rounds + 1)]
    for i, jid in enumerate(idle):
        add_group(db, chat_jid=jid, name=jid, folder=f"idle{i}", requires_trigger=False)
    signals = Orchestrator(settings).signals  # each backend has its own broker
    signal = signals.group
    counter = iter(range(10**9))
    idle_iter = iter(idle)

    def busy() -> None:
        ingest(
            db,
            settings,
            IncomingMessage(chat_jid="main@local", sender="u", content=f"message {next(counter)}"),
            signal=signal,
        )

    def to_idle() -> None:
        ingest(db, settings, IncomingMessage(chat_jid=next(idle_iter), sender="u", content="hello"), signal=signal)

    plain = PlainInserts(settings.effective_database_url)
    busy()  # the group's first message signals; the burst that follows does not need to
    to_idle()  # first publish opens the broker connection
    floors, busies, idles = [], [], []
    for _ in range(rounds):
        floors.append(rate(plain.one, per_block))
        busies.append(rate(busy, per_block))
        idles.append(rate(to_idle, per_block))
    plain.close()
    floor, real, worst = statistics.median(floors), statistics.median(busies), statistics.median(idles)
    print(
        f"{name:24} plain insert {floor:7.0f} msg/s | ingest, one busy group {real:7.0f} msg/s"
        f" (ratio {real / floor:4.2f}, target {TARGET}: {'met' if real / floor >= TARGET else 'MISSED'})"
        f" | ingest, idle groups (a signal each) {worst:7.0f} msg/s (ratio {worst / floor:4.2f})"
    )
    if profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [busy() for _ in range(per_block)])
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(r"orchestrator|commit|execute\b", 25)
        print(out.getvalue())
    signals.app.control.purge()  # nobody will drain the signals we queued
    db.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000, help="per kind, over all rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pg", default="", help="a PostgreSQL server URL whose role may create databases")
    ap.add_argument("--redis", default="", help="a Redis URL to use as the broker for the PostgreSQL run")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile summary of the busy-group path")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        sqlite = Settings.load(data_dir=base / "sqlite", env_file=None)
        run_backend("sqlite + filesystem://", sqlite, args.messages, args.rounds, args.profile)
        if args.pg:
            with fresh_pg_database(args.pg) as url:
                pg = Settings.load(data_dir=base / "pg", database_url=url, broker_url=args.redis, env_file=None)
                broker = args.redis.split(":")[0] if args.redis else "filesystem://"
                run_backend(f"postgresql + {broker}", pg, args.messages, args.rounds, args.profile)


if __name__ == "__main__":
    main()
