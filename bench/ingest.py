"""Ingest throughput: messages per second through the real ingest path
(store + routing + pending mark + Celery signal), against plain SQLAlchemy
inserts of the same rows with the same commit-per-message pattern (the
database's floor), measured in the same process.

    .venv/bin/python bench/ingest.py [--messages N] [--pg URL]

Prints one line per backend with both rates and the ratio.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, Text, create_engine

from orchestrator import queue
from orchestrator.db import Database
from orchestrator.groups import ensure_main_group
from orchestrator.ingest import IncomingMessage, ingest
from orchestrator.queue import signal_group
from orchestrator.settings import Settings


def plain_inserts(url: str, n: int) -> float:
    """Commit one row at a time into a table shaped like ``messages``."""
    engine = create_engine(url)
    meta = MetaData()
    table = Table(
        f"plain_{uuid.uuid4().hex[:8]}", meta,
        Column("id", Text, primary_key=True), Column("chat_jid", Text, primary_key=True),
        Column("seq", Integer), Column("sender", Text), Column("sender_name", Text),
        Column("content", Text), Column("timestamp", Text), Column("message_type", Text),
    )
    meta.create_all(engine)
    if url.startswith("sqlite"):
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")
            conn.exec_driver_sql("PRAGMA synchronous=NORMAL")
    t0 = time.perf_counter()
    for i in range(n):
        with engine.begin() as conn:
            conn.execute(table.insert().values(
                id=f"m{i}", chat_jid="main@local", seq=i, sender="u", sender_name="u",
                content=f"message {i}", timestamp="2026-11-26T00:00:00+00:00", message_type="user",
            ))
    elapsed = time.perf_counter() - t0
    meta.drop_all(engine)
    engine.dispose()
    return n / elapsed


def real_ingest(settings: Settings, n: int) -> float:
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    ensure_main_group(db)
    signal = partial(signal_group, settings)
    t0 = time.perf_counter()
    for i in range(n):
        ingest(db, settings, IncomingMessage(chat_jid="main@local", sender="u", content=f"message {i}"),
               signal=signal)
    elapsed = time.perf_counter() - t0
    db.dispose()
    return n / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--pg", default="", help="a PostgreSQL URL whose database may be written to")
    ap.add_argument("--redis", default="", help="a Redis URL to use as the broker for the PostgreSQL run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        runs = [("sqlite + filesystem://", Settings(data_dir=base / "sqlite", _env_file=None), f"sqlite:///{base / 'plain.db'}")]  # type: ignore[call-arg]
        if args.pg:
            runs.append(
                ("postgresql + " + (args.redis.split(":")[0] if args.redis else "filesystem"),
                 Settings(data_dir=base / "pg", database_url=args.pg, broker_url=args.redis, _env_file=None),  # type: ignore[call-arg]
                 args.pg)
            )
        for name, settings, plain_url in runs:
            settings.ensure_dirs()
            queue.forget_celery()  # the process caches one Celery app; each run has its own broker
            floor = plain_inserts(plain_url, args.messages)
            real = real_ingest(settings, args.messages)
            print(f"{name:28} ingest {real:8.0f} msg/s   plain insert {floor:8.0f} msg/s   ratio {real / floor:5.2f}")


if __name__ == "__main__":
    main()
