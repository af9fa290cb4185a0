"""``orchestrator up``: run the worker and the API server together on one
machine, in the foreground, restarting a child that dies and stopping all of
them on Ctrl-C or SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff: float = field(default=1.0)
    # Variables this child has besides the supervisor's environment.
    env: dict[str, str] = field(default_factory=dict)

    def start(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(self.argv, env={**env, **self.env})
        self.started_at = time.monotonic()
        log.info("started %s (pid %d)", self.name, self.proc.pid)


class Supervisor:
    def __init__(self, children: list[Child], env: dict[str, str] | None = None) -> None:
        self.children = children
        self.env = env or dict(os.environ)
        self._stopping = False

    def _stop(self, *_: object) -> None:
        self._stopping = True

    def run(self) -> int:
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGTERM, self._stop)
        for child in self.children:
            child.start(self.env)
        try:
            while not self._stopping:
                time.sleep(0.5)
                for child in self.children:
                    assert child.proc is not None
                    code = child.proc.poll()
                    if code is None or self._stopping:
                        continue
                    # A child that ran a while got a fresh backoff; one that
                    # dies at once waits longer each time (up to 30 s).
                    if time.monotonic() - child.started_at > 60:
                        child.backoff = 1.0
                    log.warning("%s exited with %s; restarting in %.0fs", child.name, code, child.backoff)
                    time.sleep(child.backoff)
                    child.backoff = min(child.backoff * 2, 30.0)
                    child.start(self.env)
        finally:
            self.shutdown()
        return 0

    def shutdown(self, grace_s: float = 20.0) -> None:
        for child in self.children:
            if child.proc and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time; killing it", child.name)
                child.proc.kill()
                child.proc.wait()


# The queues a worker can consume (orchestrator/run/queue.py routes the tasks):
# agent runs, and deliveries with the sweeper and the schedules.
QUEUES = ("agent", "delivery")


def worker_argv(
    concurrency: int, loglevel: str = "INFO", *, queues: tuple[str, ...] = QUEUES, name: str | None = None
) -> list[str]:
    """A Celery worker consuming ``queues``; ``name`` its node name (two on one host need two)."""
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown or not queues:
        raise ValueError(f"queues must be some of {', '.join(QUEUES)}, not {', '.join(unknown) or 'none'}")
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.app",
        "worker",
        "-Q",
        ",".join(queues),
        "--concurrency",
        str(concurrency),
        "-l",
        loglevel,
        "-E",
        "--without-gossip",
        "--without-mingle",
    ]
    return argv + ["-n", name] if name else argv


def beat_argv(schedule_file: str, loglevel: str = "INFO") -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "workers.app", "beat", "-s", schedule_file, "-l", loglevel]


def api_argv(host: str, port: int, log_config: Path | None = None) -> list[str]:
    """uvicorn serving the API; ``log_config``: a ``logging.config`` JSON file for its
    lines and the app's (``orchestrator.core.logs.write_dict_config``)."""
    # Open event streams end themselves on shutdown (orchestrator/http/stream.py);
    # the graceful timeout is the backstop for any other slow response.
    # httptools' parser and uvloop's event loop (both dependencies) rather than uvicorn's
    # pure-Python h11 on asyncio's loop: named here so that a missing one fails at start
    # instead of silently costing ~2x per request (docs/performance.md, "The HTTP path").
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "orchestrator.http.api:serve_app",
        "--host",
        host,
        "--port",
        str(port),
        "--timeout-graceful-shutdown",
        "3",
        "--http",
        "httptools",
        "--loop",
        "uvloop",
    ]
    return argv + ["--log-config", str(log_config)] if log_config is not None else argv
