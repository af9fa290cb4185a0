"""What a process sends to PostgreSQL, counted by kind: every statement and every
transaction's end, with the time spent waiting for each (a benchmark's figures).

Counted at psycopg's level, below SQLAlchemy: the store's fixed statements
(``orchestrator/store/message_log.py``'s ``driver_execute``) go to the driver
directly, and SQLAlchemy's events would not see them.  :func:`install` patches
psycopg's classes in this process (and in the ones it forks); ``write_to``
makes each process write its counts to ``<folder>/<pid>.json`` every
:data:`FLUSH_S` seconds, and :func:`read_folder` adds those files up.

A statement's kind is its first word and its first table (``SELECT groups``,
``INSERT messages``); ``SELECT`` alone is a statement on no table (the pool's
pre-ping, ``SELECT 1``).  ``COMMIT`` and ``ROLLBACK`` count only when they end a
transaction (psycopg sends nothing otherwise, e.g. the pool's reset on
check-in); psycopg's ``BEGIN``, one round trip of its own, is not seen here:
there is one per ``COMMIT`` or ``ROLLBACK``.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

FLUSH_S = 1.0  # a write per second: its cost must not show in the CPU per run
# Where a worker of bench/instant_app.py writes its counts, under its data dir.
FOLDER = "query-counts"
# bench/instant_app.py's empty task (the control-plane benchmark's baseline), counted under this name.
NOOP_TASK = "bench.noop"
# The file under the data dir whose existence lets the empty tasks go (their backlog is queued).
NOOP_GATE = "noop-gate"

Counts = dict[str, list[float]]  # kind -> [statements, seconds waited]

_TABLE = re.compile(r'\b(?:FROM|INTO|UPDATE)\s+"?(\w+)', re.IGNORECASE)
_counts: Counts = {}
_lock = threading.Lock()
_folder: Path | None = None
_writer_pid = 0
# Off in a process that counts only some of its work (the benchmark's driver counts its
# ingest alone: on around it, in the one thread :data:`only_thread` names).
enabled = True
only_thread: int | None = None


def kind(sql: object) -> str:
    """``SELECT groups``, ``INSERT messages``, ...: the statement's first word and first table."""
    text = sql.decode(errors="replace") if isinstance(sql, bytes) else str(sql)
    words = text.split(None, 1)
    if not words:
        return "(empty)"
    verb = words[0].upper()
    table = _TABLE.search(text)
    return f"{verb} {table.group(1).lower()}" if table and verb in ("SELECT", "INSERT", "UPDATE", "DELETE") else verb


def count(key: str, seconds: float) -> None:
    global _writer_pid
    with _lock:
        entry = _counts.setdefault(key, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        if _folder is not None and _writer_pid != os.getpid():
            # This process's first count: a forked child has no writer thread of its own.
            _writer_pid = os.getpid()
            threading.Thread(target=_write_every, name="query-counts", daemon=True).start()


def snapshot() -> Counts:
    with _lock:
        return {k: list(v) for k, v in _counts.items()}


def write() -> None:
    """This process's counts to its file now (a no-op unless :func:`write_to` named a folder)."""
    if _folder is None:
        return
    data = json.dumps(snapshot())
    _folder.mkdir(parents=True, exist_ok=True)
    path = _folder / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(data)
    os.replace(tmp, path)  # a reader never sees half a file


def _write_every() -> None:
    while True:
        time.sleep(FLUSH_S)
        write()


def write_to(folder: Path) -> None:
    global _folder
    _folder = folder


def read_folder(folder: Path) -> Counts:
    """The sum of every process's counts written to ``folder``."""
    total: Counts = {}
    for path in folder.glob("*.json"):
        for key, (n, secs) in json.loads(path.read_text()).items():
            entry = total.setdefault(key, [0, 0.0])
            entry[0] += n
            entry[1] += secs
    return total


def minus(after: Counts, before: Counts) -> Counts:
    return {
        k: [v[0] - before.get(k, [0, 0.0])[0], v[1] - before.get(k, [0, 0.0])[1]]
        for k, v in after.items()
        if v[0] - before.get(k, [0, 0.0])[0] > 0
    }


def _timed(method: Callable[..., Any], key_of: Callable[[Any, tuple[Any, ...]], str | None]) -> Callable[..., Any]:
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        counted = enabled and (only_thread is None or threading.get_ident() == only_thread)
        key = key_of(self, args) if counted else None
        if key is None:
            return method(self, *args, **kwargs)
        t0 = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            count(key, time.perf_counter() - t0)

    wrapper.__wrapped__ = method  # type: ignore[attr-defined]
    return wrapper


def _ending(word: str) -> Callable[[Any, tuple[Any, ...]], str | None]:
    def key_of(conn: Any, args: tuple[Any, ...]) -> str | None:
        return None if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE else word

    return key_of


def install() -> None:
    """Count from now on, in this process and the ones it forks (once per process)."""
    if hasattr(psycopg.Cursor.execute, "__wrapped__"):
        return
    psycopg.Cursor.execute = _timed(psycopg.Cursor.execute, lambda cur, args: kind(args[0]))  # type: ignore[method-assign]
    psycopg.Cursor.executemany = _timed(  # type: ignore[method-assign]
        psycopg.Cursor.executemany, lambda cur, args: kind(args[0]) + " (many)"
    )
    psycopg.Connection.commit = _timed(psycopg.Connection.commit, _ending("COMMIT"))  # type: ignore[method-assign]
    psycopg.Connection.rollback = _timed(psycopg.Connection.rollback, _ending("ROLLBACK"))  # type: ignore[method-assign]
