"""Fault tests with real processes: SIGKILLed workers, several workers racing
for one group, and a broker that goes away while messages arrive.

Each test prints a ``FAULTS:`` line with its counts (run pytest with -s to
see them); the assertions are on the same counts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import docker
import pytest

from orchestrator.cli.supervisor import worker_argv
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import LABEL_GROUP, LABEL_INSTALL, LABEL_MANAGED
from orchestrator.store.groups import add_group, ensure_main_group, get_group, list_groups
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from tests.conftest import require_service, wait_until

from .conftest import Stack

FAST = {
    "ORCHESTRATOR_LEASE_TTL_S": "2",
    "ORCHESTRATOR_SWEEP_INTERVAL_S": "1",
    "ORCHESTRATOR_RETRY_BASE_S": "0.1",
}


def _spawn(stack: Stack, argv: list[str], name: str) -> subprocess.Popen[bytes]:
    """Start a process in its own session, so a test can SIGKILL all of it."""
    log = stack.settings.data_dir.parent / f"{name}-{len(stack.procs)}.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            argv,
            env=stack.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd=stack.settings.data_dir.parent,
            start_new_session=True,
        )
    stack.procs.append(proc)
    stack.logs.append(log)
    return proc


def _worker(stack: Stack, concurrency: int = 1) -> subprocess.Popen[bytes]:
    n = len(stack.procs)
    return _spawn(stack, worker_argv(concurrency, name=f"fault{n}@%h"), "worker")


def _beat(stack: Stack) -> subprocess.Popen[bytes]:
    return _spawn(
        stack,
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "beat",
            "-l",
            "INFO",
            "-s",
            str(stack.settings.data_dir / "beat-schedule"),
        ],
        "beat",
    )


def _wait(cond: Callable[[], bool], timeout: float, what: str, stack: Stack) -> None:
    wait_until(cond, timeout, what, stack.worker_logs)


def _managed(stack: Stack, **labels: str) -> list[object]:
    """This stack's installation's containers (another test process may have its own)."""
    filters = [
        f"{LABEL_MANAGED}=1",
        f"{LABEL_INSTALL}={stack.settings.install_id}",
        *(f"{k}={v}" for k, v in labels.items()),
    ]
    return docker.from_env().containers.list(all=True, filters={"label": filters})


def _bot_replies(stack: Stack, chat: str) -> list[str]:
    return [m.content for m in get_messages_after(chat, 0, db=stack.db) if m.sender == "bot"]


def _send(stack: Stack, chat: str, text: str) -> int:
    return ingest(
        stack.db, stack.settings, IncomingMessage(chat_jid=chat, sender="u", content=text), signal=stack.signals.group
    ).message.seq


def test_sigkill_mid_run_loses_and_duplicates_nothing(stack: Stack) -> None:
    stack.env.update(FAST)
    # 3 rounds per backend in the suite; the kept trial of 10 or more: ORCHESTRATOR_FAULT_TRIALS=10.
    trials = int(os.environ.get("ORCHESTRATOR_FAULT_TRIALS", "3"))
    ensure_main_group(stack.db)
    _beat(stack)
    worker = _worker(stack)
    killed_mid_run = 0
    for i in range(trials):
        seq = _send(stack, "main@local", f"$ sleep 1 && echo trial-{i}")
        # Kill once the run is under way: its container is up and a tool
        # record is already stored.
        _wait(
            lambda: any(
                r.cursor_to >= seq and r.state == "running" and r.container_id
                for r in list_runs(stack.db, chat_jid="main@local", limit=5)
            ),
            60,
            f"trial {i} to start",
            stack,
        )
        _wait(
            lambda: any(m.sender == "tool_use" for m in get_messages_after("main@local", seq, db=stack.db)),
            30,
            f"trial {i} tool call",
            stack,
        )
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        killed_mid_run += 1
        worker = _worker(stack)
        _wait(
            lambda: any(f"trial-{i}" in r for r in _bot_replies(stack, "main@local")),
            90,
            f"trial {i} to be answered after recovery",
            stack,
        )
    _wait(
        lambda: get_group(stack.db, "main@local").pending_seq <= get_group(stack.db, "main@local").cursor_seq,
        60,
        "no pending work",
        stack,
    )
    _wait(lambda: _managed(stack) == [], 60, "the sweeper to remove orphan containers", stack)
    replies = _bot_replies(stack, "main@local")
    answered = [sum(f"trial-{i}\n" in r for r in replies) for i in range(trials)]
    lost = answered.count(0)
    duplicated = sum(1 for n in answered if n > 1)
    interrupted = [r for r in list_runs(stack.db, chat_jid="main@local", limit=500) if "interrupted" in (r.error or "")]
    print(
        f"FAULTS: sigkill trials={trials} killed_mid_run={killed_mid_run} interrupted_runs={len(interrupted)} "
        f"lost={lost} duplicate_replies={duplicated} orphan_containers={len(_managed(stack))}"
    )
    assert killed_mid_run == trials and len(interrupted) == trials
    assert lost == 0 and duplicated == 0


def test_racing_workers_never_run_two_containers_for_one_group(stack: Stack) -> None:
    stack.env.update(FAST)
    ensure_main_group(stack.db)
    add_group(stack.db, chat_jid="other@local", name="other", folder="other", requires_trigger=False)
    for _ in range(3):
        _worker(stack, concurrency=2)
    seen: dict[str, int] = {}
    peak_total = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak_total
        client = docker.from_env()
        while not stop.is_set():
            running = client.containers.list(
                filters={
                    "label": [f"{LABEL_MANAGED}=1", f"{LABEL_INSTALL}={stack.settings.install_id}"],
                    "status": "running",
                }
            )
            per_group: dict[str, int] = {}
            for c in running:
                g = c.labels.get(LABEL_GROUP, "?")
                per_group[g] = per_group.get(g, 0) + 1
            for g, n in per_group.items():
                seen[g] = max(seen.get(g, 0), n)
            peak_total = max(peak_total, len(running))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(4):
            _send(stack, "main@local", f"$ sleep 1 && echo main-{i}")
            _send(stack, "other@local", f"$ sleep 1 && echo other-{i}")
            for _ in range(5):  # extra, duplicate signals for the same groups
                stack.signals.group("main@local")
                stack.signals.group("other@local")
        for chat in ("main@local", "other@local"):
            _wait(
                lambda: (
                    get_group(stack.db, chat).pending_seq <= get_group(stack.db, chat).cursor_seq
                    and not any(r.state == "running" for r in list_runs(stack.db, chat_jid=chat))
                ),
                120,
                f"{chat} drained",
                stack,
            )
    finally:
        stop.set()
        watcher.join()
    print(f"FAULTS: racing workers=3x2 slots peak_containers_per_group={seen} peak_total={peak_total}")
    assert seen.get("main", 0) == 1 and seen.get("other", 0) == 1
    assert peak_total == 2  # different groups do run in parallel
    for chat, prefix in (("main@local", "main"), ("other@local", "other")):
        replies = _bot_replies(stack, chat)
        for i in range(4):
            assert sum(f"{prefix}-{i}" in r for r in replies) <= 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_redis_outage_during_ingest_loses_nothing(stack: Stack, tmp_path: Path) -> None:
    require_service(
        bool(subprocess.run(["which", "redis-server"], capture_output=True).returncode == 0), "redis-server"
    )
    port = _free_port()
    redis_dir = tmp_path / "redis"
    redis_dir.mkdir()

    def start_redis() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(redis_dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait(lambda: _port_open(port), 10, "redis to listen", stack)
        return proc

    url = f"redis://127.0.0.1:{port}/0"
    stack.env.update(FAST, ORCHESTRATOR_BROKER_URL=url)
    stack.settings = stack.settings.replace(**{"broker_url": url})
    redis_proc = start_redis()
    groups = [f"g{i}@local" for i in range(20)]
    for i, g in enumerate(groups):
        add_group(stack.db, chat_jid=g, name=g, folder=f"g{i}", requires_trigger=False)
    _beat(stack)
    _worker(stack, concurrency=2)
    stored = 0
    try:
        for n in range(200):
            if n == 50:
                redis_proc.terminate()
                redis_proc.wait()
            if n == 150:
                redis_proc = start_redis()
            _send(stack, groups[n % len(groups)], f"message {n}")
            stored += 1
        total = sum(len(get_messages_after(g, 0, db=stack.db)) for g in groups)
        assert total >= 200
        _wait(
            lambda: all(g.pending_seq <= g.cursor_seq for g in list_groups(stack.db) if g.chat_jid in groups),
            240,
            "every group processed after the outage",
            stack,
        )
    finally:
        redis_proc.terminate()
        redis_proc.wait()
    users = sum(1 for g in groups for m in get_messages_after(g, 0, db=stack.db) if m.message_type == "user")
    unanswered = [g for g in groups if not _bot_replies(stack, g)]
    print(
        f"FAULTS: redis outage ingested={stored} stored_user_messages={users} groups={len(groups)} "
        f"unprocessed_groups={len(unanswered)}"
    )
    assert users == 200 and unanswered == []


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False
