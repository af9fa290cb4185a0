"""Fast recovery with real worker processes: a worker SIGKILLed mid-run on a host
is replaced long before its group's lease (60 s) would expire, and the message it
was answering is answered exactly once.

No beat runs here: what brings the group back is the workers' own recovery watch
(``orchestrator/run/recovery.py``), the lease taken over from a process that no
longer runs on this host (``store/leases.py``), and the dead run closed by its
new holder before the next run (``sweeper.recover_group``).  Each test prints a
``RECOVERY:`` line (pytest -s).  The figures against the target are
``bench/recovery.py``'s (docs/performance.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import docker
import psutil

from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import LABEL_MANAGED, LABEL_RUN
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.hosts import owner_pid
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import Run, list_runs
from tests.conftest import wait_until

from .conftest import Stack

JID = "main@local"
LEASE_TTL_S = 60.0  # the default, on purpose: recovery must not wait for it


def _worker(stack: Stack) -> subprocess.Popen[bytes]:
    """A worker in its own session, so that the test can SIGKILL all of it."""
    return stack.start_worker(name="recovery", own_session=True)


def _send(stack: Stack, text: str) -> int:
    return ingest(
        stack.db, stack.settings, IncomingMessage(chat_jid=JID, sender="u", content=text), signal=stack.signals.group
    ).message.seq


def _answers(stack: Stack, marker: str) -> int:
    return sum(marker in m.content for m in get_messages_after(JID, 0, db=stack.db) if m.sender == "bot")


def _running(stack: Stack, seq: int) -> Run:
    """The run answering ``seq`` once its container is up and its command started."""
    found: list[Run] = []

    def started() -> bool:
        found[:] = [
            r
            for r in list_runs(stack.db, chat_jid=JID, limit=5)
            if r.cursor_to >= seq and r.state == "running" and r.container_id
        ]
        return bool(found) and any(m.sender == "tool_use" for m in get_messages_after(JID, seq, db=stack.db))

    wait_until(started, 90, "the run to start its command", stack.worker_logs)
    return found[0]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _containers_of(run_id: str) -> list[object]:
    return docker.from_env().containers.list(
        all=True, filters={"label": [f"{LABEL_MANAGED}=1", f"{LABEL_RUN}={run_id}"]}
    )


def _check_closed_once(stack: Stack, dead: Run, marker: str) -> None:
    runs = list_runs(stack.db, chat_jid=JID, limit=20)
    old = next(r for r in runs if r.id == dead.id)
    assert old.state == "failed" and "interrupted before any output" in (old.error or "")
    assert [r.state for r in runs if r.id != dead.id] == ["succeeded"]
    assert _answers(stack, marker) == 1
    assert _containers_of(dead.id) == []  # removed by its group's new holder, before the new run


def test_a_new_worker_of_the_same_host_takes_a_killed_workers_group_at_once(stack: Stack) -> None:
    stack.env["ORCHESTRATOR_HOST_ID"] = "recovery-host"
    ensure_main_group(stack.db)
    first = _worker(stack)
    marker = "answered-once"
    seq = _send(stack, f"$ sleep 3 && echo {marker}")
    dead = _running(stack, seq)
    _kill(first)
    t0 = time.monotonic()
    _worker(stack)  # same ORCHESTRATOR_HOST_ID: it may judge the dead pid
    wait_until(
        lambda: _answers(stack, marker) >= 1, LEASE_TTL_S - 5, "the answer from the new worker", stack.worker_logs
    )
    elapsed = time.monotonic() - t0
    time.sleep(2)  # nothing more comes
    print(
        f"RECOVERY: new worker, same host id: answer stored {elapsed:.1f} s after the SIGKILL "
        f"(lease TTL {LEASE_TTL_S:.0f} s, a 3 s command and the worker's start-up included)"
    )
    _check_closed_once(stack, dead, marker)
    assert elapsed < LEASE_TTL_S / 2
    logs = stack.worker_logs()
    assert "took over the lease of main@local" in logs and "no longer runs on this host" in logs


def test_the_other_worker_of_the_host_takes_a_killed_workers_group_at_once(stack: Stack) -> None:
    stack.env["ORCHESTRATOR_HOST_ID"] = "recovery-host"
    ensure_main_group(stack.db)
    workers = [_worker(stack), _worker(stack)]
    wait_until(
        lambda: all(Path(p).exists() and "ready" in Path(p).read_text(errors="replace") for p in stack.logs),
        60,
        "both workers ready",
        stack.worker_logs,
    )
    marker = "answered-by-the-survivor"
    seq = _send(stack, f"$ sleep 3 && echo {marker}")
    dead = _running(stack, seq)
    pid = owner_pid(dead.owner)
    [victim] = [w for w in workers if pid in {c.pid for c in psutil.Process(w.pid).children(recursive=True)}]
    _kill(victim)
    t0 = time.monotonic()
    wait_until(
        lambda: _answers(stack, marker) >= 1, LEASE_TTL_S - 5, "the answer from the other worker", stack.worker_logs
    )
    elapsed = time.monotonic() - t0
    time.sleep(2)
    print(
        f"RECOVERY: other live worker, same host id: answer stored {elapsed:.1f} s after the SIGKILL "
        f"(lease TTL {LEASE_TTL_S:.0f} s, a 3 s command included)"
    )
    _check_closed_once(stack, dead, marker)
    assert elapsed < LEASE_TTL_S / 3
