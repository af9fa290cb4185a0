"""A sandbox never outlives its worker: real workers, real containers, no other worker.

A worker SIGKILLed while its agent runs a silent command used to leave the
container running (the command finished 25 s later and wrote into the shared
workspace, where another host may already run the group).  Now the runner
stops every process and exits once its stream from the worker ends
(``agent_runner/fence.py``), and a worker whose lease can no longer be renewed
(its database away) stops its container itself within ``leases.UNSURE_AFTER_S``:
both well inside the 9 s after which another host takes a dead host's groups.
Each test prints a ``FENCE:`` line (pytest -s).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import docker
import psycopg
import pytest

from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.sandbox.containers import LABEL_GROUP, LABEL_INSTALL, list_containers, name_of
from orchestrator.store.groups import ensure_main_group, get_group
from orchestrator.store.hosts import ALIVE_WINDOW_S
from orchestrator.store.leases import UNSURE_AFTER_S
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from tests.conftest import wait_until

from .conftest import Stack

JID = "main@local"
SLEEP_S = 10  # the silent command; its file must never appear
FENCE_S = 4.0


def _worker(stack: Stack) -> subprocess.Popen[bytes]:
    """A worker in its own session, so that the test can SIGKILL all of it."""
    return stack.start_worker(name="fence", own_session=True)


def _running_containers(stack: Stack, folder: str) -> list[str]:
    # Sparse: a warm container removes itself as it stops, between a listing and an inspect.
    found = list_containers(
        docker.from_env(),
        sparse=True,
        filters={"label": [f"{LABEL_INSTALL}={stack.settings.install_id}", f"{LABEL_GROUP}={folder}"]},
    )
    return [name_of(c) for c in found]


def _start_silent_command(stack: Stack) -> tuple[str, Path]:
    """Send the silent command and wait until it runs; the group's folder and the file it would write."""
    ensure_main_group(stack.db)
    folder = get_group(stack.db, JID).folder
    late = stack.settings.groups_dir / folder / "late.txt"
    seq = ingest(
        stack.db,
        stack.settings,
        IncomingMessage(chat_jid=JID, sender="u", content=f"$ sleep {SLEEP_S}; echo late > late.txt"),
        signal=stack.signals.group,
    ).message.seq

    def started() -> bool:
        running = [r for r in list_runs(stack.db, chat_jid=JID, limit=5) if r.state == "running" and r.container_id]
        return bool(running) and any(m.sender == "tool_use" for m in get_messages_after(JID, seq, db=stack.db))

    wait_until(started, 90, "the silent command to start", stack.worker_logs)
    assert _running_containers(stack, folder), "the run's container is up"
    return folder, late


def _gone_within(stack: Stack, folder: str, t0: float, bound_s: float, what: str) -> float:
    wait_until(lambda: not _running_containers(stack, folder), bound_s, what, stack.worker_logs)
    return time.monotonic() - t0


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_a_sandbox_stops_when_its_worker_is_killed(stack: Stack, warm: bool) -> None:
    stack.env["ORCHESTRATOR_SANDBOX_FENCE_S"] = str(FENCE_S)
    if warm:
        stack.env["ORCHESTRATOR_WARM_IDLE_S"] = "120"
    worker = _worker(stack)
    folder, late = _start_silent_command(stack)
    started = time.monotonic()
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    t0 = time.monotonic()
    # Nobody is left to remove the container: its runner must stop it itself.
    elapsed = _gone_within(stack, folder, t0, ALIVE_WINDOW_S, "the sandbox to stop itself")
    print(
        f"FENCE: {'warm' if warm else 'cold'} sandbox stopped {elapsed:.2f} s after its worker's SIGKILL "
        f"(fence {FENCE_S:g} s, another host may take the group after {ALIVE_WINDOW_S:g} s)"
    )
    time.sleep(max(0.0, SLEEP_S + 2 - (time.monotonic() - started)))
    assert not late.exists(), "the silent command outlived its worker and wrote into the workspace"


@pytest.mark.parametrize("stack", ["fleet"], indirect=True)
def test_a_worker_cut_off_from_its_database_stops_its_sandbox_at_once(stack: Stack) -> None:
    """No output comes to fail its fence: the lease's guard says the lease is lost, and
    the worker kills the container before another host could take the group."""
    worker = _worker(stack)
    folder, late = _start_silent_command(stack)
    started = time.monotonic()
    url = stack.settings.effective_database_url.replace("postgresql+psycopg://", "postgresql://")
    name = url.rsplit("/", 1)[1]
    admin_url = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        try:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            t0 = time.monotonic()
            elapsed = _gone_within(stack, folder, t0, ALIVE_WINDOW_S, "the worker to stop its sandbox")
            print(
                f"FENCE: sandbox stopped {elapsed:.2f} s after its worker lost the database "
                f"(lease guard {UNSURE_AFTER_S:g} s; another host may take the group after {ALIVE_WINDOW_S:g} s)"
            )
            assert worker.poll() is None, "the worker stays up; only its run is given up"
            time.sleep(max(0.0, SLEEP_S + 2 - (time.monotonic() - started)))
            assert not late.exists(), "the silent command outlived its worker's lease"
            assert "was not renewed" in "".join(p.read_text(errors="replace") for p in stack.logs)
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
