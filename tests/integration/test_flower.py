"""Flower watches the same broker: it lists the worker and every task."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
import urllib.error
import urllib.request

import psutil
import pytest

from orchestrator.store.groups import ensure_main_group
from tests.conftest import wait_until

from .conftest import BIN, Stack
from .test_up import _free_port


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=2) as r:
        return json.load(r)


@pytest.mark.parametrize("stack", ["embedded", "fleet"], indirect=True)
def test_flower_sees_the_worker_and_its_tasks(stack: Stack) -> None:
    ensure_main_group(stack.db)
    worker = stack.start_worker()
    # Flower asks the workers about themselves when it starts: let the worker be up first.
    wait_until(lambda: " ready." in stack.worker_logs(), 60, "the worker to be ready", stack.worker_logs)
    port = _free_port()
    log = stack.settings.data_dir.parent / "flower.log"
    with open(log, "wb") as fh:
        flower = subprocess.Popen(
            [str(BIN / "orchestrator"), "flower", "--port", str(port)],
            env=stack.env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def workers() -> dict:  # type: ignore[type-arg]
            try:
                return _get(f"{base}/api/workers?refresh=1")  # type: ignore[return-value]
            except OSError:
                return {}

        # Each refresh broadcasts four inspect commands; with the filesystem
        # broker, hammering that at 10 Hz makes kombu read half-written
        # control files, so ask once a second.
        deadline = time.monotonic() + 60
        while not workers():
            assert time.monotonic() < deadline, f"Flower never listed the worker\n{log.read_text()}"
            time.sleep(1.0)
        res = stack.cli("send", "main@local", "$ echo seen-by-flower", "--wait", "60")
        assert res.returncode == 0, res.stderr

        def drain_tasks() -> list[dict]:  # type: ignore[type-arg]
            tasks = _get(f"{base}/api/tasks")
            return [t for t in tasks.values() if t["name"] == "workers.tasks.drain_group"]  # type: ignore[union-attr]

        wait_until(
            lambda: any(t["state"] == "SUCCESS" for t in drain_tasks()),
            30,
            "Flower to show the finished drain task",
            log.read_text,
        )
        task = next(t for t in drain_tasks() if t["state"] == "SUCCESS")
        assert "main@local" in task["args"]
        assert any(name.startswith("test") for name in workers())
    finally:
        flower.send_signal(signal.SIGTERM)
        flower.wait(timeout=20)
        assert worker.poll() is None  # the worker kept running throughout


def _status(url: str, auth: str | None = None) -> int:
    request = urllib.request.Request(url)
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:  # not listening yet
        return 0


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
def test_flower_with_a_login_refuses_whoever_has_none(stack: Stack) -> None:
    """ORCHESTRATOR_FLOWER_BASIC_AUTH puts Flower's page and JSON API behind a login (given
    to it through its environment, not its command line); without one it refuses to
    listen beyond loopback."""
    refused = stack.cli("flower", "--address", "0.0.0.0", "--port", str(_free_port()))
    assert refused.returncode == 1 and "ORCHESTRATOR_FLOWER_BASIC_AUTH" in refused.stderr, refused.stderr
    port = _free_port()
    log = stack.settings.data_dir.parent / "flower-login.log"
    env = {**stack.env, "ORCHESTRATOR_FLOWER_BASIC_AUTH": "ops:s3cret-word"}
    with open(log, "wb") as fh:
        flower = subprocess.Popen(
            [str(BIN / "orchestrator"), "flower", "--port", str(port)],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(
            lambda: _status(f"{base}/healthcheck", "ops:s3cret-word") == 200, 60, "Flower to answer", log.read_text
        )
        assert "s3cret-word" not in " ".join(psutil.Process(flower.pid).cmdline())
        for path in ("/", "/api/workers", "/api/tasks"):
            assert _status(base + path) == 401, path
            assert _status(base + path, "ops:wrong") == 401, path
        assert _status(f"{base}/api/tasks", "ops:s3cret-word") == 200
    finally:
        flower.send_signal(signal.SIGTERM)
        flower.wait(timeout=20)
