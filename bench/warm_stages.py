"""Where a warm reply's time goes through the real path, stage by stage.

One message at a time to the main group (the offline model, a warm
container), through ``ingest`` with its Celery signal, the ``filesystem://``
broker, one ``celery worker`` process with one pool child (``bench.marked_app``:
the product's app, which writes down when Celery's signals fire), the run and
the reply, as ``bench.overhead``'s warm figure is measured.  Each message is
sent once the previous run has ended.  Printed, medians over ``--runs``:

* the message stored -> the signal starts (the ingest's transaction);
* -> the worker's main process has the message (Celery's ``send_task`` up to
  the message file's rename, the broker's inotify wake-up, kombu, Celery's
  strategy);
* -> the pool child starts the task (the task-received event, the hand-over
  to the child);
* -> the run's row is written (the lease, the reads, the input, the slot);
* -> the reply is stored (the container, the runner, the reply's write);
* and the whole: message stored -> reply stored; apart, how long ``send_task``
  holds its caller (it goes on after the message is out: the task-sent
  event), which may end after the worker has the message.

Times are wall clock (one machine), read from the database (the message's and
the reply's timestamps, the run's ``created_at``), from the driver and from the
worker's marks.  ``bench.run_path`` splits the worker's part further, in one
process.

    .venv/bin/python -m bench.warm_stages [--runs 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from bench.common import Workers, install, signals_for
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs

JID = "main@local"
T = TypeVar("T")
STAGES = (
    "message stored -> the signal starts",
    "-> the worker has the message",
    "-> the pool child starts the task",
    "-> the run's row written",
    "-> the reply stored",
)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _marks(path: Path) -> dict[str, float]:
    """The first time each moment was written down (the drain task's; one task a message)."""
    found: dict[str, float] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            at, moment, _ = line.split(" ", 2)
            found.setdefault(moment, float(at))
    return found


def _ended(db: Database, before: int) -> bool:
    runs = list_runs(db, limit=before + 1)
    return len(runs) > before and all(r.finished_at is not None for r in runs)


def measure(data_dir: Path, image: str, runs: int) -> list[dict[str, float]]:
    """Each run's stages (s), in :data:`STAGES` order, and its whole under ``total``."""
    settings, db = install(data_dir, image, warm_idle_s=120)
    ensure_main_group(db)
    marks = settings.data_dir / "stage-marks"
    send = signals_for(settings).group
    sent_at: list[float] = []

    def timed_signal(*args: object, **kwargs: object) -> str:
        sent_at.append(time.time())
        task = send(*args, **kwargs)  # type: ignore[arg-type]
        sent_at.append(time.time())
        return task

    rows: list[dict[str, float]] = []
    try:
        with Workers(settings, 1, app="bench.marked_app"):
            time.sleep(3)  # the worker's start-up (not part of any run)
            for i in range(runs + 1):
                marks.unlink(missing_ok=True)
                sent_at.clear()
                message = ingest(
                    db,
                    settings,
                    IncomingMessage(chat_jid=JID, sender="bench", content=f"ping {i}"),
                    signal=timed_signal,
                ).message
                reply = _wait(
                    lambda seq=message.seq: [m for m in get_messages_after(JID, seq, db=db) if m.sender == "bot"]
                )
                _wait(lambda i=i: _ended(db, i))  # the next message finds an idle worker
                time.sleep(0.2)  # the task's ack and the worker's return to the queue
                if i == 0:
                    continue  # the first run also starts the container
                seen = _marks(marks)
                created = list_runs(db, limit=1)[0].created_at.timestamp()
                stored, replied = _ts(message.timestamp), _ts(reply[0].timestamp)
                points = [stored, sent_at[0], seen["received"], seen["prerun"], created, replied]
                row = {name: b - a for name, a, b in zip(STAGES, points[:-1], points[1:], strict=True)}
                row["total"] = replied - stored
                row["send_task"] = sent_at[1] - sent_at[0]
                rows.append(row)
    finally:
        WarmPool(settings, docker_client(settings)).stop_all()
        db.dispose()
    return rows


def _wait(found: Callable[[], T], timeout_s: float = 60) -> T:
    deadline = time.monotonic() + timeout_s
    while not (value := found()):
        if time.monotonic() > deadline:
            raise SystemExit("a run did not answer and end within 60 s")
        time.sleep(0.005)
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(Path(tmp), settings.sandbox.agent_image, args.runs)
    print(f"a warm reply through the worker, stage by stage (median ms, n = {len(rows)}):")
    for name in STAGES:
        print(f"  {statistics.median(r[name] for r in rows) * 1000:7.2f}  {name}")
    print(f"  {sum(statistics.median(r[name] for r in rows) for name in STAGES) * 1000:7.2f}  (sum of the medians)")
    print(f"message stored -> reply stored: p50 {statistics.median(r['total'] for r in rows) * 1000:.2f} ms")
    print(f"send_task holds its caller: p50 {statistics.median(r['send_task'] for r in rows) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
