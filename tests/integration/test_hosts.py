"""Real ``celery worker`` processes register their host and beat it; ``orchestrator hosts``
sees them alive, ``stopped`` after a SIGTERM, and dead after a SIGKILL once the window passes.

On ``[embedded]`` (SQLite + filesystem://) and ``[fleet]`` (PostgreSQL + Redis), as the
other process tests; no agent container runs here, so the agent image is not needed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator import __version__
from orchestrator.core.settings import Settings
from tests.conftest import (
    REDIS_URL,
    TEST_ENV,
    docker_available,
    fresh_pg_database,
    redis_available,
    require_service,
    wait_until,
)
from tests.integration.conftest import BACKENDS, INTEGRATION_REDIS_DB, Stack, _run_stack


@pytest.fixture(params=BACKENDS)
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    """A data dir, database and broker shared by the worker processes of one test."""
    require_service(docker_available(), "a running Docker engine")  # what a worker counts warm containers on
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")} | TEST_ENV
    data_dir = tmp_path / "data"
    env["ORCHESTRATOR_DATA_DIR"] = str(data_dir)
    with contextlib.ExitStack() as cleanup:
        if request.param == "fleet":
            require_service(redis_available(), f"a Redis server at {REDIS_URL}")
            env["ORCHESTRATOR_DATABASE_URL"] = cleanup.enter_context(fresh_pg_database())
            url = REDIS_URL.rsplit("/", 1)[0] + "/" + INTEGRATION_REDIS_DB
            import redis

            redis.Redis.from_url(url).flushdb()
            env["ORCHESTRATOR_BROKER_URL"] = url
        settings = Settings.load(
            data_dir=data_dir,
            database_url=env.get("ORCHESTRATOR_DATABASE_URL", ""),
            broker_url=env.get("ORCHESTRATOR_BROKER_URL", ""),
            env_file=None,
        )
        yield from _run_stack(request, settings, env)


def _start(fleet: Stack, host_id: str, concurrency: int = 1) -> subprocess.Popen[bytes]:
    fleet.env["ORCHESTRATOR_HOST_ID"] = host_id
    try:
        return fleet.start_worker(concurrency)
    finally:
        del fleet.env["ORCHESTRATOR_HOST_ID"]


def _hosts(fleet: Stack, *args: str) -> dict[str, dict[str, Any]]:
    out = fleet.cli("hosts", "--json", *args, timeout=60)
    assert out.returncode == 0, out.stderr
    return {h["host_id"]: h for h in json.loads(out.stdout)}


def _alive(fleet: Stack, host_id: str) -> bool:
    h = _hosts(fleet).get(host_id)
    return bool(h and h["alive"] and h["state"] == "up")


def test_a_worker_registers_beats_and_stops_its_host(fleet: Stack) -> None:
    worker = _start(fleet, "host-a", concurrency=2)
    wait_until(lambda: _alive(fleet, "host-a"), 90, "host-a registered and alive", fleet.worker_logs)
    a = _hosts(fleet)["host-a"]
    # The worker's main process beats it (the pool children do not): its pid, its concurrency.
    assert (a["pid"], a["concurrency"], a["version"]) == (worker.pid, 2, __version__)
    assert a["stopped_at"] is None and a["heartbeat_age_s"] < 15
    # A few beats later (every 3 s): the beat moved on, still the same process's row.
    wait_until(
        lambda: _hosts(fleet)["host-a"]["heartbeat_at"] != a["heartbeat_at"], 30, "a later heartbeat", fleet.worker_logs
    )
    later = _hosts(fleet)["host-a"]
    assert (later["instance"], later["pid"], later["started_at"]) == (a["instance"], worker.pid, a["started_at"])
    assert later["warm_containers"] == 0  # counted on this host's Docker engine: none of this install's
    # The human listing names it too.
    table = fleet.cli("hosts")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["HOST", "STATE", "ALIVE"]
    assert any(line.split()[:3] == ["host-a", "up", "yes"] for line in table.stdout.splitlines()), table.stdout

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 0, fleet.worker_logs()
    stopped = _hosts(fleet)["host-a"]
    assert (stopped["state"], stopped["alive"]) == ("stopped", False), fleet.worker_logs()
    assert stopped["stopped_at"] is not None


def test_a_killed_worker_is_dead_once_the_window_passes(fleet: Stack) -> None:
    worker = _start(fleet, "host-b")
    wait_until(lambda: _alive(fleet, "host-b"), 90, "host-b registered and alive", fleet.worker_logs)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    killed_at = time.monotonic()
    # Nothing marked it: still 'up', and alive while its last beat is younger than the window.
    b = _hosts(fleet)["host-b"]
    assert b["state"] == "up" and b["alive"] is True
    # With a 2 s window it is dead 2 s after its last beat, by the database's clock.
    wait_until(lambda: not _hosts(fleet, "--window", "2")["host-b"]["alive"], 30, "host-b dead with --window 2")
    assert time.monotonic() - killed_at < 10
    dead = _hosts(fleet, "--window", "2")["host-b"]
    assert dead["state"] == "up" and dead["heartbeat_age_s"] >= 2
    # Its restart (same id, a new process) takes the row at once.
    again = _start(fleet, "host-b")
    wait_until(
        lambda: _hosts(fleet)["host-b"]["pid"] == again.pid and _alive(fleet, "host-b"),
        90,
        "host-b back",
        fleet.worker_logs,
    )
