"""Orchestration overhead: from a triggering message being stored to the
first reply being stored, with the offline model (no model time), through
the real path (ingest, Celery signal, a `celery worker` process, the
sandbox), cold containers and warm sessions, and the first run of a quiet
group (one with no warm container: a new group each time), without and with
standby sandboxes (``ORCHESTRATOR_STANDBY``: a container started ahead takes
the group's workspace by a late bind).

Baselines measured in the same command:

* ``docker run --rm`` of the same image doing nothing: the floor for a cold
  container start;
* a 2-second polling loop (the single-process design): a message waits
  uniform(0, 2 s) for the next poll, then the same work as our cold run.

    .venv/bin/python bench/overhead.py [--runs N]

Latency is read from the database: the reply's stored timestamp minus the
message's (one clock, no polling error in the measurement).  Each message is
sent once the previous run has ended (its container stopped and removed), as
in a conversation; it is also split into message -> run created (signal,
broker, worker, lease, batch) and run created -> reply.

Then where a cold run's time goes, phase by phase, for the floor's container
(create, start, wait for exit, remove) and for a sandbox run of the real
input (hardened create + attach + start + input written, the runner's first
event, exit, remove), each the median of ``--runs``.  The floor's figure
includes the removal; a run's reply is stored before its container exits.

Then where a warm run's time goes, step by step (the container had and the
input written, the runner's first event, the rest of its stream, the run's
end, the clean-up after it), with the Docker API calls of each step, counted
on the client (``bench.common.DockerCalls``); and warm runs through the
pipeline in this process (no broker, no worker process): message -> reply,
and each run's Docker calls and database transactions.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

import docker
from sqlalchemy import select

from agent_runner.protocol import ContainerInput, SdkMessage
from bench.common import DockerCalls, Workers, install, pct, signals_for
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import ContainerSpec, DockerSandbox, docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, ensure_main_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.tables import RunRow

JID = "main@local"
POLL_S = 2.0


def late_mounts_reason() -> str | None:
    """Why standby sandboxes cannot run here (None: they can)."""
    from orchestrator.sandbox.late_mounts import unavailable_reason

    with tempfile.TemporaryDirectory() as tmp:
        return unavailable_reason(Path(tmp))


def late_mounts_ok() -> bool:
    return late_mounts_reason() is None


def docker_run_floor(image: str, n: int) -> list[float]:
    client = docker.from_env()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.containers.run(image, entrypoint=["true"], network_mode="none", remove=True)
        out.append(time.perf_counter() - t0)
    return out


def floor_phases(image: str, n: int) -> dict[str, list[float]]:
    """The floor's container, step by step: create, start, exit, remove."""
    api = docker.from_env().api
    out: dict[str, list[float]] = {"create": [], "start": [], "exit": [], "remove": []}
    for _ in range(n):
        t0 = time.perf_counter()
        cid = api.create_container(image, entrypoint=["true"], host_config=api.create_host_config(network_mode="none"))
        t1 = time.perf_counter()
        api.start(cid)
        t2 = time.perf_counter()
        api.wait(cid)
        t3 = time.perf_counter()
        api.remove_container(cid, force=True)
        t4 = time.perf_counter()
        for k, v in zip(out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            out[k].append(v)
    return out


def sandbox_phases(data_dir: Path, image: str, n: int) -> dict[str, list[float]]:
    """A hardened run container of the real runner with a real input, step by step."""
    settings = Settings.load(data_dir=data_dir, agent_image=image, env_file=None)
    settings.ensure_dirs()
    sandbox = DockerSandbox(settings)
    payload = ContainerInput(
        run_id="bench",
        chat_jid=JID,
        group_folder="main",
        assistant_name="Andy",
        messages=[SdkMessage(role="user", content="ping")],
    ).to_json()
    out: dict[str, list[float]] = {"create + attach + start + input": [], "first event": [], "exit": [], "remove": []}
    for i in range(n):
        spec = ContainerSpec(
            image=image,
            name=f"orch-bench-phases-{os.getpid()}-{i}",
            workspace=settings.groups_dir / "main",
            run_id=f"bench-{i}",
            group_folder="main",
            install_id=settings.install_id,
        )
        t0 = time.perf_counter()
        container = sandbox.start(spec, payload)
        t1 = time.perf_counter()
        with container:
            lines = container.lines()
            first = next(lines)
            t2 = time.perf_counter()
            if not first.startswith('{"type":'):
                raise SystemExit(f"the runner's first line is not an event: {first!r}")
            for _ in lines:
                pass
            status = container._container.wait(timeout=30).get("StatusCode")
            t3 = time.perf_counter()
            container.finish()
            t4 = time.perf_counter()
        if status != 0:
            raise SystemExit(f"the runner exited with {status}: {container.exit}")
        for k, v in zip(out, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            out[k].append(v)
    return out


def _call_kind(call: str) -> str:
    """A Docker call without the container's or exec's id (``GET containers/<id>/json``)."""
    return re.sub(r"/[0-9a-f]{64}(?=/|$)", "/<id>", call)


def warm_phases(data_dir: Path, image: str, n: int) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """A warm container's runs of the real runner, step by step, each after the first
    (which starts the container): the container had and the input written, the
    runner's first event, the rest of the stream (the reply is in it), the run's end
    read, the clean-up after it; with the Docker API calls of each step (a
    counting client: what the engine was asked, in order) over the ``n`` runs."""
    from orchestrator.sandbox.warm import WarmPool

    settings = Settings.load(data_dir=data_dir, agent_image=image, warm_idle_s=120, env_file=None)
    settings.ensure_dirs()
    client = docker_client(settings)
    calls = DockerCalls(client)
    pool = WarmPool(settings, client)
    steps = ("had + input", "first event", "rest of stream", "finish", "clean-up")
    out: dict[str, list[float]] = {k: [] for k in steps}
    seen: dict[str, list[str]] = {k: [] for k in steps}
    try:
        for i in range(n + 1):
            payload = ContainerInput(
                run_id=f"bench-{i}",
                chat_jid=JID,
                group_folder="main",
                assistant_name="Andy",
                messages=[SdkMessage(role="user", content="ping")],
            ).to_json()
            spec = ContainerSpec(
                image=image,
                name=f"orch-bench-warm-{os.getpid()}-{i}",
                workspace=settings.groups_dir / "main",
                run_id=f"bench-{i}",
                group_folder="main",
                install_id=settings.install_id,
            )
            calls.take()
            marks = [time.perf_counter()]
            taken: list[list[str]] = []
            run = pool.start(spec, payload)
            marks.append(time.perf_counter())
            taken.append(calls.take())
            with run:
                lines = run.lines()
                next(lines)
                marks.append(time.perf_counter())
                taken.append(calls.take())
                for _ in lines:
                    pass
                marks.append(time.perf_counter())
                taken.append(calls.take())
                run.finish()
                marks.append(time.perf_counter())
                taken.append(calls.take())
            marks.append(time.perf_counter())
            taken.append(calls.take())
            if i == 0:
                continue  # the container's start
            for k, a, b, made in zip(steps, marks[:-1], marks[1:], taken, strict=True):
                out[k].append(b - a)
                seen[k] += [_call_kind(c) for c in made]
    finally:
        pool.stop_all()
    return out, seen


def warm_pipeline_counts(data_dir: Path, image: str, n: int) -> tuple[list[float], list[list[str]], list[list[str]]]:
    """Warm runs through the pipeline in this process (message stored, ``drain_group``,
    no broker or worker process), each after the first: message -> reply (s), and the
    Docker calls and database transactions (``BEGIN`` read or write) of each run."""
    from sqlalchemy import event

    from orchestrator.run.outbound import ChannelRegistry
    from orchestrator.run.pipeline import Pipeline
    from orchestrator.sandbox.warm import WarmPool

    settings, db = install(data_dir, image, warm_idle_s=120)
    ensure_main_group(db)
    client = docker_client(settings)
    calls = DockerCalls(client)
    pool = WarmPool(settings, client)
    transactions: list[str] = []

    @event.listens_for(db.engine, "begin")
    def _begin(conn: object) -> None:
        deferred = getattr(conn, "get_execution_options", dict)().get("sqlite_deferred", False)
        transactions.append("read" if deferred else "write")

    pipeline = Pipeline(settings, db, ChannelRegistry([]), sandbox=pool)
    latencies: list[float] = []
    per_run_calls: list[list[str]] = []
    per_run_tx: list[list[str]] = []
    try:
        for i in range(n + 1):
            sent = ingest(db, settings, IncomingMessage(chat_jid=JID, sender="bench", content=f"ping {i}"), signal=None)
            calls.take()
            transactions.clear()
            pipeline.drain_group(JID)
            made, tx = calls.take(), list(transactions)
            replies = [m for m in get_messages_after(JID, sent.message.seq, db=db) if m.sender == "bot"]
            if not replies:
                raise SystemExit(f"no reply to in-process run {i}")
            if i > 0:
                latencies.append(_ts(replies[0].timestamp) - _ts(sent.message.timestamp))
                per_run_calls.append([_call_kind(c) for c in made])
                per_run_tx.append(tx)
    finally:
        pool.stop_all()
        db.dispose()
    return latencies, per_run_calls, per_run_tx


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def answering_run(db: Database, seq: int) -> RunRow:
    """The run that answered message ``seq``."""
    with db.read() as session:
        run = session.scalars(
            select(RunRow).where(RunRow.chat_jid == JID, RunRow.cursor_to >= seq).order_by(RunRow.created_at).limit(1)
        ).one()
        session.expunge(run)
    return run


def wait_finished(db: Database, seq: int) -> None:
    """Until the run that answered ``seq`` has ended (its container stopped and
    removed): the next message then finds an idle worker, as a message of a
    conversation (seconds apart) would."""
    deadline = time.monotonic() + 60
    while answering_run(db, seq).finished_at is None:
        if time.monotonic() > deadline:
            raise SystemExit("a run did not finish within 60 s")
        time.sleep(0.01)
    time.sleep(0.2)  # the task's ack and the worker's return to the queue


def measure(
    data_dir: Path, image: str, n: int, warm_idle_s: float, split: list[tuple[float, float]] | None = None
) -> list[float]:
    """Latencies (s) of ``n`` runs, one after another, through a real worker;
    ``split`` gets (message -> run created, run created -> reply) of each."""
    settings, db = install(data_dir, image, warm_idle_s=warm_idle_s)
    ensure_main_group(db)
    latencies = []
    try:
        with Workers(settings, 1) as workers:
            time.sleep(3)  # the worker's start-up (not part of any run)
            for i in range(n + 1):
                sent = ingest(
                    db,
                    settings,
                    IncomingMessage(chat_jid=JID, sender="bench", content=f"ping {i}"),
                    signal=signals_for(settings).group,
                ).message
                deadline = time.monotonic() + 120
                while True:
                    replies = [m for m in get_messages_after(JID, sent.seq, db=db) if m.sender == "bot"]
                    if replies:
                        break
                    if time.monotonic() > deadline:
                        raise SystemExit(f"no reply to run {i} within 120 s; the worker's log:\n{workers.logs()}")
                    time.sleep(0.01)
                if i > 0:  # the first run also pays for the worker's first connections
                    latencies.append(_ts(replies[0].timestamp) - _ts(sent.timestamp))
                    if split is not None:
                        created = answering_run(db, sent.seq).created_at.timestamp()
                        split.append((created - _ts(sent.timestamp), _ts(replies[0].timestamp) - created))
                wait_finished(db, sent.seq)
    finally:
        if warm_idle_s:
            from orchestrator.sandbox.warm import WarmPool

            WarmPool(settings, docker_client(settings)).stop_all()
        db.dispose()
    return latencies


def measure_quiet(data_dir: Path, image: str, n: int, standby: int) -> list[float]:
    """Latencies (s) of the first run of ``n`` quiet groups (each new, so none has a
    warm container), through a real worker with warm sessions on; with ``standby``,
    each run starts once the pool is refilled, as quiet groups that wake seconds
    apart find it."""
    from orchestrator.sandbox.warm import WarmPool

    settings, db = install(data_dir, image, warm_idle_s=120, standby=standby)
    pool = WarmPool(settings, docker_client(settings))
    latencies = []
    try:
        with Workers(settings, 1) as workers:
            for i in range(n + 1):
                deadline = time.monotonic() + 60
                while standby and len(pool.standby.ready()) < standby:  # the heartbeat's tending refills it
                    if time.monotonic() > deadline:
                        raise SystemExit(
                            f"the standby pool was not refilled in 60 s; the worker's log:\n{workers.logs()}"
                        )
                    time.sleep(0.02)
                if i == 0:
                    time.sleep(3)  # the worker's start-up (not part of any run)
                jid = f"quiet-{i}@bench"
                add_group(db, chat_jid=jid, name=f"quiet {i}", folder=f"quiet-{i}", requires_trigger=False)
                sent = ingest(
                    db,
                    settings,
                    IncomingMessage(chat_jid=jid, sender="bench", content=f"ping {i}"),
                    signal=signals_for(settings).group,
                ).message
                deadline = time.monotonic() + 120
                while not (replies := [m for m in get_messages_after(jid, sent.seq, db=db) if m.sender == "bot"]):
                    if time.monotonic() > deadline:
                        raise SystemExit(
                            f"no reply to quiet group {i} within 120 s; the worker's log:\n{workers.logs()}"
                        )
                    time.sleep(0.01)
                if i > 0:  # the first run also pays for the worker's first connections
                    latencies.append(_ts(replies[0].timestamp) - _ts(sent.timestamp))
                time.sleep(0.3)  # the run's end (its lease released) before the next group's
    finally:
        pool.stop_all()
        db.dispose()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    image = settings.sandbox.agent_image
    with tempfile.TemporaryDirectory() as tmp:
        floor = docker_run_floor(image, args.runs)
        cold_split: list[tuple[float, float]] = []
        warm_split: list[tuple[float, float]] = []
        cold = measure(Path(tmp) / "cold", image, args.runs, warm_idle_s=0, split=cold_split)
        warm = measure(Path(tmp) / "warm", image, args.runs, warm_idle_s=120, split=warm_split)
        quiet = measure_quiet(Path(tmp) / "quiet", image, args.runs, standby=0)
        standby = measure_quiet(Path(tmp) / "standby", image, args.runs, standby=2) if late_mounts_ok() else []
        phases = [
            ("docker run --rm (floor)", floor_phases(image, args.runs)),
            ("cold sandbox run", sandbox_phases(Path(tmp) / "phases", image, args.runs)),
        ]
        warm_steps, warm_calls = warm_phases(Path(tmp) / "warm-phases", image, args.runs)
        in_process, run_calls, run_tx = warm_pipeline_counts(Path(tmp) / "warm-in-process", image, args.runs)
    rng = random.Random(7)
    polling = [rng.uniform(0, POLL_S) + rng.choice(cold) for _ in range(2000)]
    rows = [
        ("docker run --rm (floor)", floor),
        ("cold container", cold),
        ("warm session", warm),
        ("quiet group, no standby", quiet),
        ("quiet group, standby", standby),
        ("2 s polling loop (model)", polling),
    ]
    print(f"{'':28} {'p50':>8} {'p95':>8}   (n={args.runs}, offline model)")
    for name, values in rows:
        if not values:
            print(f"{name:28} (standby is off here: {late_mounts_reason()})")
            continue
        print(f"{name:28} {pct(values, 50) * 1000:7.0f}ms {pct(values, 95) * 1000:7.0f}ms")
    print(f"cold - floor (p50): {(pct(cold, 50) - pct(floor, 50)) * 1000:.0f} ms")
    if standby:
        print(
            f"quiet group with standby / floor (p50): {pct(standby, 50) / pct(floor, 50):.2f};"
            f" without / with: {pct(quiet, 50) / pct(standby, 50):.1f}x"
        )
    print(
        f"polling / warm (p50): {pct(polling, 50) / pct(warm, 50):.1f}x;"
        f" polling / cold (p50): {pct(polling, 50) / pct(cold, 50):.1f}x"
    )
    print(f"mean cold {statistics.mean(cold) * 1000:.0f} ms, mean warm {statistics.mean(warm) * 1000:.0f} ms")
    print("message -> run created (signal, broker, worker, lease, batch) and run created -> reply (median ms):")
    for name, split in (("cold", cold_split), ("warm", warm_split)):
        print(
            f"  {name:5} {statistics.median(a for a, _ in split) * 1000:6.0f} + "
            f"{statistics.median(b for _, b in split) * 1000:6.0f}"
        )
    print("where a cold container's time goes (median ms of each step):")
    for name, steps in phases:
        total = sum(statistics.median(v) for v in steps.values())
        print(
            f"  {name:26} "
            + "  ".join(f"{k} {statistics.median(v) * 1000:.0f}" for k, v in steps.items())
            + f"  = {total * 1000:.0f}"
        )
    print("where a warm run's time goes (median ms of each step; Docker API calls per run):")
    for name, values in warm_steps.items():
        made = Counter(warm_calls[name])
        listed = ", ".join(f"{k} x{v / args.runs:g}" for k, v in sorted(made.items())) or "none"
        print(
            f"  {name:15} {statistics.median(values) * 1000:6.1f} ms   {sum(made.values()) / args.runs:g} calls: {listed}"
        )
    print(
        f"  = {sum(statistics.median(v) for v in warm_steps.values()) * 1000:.1f} ms;"
        f" before the reply: {sum(statistics.median(warm_steps[k]) for k in list(warm_steps)[:3]) * 1000:.1f} ms"
    )
    print(
        f"a warm run through the pipeline in this process (no broker, no worker process): "
        f"message -> reply p50 {pct(in_process, 50) * 1000:.1f} ms (p95 {pct(in_process, 95) * 1000:.1f});"
        f" per run (median): {statistics.median(len(c) for c in run_calls):g} Docker calls,"
        f" {statistics.median(len(t) for t in run_tx):g} transactions"
        f" ({statistics.median(t.count('write') for t in run_tx):g} write,"
        f" {statistics.median(t.count('read') for t in run_tx):g} read)"
    )
    print(
        "  its Docker calls: " + (", ".join(f"{k} x{v}" for k, v in sorted(Counter(run_calls[-1]).items())) or "none")
    )


if __name__ == "__main__":
    main()
