"""Push wake-ups of the embedded broker: a warm session's message-to-reply
latency, and what an idle worker costs, with the filesystem:// broker
polled (kombu's way, every ``ORCHESTRATOR_BROKER_POLLING_INTERVAL``: the
baseline) and woken by inotify (``ORCHESTRATOR_BROKER_WAKEUP=inotify``, the
default), in the same command:

    .venv/bin/python -m bench.wakeup [--runs N] [--idle-s S] [--rounds R] [--hops H]

Latency as in ``bench/overhead.py``: a real ``celery worker`` (one pool
child), warm sessions on, the offline model, each message sent once the
previous run has ended, so it finds an idle worker; the reply's stored
timestamp minus the message's.  Idle CPU: the worker's main process and its
pool child (user + system time from ``/proc/<pid>/stat``), over ``--idle-s``
seconds after its start-up, with nothing to do.  The modes alternate for
``--rounds`` rounds, each a fresh installation, so a machine that gets
busier halfway weighs on both.

Then the wake-up alone, without Celery or a database: the delay from a
message's publication to an idle kombu consumer's callback on the same
transport, each mode (``--hops`` messages per mode and round).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
from kombu import Connection, Consumer, Exchange, Queue

from bench.common import Workers, cpu_seconds, install, pct
from bench.overhead import measure
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image

MODES = ("poll", "inotify")
HOP_QUEUE = "hop"


def _hop_connection(folder: Path, mode: str, polling_interval: float) -> Connection:
    return Connection(
        "filesystem://",
        transport="orchestrator.run.fs_transport:Transport",
        transport_options={
            "data_folder_in": str(folder),
            "data_folder_out": str(folder),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": polling_interval,
            "wakeup": mode,
        },
    )


def _hop_consumer(folder: str, mode: str, polling_interval: float, n: int, out: Any) -> None:
    """An idle consumer: the delay from each message's publication (its body) to its callback."""
    queue = Queue(HOP_QUEUE, Exchange(HOP_QUEUE), routing_key=HOP_QUEUE)
    delays: list[float] = []

    def on_message(body: dict[str, float], message: Any) -> None:
        delays.append(time.time() - body["t"])
        message.ack()

    with (
        _hop_connection(Path(folder), mode, polling_interval) as conn,
        Consumer(conn, [queue], callbacks=[on_message], accept=["json"]),
    ):
        out.put("ready")
        while len(delays) < n:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=2)
    out.put(delays)


def _idle_consumer(folder: str, mode: str, polling_interval: float, seconds: float, out: Any) -> None:
    """A consumer with nothing to consume, for ``seconds`` (its CPU is read by the parent), of
    four queues as a worker consumes (`agent`, its host's, `delivery`, remote control)."""
    queues = [Queue(f"{HOP_QUEUE}{i}", Exchange(f"{HOP_QUEUE}{i}"), routing_key=f"{HOP_QUEUE}{i}") for i in range(4)]
    with (
        _hop_connection(Path(folder), mode, polling_interval) as conn,
        Consumer(conn, queues, callbacks=[lambda body, message: message.ack()], accept=["json"]),
    ):
        out.put("ready")
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=min(2.0, left))  # as Celery's worker loop asks
    out.put("done")


def idle_consumer_cpu(mode: str, polling_interval: float, seconds: float) -> float:
    """Share of a core an idle consumer of the embedded broker uses (the broker's part of an
    idle worker's CPU), from ``/proc/<pid>/stat`` (psutil) over ``seconds``."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = ctx.Queue()
        proc = ctx.Process(target=_idle_consumer, args=(tmp, mode, polling_interval, seconds + 1, out))
        proc.start()
        out.get(timeout=60)
        me = psutil.Process(proc.pid)
        time.sleep(0.5)
        t0, cpu0 = time.monotonic(), sum(me.cpu_times()[:2])
        time.sleep(seconds)
        used = sum(me.cpu_times()[:2]) - cpu0
        share = used / (time.monotonic() - t0)
        out.get(timeout=60)
        proc.join(30)
    return share


def broker_hop(mode: str, polling_interval: float, n: int) -> list[float]:
    """Publish -> an idle consumer's callback on the embedded broker (kombu, no Celery, no
    database): the wake-up alone.  One message every 0.13 s, so each finds the consumer idle."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = ctx.Queue()
        proc = ctx.Process(target=_hop_consumer, args=(tmp, mode, polling_interval, n, out))
        proc.start()
        out.get(timeout=60)
        with _hop_connection(Path(tmp), "poll", polling_interval) as conn:
            producer = conn.Producer()
            for _ in range(n):
                time.sleep(0.13)
                producer.publish({"t": time.time()}, exchange=HOP_QUEUE, routing_key=HOP_QUEUE)
        delays: list[float] = out.get(timeout=120)
        proc.join(30)
    return delays


@contextlib.contextmanager
def wakeup_mode(mode: str) -> Iterator[None]:
    """The workers started in the block use ``mode`` (they take the bench's environment)."""
    old = os.environ.get("ORCHESTRATOR_BROKER_WAKEUP")
    os.environ["ORCHESTRATOR_BROKER_WAKEUP"] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ORCHESTRATOR_BROKER_WAKEUP", None)
        else:
            os.environ["ORCHESTRATOR_BROKER_WAKEUP"] = old


def idle_cpu(data_dir: Path, image: str, idle_s: float) -> float:
    """Share of one core an idle worker (main process + pool child) uses over ``idle_s``."""
    settings, db = install(data_dir, image)
    db.dispose()
    with Workers(settings, 1) as workers:
        time.sleep(5)  # start-up: imports, connections, the first sweep
        procs = workers.trees()
        before = cpu_seconds(procs)
        t0 = time.monotonic()
        time.sleep(idle_s)
        used = cpu_seconds(procs) - before
        return used / (time.monotonic() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="warm runs per mode and round")
    parser.add_argument("--idle-s", type=float, default=20, help="seconds of idle CPU measured per mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hops", type=int, default=50, help="broker-only messages per mode and round")
    args = parser.parse_args()
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    image = settings.sandbox.agent_image
    latency: dict[str, list[float]] = {m: [] for m in MODES}
    to_run: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    hop: dict[str, list[float]] = {m: [] for m in MODES}
    consumer_cpu: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in MODES:
                hop[mode] += broker_hop(mode, settings.broker_polling_interval, args.hops)
                consumer_cpu[mode].append(idle_consumer_cpu(mode, settings.broker_polling_interval, args.idle_s))
                with wakeup_mode(mode):
                    split: list[tuple[float, float]] = []
                    latency[mode] += measure(Path(tmp) / f"{mode}-{r}", image, args.runs, warm_idle_s=120, split=split)
                    to_run[mode] += [a for a, _ in split]
                    cpu[mode].append(idle_cpu(Path(tmp) / f"{mode}-idle-{r}", image, args.idle_s))
    print(
        f"warm session, message -> reply (n={args.runs * args.rounds} per mode, offline model),"
        f" and an idle worker's CPU ({args.rounds} x {args.idle_s:.0f} s; main process + pool child)"
    )
    print(f"{'broker wake-up':36} {'p50':>7} {'p95':>7} {'msg->run p50':>13} {'idle CPU':>18}")
    for mode in MODES:
        name = f"poll every {settings.broker_polling_interval:g} s (baseline)" if mode == "poll" else "inotify"
        print(
            f"{name:36} {pct(latency[mode], 50) * 1000:5.0f}ms {pct(latency[mode], 95) * 1000:5.0f}ms"
            f" {statistics.median(to_run[mode]) * 1000:11.0f}ms"
            f"   {' / '.join(f'{c:.2%}' for c in cpu[mode]):>15} of a core"
        )
    print(f"the broker hop alone (publish -> an idle kombu consumer's callback, n={args.hops * args.rounds} per mode):")
    for mode in MODES:
        print(
            f"  {mode:8} p50 {pct(hop[mode], 50) * 1000:6.1f}ms  p95 {pct(hop[mode], 95) * 1000:6.1f}ms"
            f"   idle consumer {' / '.join(f'{c:.2%}' for c in consumer_cpu[mode])} of a core"
        )
    print(f"poll / inotify (p50): {pct(latency['poll'], 50) / pct(latency['inotify'], 50):.2f}x")


if __name__ == "__main__":
    main()
