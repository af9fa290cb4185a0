"""Integration fixtures: the agent image, and real Celery worker processes on
one of two backends:

* ``embedded``: SQLite under the test's data dir + the filesystem:// broker;
* ``fleet``: a fresh PostgreSQL database (dropped afterwards) + Redis db 15
  (flushed first; ``ORCHESTRATOR_TEST_REDIS_DB`` names another).

Two integration processes may run at once (``scripts/test.sh``): they share
the files between them (``tests/file_claims.py``), each with a Redis database
of its own, and every test counts only its own installation's containers (the
``orchestrator.install`` label).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.cli.supervisor import QUEUES, worker_argv
from orchestrator.core.settings import Settings
from orchestrator.run.queue import Signals, make_celery
from orchestrator.store.db import Database
from tests.conftest import (
    REDIS_URL,
    TEST_ENV,
    docker_available,
    fresh_pg_database,
    redis_available,
    require_service,
)

BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def agent_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The agent image, built (offline) if it is missing or stale."""
    require_service(docker_available(), "a running Docker engine")
    from orchestrator.sandbox.containers import docker_client
    from orchestrator.sandbox.image import ensure_agent_image

    settings = Settings.load(data_dir=tmp_path_factory.mktemp("imagebuild"), env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    return settings.sandbox.agent_image


@pytest.fixture(scope="session")
def claude_code_image(agent_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The agent image's claude-code variant (.ci/run builds it; built here if missing or stale)."""
    from orchestrator.sandbox.containers import docker_client
    from orchestrator.sandbox.image import ensure_agent_image, image_name

    settings = Settings.load(data_dir=tmp_path_factory.mktemp("imagebuild"), agent_image=agent_image, env_file=None)
    ensure_agent_image(docker_client(settings), settings, variant="claude-code")
    return image_name(settings, "claude-code")


FAULTY_DIR = Path(__file__).parent / "faulty_agent"


@pytest.fixture(scope="session")
def faulty_image(agent_image: str) -> str:
    """The agent image behind a front end that misbehaves on request (``faulty_agent/fault.py``)."""
    import docker

    tag = "orchestrator-agent-faulty:test"
    docker.from_env().images.build(
        path=str(FAULTY_DIR), tag=tag, rm=True, network_mode="none", buildargs={"AGENT_IMAGE": agent_image}
    )
    return tag


BACKENDS = ["embedded", "fleet"]


@dataclass
class Stack:
    """A data dir, a database, a broker and the environment every process of one test shares."""

    settings: Settings
    env: dict[str, str]
    db: Database
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    @property
    def signals(self) -> Signals:
        """Signals through this stack's broker (made again when a test points the stack at another)."""
        url = self.settings.effective_broker_url
        made = self.__dict__.get("_signals")
        if made is None or made[0] != url:
            settings = self.settings
            made = self.__dict__["_signals"] = (url, Signals(lambda: make_celery(settings)))
        return made[1]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "orchestrator"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.settings.data_dir.parent,
        )

    def start_worker(
        self, concurrency: int = 1, queues: tuple[str, ...] = QUEUES, *, name: str = "test", own_session: bool = False
    ) -> subprocess.Popen[bytes]:
        """A worker as `orchestrator worker` starts it, consuming ``queues``; ``own_session``: in a
        session of its own, so that a test can SIGKILL all of it (``os.killpg``)."""
        log = self.settings.data_dir.parent / f"worker-{len(self.procs)}.log"
        argv = worker_argv(concurrency, queues=queues, name=f"{name}{len(self.procs)}@%h")
        with open(log, "wb") as fh:
            proc = subprocess.Popen(
                argv,
                env=self.env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                cwd=self.settings.data_dir.parent,
                start_new_session=own_session,
            )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def worker_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-6000:] for p in self.logs if p.exists())


@pytest.fixture(params=BACKENDS)
def stack(request: pytest.FixtureRequest, tmp_path: Path, agent_image: str) -> Iterator[Stack]:
    backend = request.param
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")} | TEST_ENV
    data_dir = tmp_path / "data"
    env["ORCHESTRATOR_DATA_DIR"] = str(data_dir)
    env["ORCHESTRATOR_AGENT_IMAGE"] = agent_image
    with contextlib.ExitStack() as cleanup:
        if backend == "fleet":
            require_service(redis_available(), f"a Redis server at {REDIS_URL}")
            env["ORCHESTRATOR_DATABASE_URL"] = cleanup.enter_context(fresh_pg_database())
            url = REDIS_URL.rsplit("/", 1)[0] + "/" + INTEGRATION_REDIS_DB
            import redis

            redis.Redis.from_url(url).flushdb()
            env["ORCHESTRATOR_BROKER_URL"] = url
        settings = Settings.load(
            data_dir=data_dir,
            agent_image=agent_image,
            database_url=env.get("ORCHESTRATOR_DATABASE_URL", ""),
            broker_url=env.get("ORCHESTRATOR_BROKER_URL", ""),
            env_file=None,
        )
        yield from _run_stack(request, settings, env)


def _run_stack(request: pytest.FixtureRequest, settings: Settings, env: dict[str, str]) -> Iterator[Stack]:
    data_dir = settings.data_dir
    settings.ensure_dirs()
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    st = Stack(settings, env, db, [], [])
    yield st
    for proc in st.procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in st.procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(st.worker_logs())
    _remove_containers_of(settings)
    db.dispose()
    shutil.rmtree(data_dir / "groups", ignore_errors=True)


def _remove_containers_of(settings: Settings) -> None:
    """What the stack's installation leaves on the engine: a test that kills its worker
    leaves the fenced run's container exited, and no later worker of it comes to remove it."""
    import docker

    from orchestrator.sandbox.containers import LABEL_INSTALL

    with contextlib.suppress(docker.errors.DockerException):
        client = docker.from_env()
        for c in client.containers.list(all=True, filters={"label": [f"{LABEL_INSTALL}={settings.install_id}"]}):
            with contextlib.suppress(docker.errors.NotFound):
                c.remove(force=True)


# Each integration process's own Redis database (flushed by its fleet stacks).
INTEGRATION_REDIS_DB = os.environ.get("ORCHESTRATOR_TEST_REDIS_DB", "15")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


Factory = Callable[..., Stack]
