"""Delivery latency while every agent slot is busy: a message to a group's webhook.

Two groups: BUSY (no trigger needed) and QUIET (a trigger needed, so a
message there wakes no agent) with the built-in ``webhook`` channel attached,
pointed at a small HTTP receiver on 127.0.0.1 in this process (it checks the
signature, answers 200 and notes the arrival).  BUSY gets ``$ sleep S``
(``--busy-s``, default 6); once its run is ``running``, QUIET gets
``--messages`` messages (default 5) 0.3 s apart.  Latency: the receiver's
arrival minus the moment the message was handed to ingest (one clock).  A
delivery to the receiver first, not timed, warms the path up (worker start,
imports, the HTTP client).  Two layouts, each on a fresh installation with
real ``celery worker`` processes started as ``orchestrator up`` starts them
(``worker_argv``), the offline model, a cold container:

* ``one pool`` (baseline, the layout before the deliverer): one worker
  consuming ``-Q agent,delivery`` with one slot: a delivery waits for the
  slot the busy run holds;
* ``own deliverer`` (``orchestrator up``, compose): one worker ``-Q agent``
  and one ``-Q delivery``, one slot each.

For each it prints p50 / p95 / max latency, how many were delivered and how
many arrived while the busy run was still going (the run's ``finished_at``),
then the ratio of the two medians.  A message not delivered within S + 30 s
makes the command fail.  Embedded stack (SQLite + filesystem://); with
``--pg`` and ``--redis`` the fleet stack too (PostgreSQL + Redis; the Redis
database is flushed).

    .venv/bin/python -m bench.delivery [--messages 5] [--busy-s 6] [--pg URL --redis URL]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message
from pathlib import Path

from bench.common import (
    ROOT,
    Extra,
    HookReceiver,
    flush_broker,
    install,
    pct,
    process_logs,
    remove_install_containers,
    signals_for,
    stacks,
    stop_processes,
    wait_for,
    worker_env,
)
from orchestrator.channels.registry import build_registry
from orchestrator.channels.webhook import CHANNEL
from orchestrator.cli.supervisor import worker_argv
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.store.attachments import attach_channel
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.runs import Run, list_runs

BUSY, QUIET = "busy@bench", "quiet@bench"
SECRET = "bench-delivery-secret"  # outbound webhooks are signed with it; the receiver checks
GAP_S = 0.3  # between two messages to QUIET
GRACE_S = 30.0  # a message must arrive within --busy-s + this
# (label, the queues of each worker): the old layout first, the baseline.
LAYOUTS: list[tuple[str, list[tuple[str, ...]]]] = [
    ("one pool", [("agent", "delivery")]),
    ("own deliverer", [("agent",), ("delivery",)]),
]


class Receiver(HookReceiver):
    """A webhook endpoint on loopback: each signed POST's message content -> its arrival
    (``time.monotonic()`` and wall clock); a wrong signature is answered 401 and not noted."""

    def __init__(self) -> None:
        self.arrivals: dict[str, tuple[float, float]] = {}
        self.rejected = 0
        super().__init__(SECRET)

    def signed(self, headers: Message, body: bytes, arrived: tuple[float, float]) -> None:
        self.arrivals.setdefault(json.loads(body)["message"]["content"], arrived)

    def unsigned(self) -> None:
        self.rejected += 1

    def arrival(self, content: str) -> tuple[float, float] | None:
        with self._lock:
            return self.arrivals.get(content)


@contextlib.contextmanager
def workers(settings: Settings, layout: list[tuple[str, ...]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One ``celery worker`` per queue set, one slot each, as ``orchestrator up`` starts them."""
    env = worker_env(settings) | {"ORCHESTRATOR_WEBHOOK_SECRET": SECRET}
    # Loopback never through a proxy the environment may name.
    env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, [env.get("NO_PROXY", ""), "127.0.0.1"]))
    logs = settings.data_dir / "logs"
    logs.mkdir(exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, queues in enumerate(layout):
            with open(logs / f"worker{i}.log", "ab") as fh:
                procs.append(
                    subprocess.Popen(
                        worker_argv(1, "WARNING", queues=queues, name=f"delivery{i}@%h"),
                        env=env,
                        cwd=ROOT,
                        stdout=subprocess.DEVNULL,
                        stderr=fh,
                    )
                )
        yield procs
    finally:
        stop_processes(procs)


def _busy_run(db: Database) -> Run | None:
    runs = list_runs(db, chat_jid=BUSY, limit=1)
    return runs[0] if runs else None


def _send(db: Database, settings: Settings, jid: str, content: str) -> None:
    signals = signals_for(settings)
    ingest(
        db,
        settings,
        IncomingMessage(chat_jid=jid, sender="bench", sender_name="Bench", content=content),
        signal=signals.group,
        signal_delivery=signals.delivery,
    )


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@dataclass
class Result:
    latencies: list[float]  # s, of the messages delivered, in the order sent
    sent: int
    during: int  # delivered before the busy run had finished
    warmup: float  # s, the untimed first delivery
    busy_ran: float  # s, the busy run's duration (its started_at to finished_at)


def measure(
    settings: Settings, db: Database, layout: list[tuple[str, ...]], messages: int, busy_s: float, tag: str
) -> Result:
    with Receiver() as receiver:
        attach_channel(db, QUIET, CHANNEL, address=receiver.url, registry=build_registry(settings))
        with workers(settings, layout):
            # Not timed: the workers' start, their imports, the webhook's HTTP client.
            t0 = time.monotonic()
            _send(db, settings, QUIET, f"{tag} warm-up")
            wait_for(lambda: receiver.arrival(f"{tag} warm-up") is not None, 120, "the warm-up delivery", settings)
            warmed = receiver.arrival(f"{tag} warm-up")
            warmup = warmed[0] - t0 if warmed else 0.0

            # The only agent slot: a run that sleeps.
            _send(db, settings, BUSY, f"$ sleep {busy_s:g}")
            wait_for(
                lambda: (r := _busy_run(db)) is not None and (r.state == "running" or r.finished_at is not None),
                120,
                "the busy group's run to start",
                settings,
            )

            stamps: dict[str, float] = {}
            start = time.monotonic()
            for i in range(messages):
                time.sleep(max(0.0, start + i * GAP_S - time.monotonic()))
                content = f"{tag} message {i}"
                stamps[content] = time.monotonic()  # handed to ingest now
                _send(db, settings, QUIET, content)

            bound = busy_s + GRACE_S  # for each message, from its own stamp
            deadline = max(stamps.values()) + bound
            while time.monotonic() < deadline and any(receiver.arrival(c) is None for c in stamps):
                time.sleep(0.02)
            # Its finished_at says which deliveries arrived while it still ran.
            wait_for(
                lambda: (r := _busy_run(db)) is not None and r.finished_at is not None,
                busy_s + 120,
                "the busy run to end",
                settings,
            )
            run = _busy_run(db)
            assert run is not None and run.finished_at is not None and run.started_at is not None
            if run.state != "succeeded":
                raise SystemExit(f"the busy run ended {run.state}: {run.error}; logs:\n{process_logs(settings)}")
            arrivals = {c: a for c, t in stamps.items() if (a := receiver.arrival(c)) is not None and a[0] - t <= bound}
            missing = [c for c in stamps if c not in arrivals]
            if missing:
                print(
                    f"    not delivered within {bound:.0f} s: {', '.join(missing)}"
                    f" ({receiver.rejected} POST(s) with a wrong signature); logs:\n{process_logs(settings)}",
                    file=sys.stderr,
                )
    ended = _epoch(run.finished_at)
    return Result(
        latencies=[arrivals[c][0] - stamps[c] for c in stamps if c in arrivals],
        sent=messages,
        during=sum(wall < ended for _, wall in arrivals.values()),
        warmup=warmup,
        busy_ran=ended - _epoch(run.started_at),
    )


def run_backend(
    base: Path,
    image: str,
    name: str,
    args: argparse.Namespace,
    extra: Extra,
) -> bool:
    """Both layouts on ``name``'s stack; whether every message was delivered."""
    print(
        f"{name}: BUSY runs `$ sleep {args.busy_s:g}` (cold container, offline model); meanwhile"
        f" {args.messages} message(s) {GAP_S:g} s apart to QUIET's webhook (a receiver on 127.0.0.1)",
        flush=True,
    )
    medians: dict[str, float] = {}
    complete = True
    for label, layout in LAYOUTS:
        with tempfile.TemporaryDirectory(dir=base) as tmp, extra() as more:
            settings, db = install(Path(tmp), image, 0, webhook_secret=SECRET, **more)
            add_group(db, chat_jid=BUSY, name="busy", folder="busy", requires_trigger=False)
            add_group(db, chat_jid=QUIET, name="quiet", folder="quiet", requires_trigger=True)
            flush_broker(settings)
            try:
                r = measure(settings, db, layout, args.messages, args.busy_s, label.replace(" ", "-"))
            finally:
                remove_install_containers(settings)
                db.dispose()
        queues = " + ".join(f"-Q {','.join(q)}" for q in layout)
        slots = "1 slot each" if len(layout) > 1 else "1 slot"
        how = f"{label} ({queues}, {slots}{'; baseline' if label == LAYOUTS[0][0] else ''})"
        if r.latencies:
            medians[label] = statistics.median(r.latencies)
            figures = (
                f"p50 {pct(r.latencies, 50) * 1000:6.0f} ms, p95 {pct(r.latencies, 95) * 1000:6.0f} ms,"
                f" max {max(r.latencies) * 1000:6.0f} ms"
            )
        else:
            figures = "nothing delivered"
        print(
            f"  {how}: {figures}; {len(r.latencies)}/{r.sent} delivered,"
            f" {r.during}/{r.sent} while the busy run still ran",
            flush=True,
        )
        print(
            f"    each (ms, in the order sent): {' '.join(f'{x * 1000:.0f}' for x in r.latencies)};"
            f" warm-up delivery {r.warmup * 1000:.0f} ms (not counted); busy run {r.busy_ran:.1f} s",
            flush=True,
        )
        complete = complete and len(r.latencies) == r.sent
    (base_label, _), (own_label, _) = LAYOUTS
    if base_label in medians and own_label in medians:
        print(
            f"  {name}: baseline p50 / own deliverer p50 = {medians[base_label] / medians[own_label]:.1f}x"
            f" ({medians[base_label] * 1000:.0f} ms / {medians[own_label] * 1000:.0f} ms)",
            flush=True,
        )
    return complete


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=5, help="messages to the quiet group, 0.3 s apart")
    ap.add_argument("--busy-s", type=float, default=6.0, help="how long the busy group's run sleeps (s)")
    ap.add_argument("--pg", default="", help="PostgreSQL server URL (a role that may create databases)")
    ap.add_argument("--redis", default="", help="Redis URL of a database the benchmark may flush (with --pg)")
    args = ap.parse_args()
    if args.messages < 1 or args.busy_s <= 0:
        ap.error("--messages must be at least 1 and --busy-s above 0")
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"
    print(f"machine: {os.cpu_count()} CPUs, load average at the start {load}", flush=True)
    complete = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in stacks(args.pg, args.redis):
            complete = run_backend(Path(tmp), settings.sandbox.agent_image, name, args, extra) and complete
    if not complete:
        raise SystemExit(f"some message was not delivered within --busy-s + {GRACE_S:.0f} s")


if __name__ == "__main__":
    main()
