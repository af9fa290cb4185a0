"""compose.yaml started for real, as an operator would, on this machine.

There is no registry here and no bridge network: the images are local stand-ins
(``scripts/compose-standins.sh``: PostgreSQL and Redis from Debian's packages on a
debootstrapped root, the service image from the root Dockerfile on the local base
with an offline wheelhouse) and ``deploy/compose.local.yaml`` puts every service
on the host's network, on loopback ports of its own (``scripts/compose-local.sh``
runs docker-compose with both files).  One slow case, end to end: ``up`` with two
workers, a message through the api service answered by an agent container one of
them started, both workers in Flower's API and in ``orchestrator hosts``, the run's
task on one of them, and ``down -v`` leaving no container, volume or network.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.core.settings import Settings
from tests.conftest import docker_available, require_service, wait_until

from .conftest import BIN
from .test_up import _free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "scripts" / "compose-local.sh"


def _compose_available() -> bool:
    if shutil.which("docker-compose"):
        return True
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


def _clean_env() -> dict[str, str]:
    # Nothing of the developer's installation reaches the stack or the CLI.
    return {k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "LOCAL_"))}


@pytest.fixture(scope="session")
def compose_images(agent_image: str) -> Iterator[None]:
    """The stand-in images, built once (CI's .ci/run has made them already: then a few seconds).

    After ``agent_image``: the stack's one-shot ``agent-image`` service then finds the agent
    image current (same runner files, same local base) and builds nothing."""
    require_service(_compose_available(), "docker-compose (apt-get install docker-compose)")
    require_service(docker_available(), "a running Docker engine")
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "compose-standins.sh")],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert res.returncode == 0, f"building the stand-in images failed:\n{res.stderr[-4000:]}"
    yield


def _request(url: str, token: str = "", login: str = "") -> urllib.request.Request:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if login:  # Flower's (user:password)
        headers = {"Authorization": "Basic " + base64.b64encode(login.encode()).decode()}
    return urllib.request.Request(url, headers=headers)


def _get(url: str, token: str = "", *, login: str = "") -> Any:
    with urllib.request.urlopen(_request(url, token, login), timeout=5) as r:
        return json.load(r)


def _status(url: str, login: str = "") -> int:
    try:
        with urllib.request.urlopen(_request(url, login=login), timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _answers(url: str) -> bool:
    try:
        return _get(url) is not None
    except OSError:
        return False


def _docker_ids(kind: str, *filters: str) -> list[str]:
    args = ["docker", kind, "ls", "-q"] + [f"--filter={f}" for f in filters]
    if kind == "container":
        args.insert(3, "-a")
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout.split()


def test_the_local_override_keeps_every_service_on_loopback_of_the_hosts_network() -> None:
    """Fast, no container: a service compose.yaml gains without its entry in the override would
    get compose's default bridge network (never here), its registry image, or the machine's own
    PostgreSQL and Redis."""
    require_service(_compose_available(), "docker-compose (apt-get install docker-compose)")
    res = subprocess.run(
        ["bash", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=_clean_env()
        | {
            "ORCHESTRATOR_API_TOKEN": "t0ken",
            "ORCHESTRATOR_FLOWER_BASIC_AUTH": "ops:pw",
            "LOCAL_DATA_DIR": "/tmp/orch-x",
        },
    )
    assert res.returncode == 0, res.stderr
    config = yaml.safe_load(res.stdout)
    assert not config.get("networks")
    services = config["services"]
    assert {"postgres", "redis", "api", "agent-image", "worker", "deliverer", "beat", "flower"} <= set(services)
    for name, service in services.items():
        assert service.get("network_mode") == "host", name
        assert "ports" not in service, name  # docker-compose 1.29 refuses them on the host's network
        assert service["image"].startswith("orchestrator-standin:"), name
        if name in ("postgres", "redis"):
            continue
        env = service["environment"]
        assert env["ORCHESTRATOR_DATABASE_URL"].endswith("@127.0.0.1:25432/orchestrator"), name
        assert env["ORCHESTRATOR_BROKER_URL"] == "redis://127.0.0.1:26379/0", name
        assert env["ORCHESTRATOR_DATA_DIR"] == "/tmp/orch-x", name
        assert env["ORCHESTRATOR_BASE_IMAGE"] == "orchestrator-base:bookworm-net", name
        # The data dir at the same path inside and out, and nothing made at /srv/orchestrator.
        sources = {str(v).split(":")[0] for v in service.get("volumes", [])}
        assert "/tmp/orch-x" in sources and "/srv/orchestrator" not in sources, name
    assert services["postgres"]["command"][-3:] == ["25432", "-c", "listen_addresses=127.0.0.1"]
    assert services["redis"]["command"][-4:] == ["--bind", "127.0.0.1", "--port", "26379"]
    assert services["api"]["command"] == ["api", "--host", "127.0.0.1", "--port", "28000"]
    # Flower through `orchestrator flower`, with compose.yaml's login.
    flower = services["flower"]
    assert "entrypoint" not in flower and flower["command"][:3] == ["flower", "--address", "127.0.0.1"]
    assert flower["environment"]["ORCHESTRATOR_FLOWER_BASIC_AUTH"] == "ops:pw"
    assert "FLOWER_UNAUTHENTICATED_API" not in flower["environment"]


# The first run on a machine builds the stand-ins in the fixture (a debootstrap, the
# wheels: a few minutes); CI builds them beforehand (.ci/run) and the case takes ~75 s.
@pytest.mark.timeout(900)
def test_the_compose_stack_starts_answers_and_leaves_nothing(compose_images: None, tmp_path: Path) -> None:
    project = f"orchcompose{os.getpid()}"
    data = tmp_path / "data"  # the same path on the host and in the services
    data.mkdir()
    token = secrets.token_hex(16)
    login = f"ops:{secrets.token_hex(8)}"  # Flower's
    ports = {
        "LOCAL_PG_PORT": _free_port(),
        "LOCAL_REDIS_PORT": _free_port(),
        "LOCAL_API_PORT": _free_port(),
        "LOCAL_FLOWER_PORT": _free_port(),
    }
    env_file = tmp_path / "compose.env"
    env_file.write_text(
        "".join(
            f"{k}={v}\n"
            for k, v in {
                "ORCHESTRATOR_API_TOKEN": token,
                "ORCHESTRATOR_FLOWER_BASIC_AUTH": login,
                "ORCHESTRATOR_MODEL": "offline",
                "LOCAL_DATA_DIR": str(data),
                **ports,
            }.items()
        )
    )
    env = _clean_env()
    label = f"label=com.docker.compose.project={project}"

    def compose(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(COMPOSE), "-p", project, "--env-file", str(env_file), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=tmp_path,
        )

    api = f"http://127.0.0.1:{ports['LOCAL_API_PORT']}"
    flower = f"http://127.0.0.1:{ports['LOCAL_FLOWER_PORT']}"
    networks_before = set(_docker_ids("network"))
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        up = compose("up", "-d", "--no-build", "--scale", "worker=2", timeout=300)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        timings["up -d"] = time.monotonic() - t0
        # Every service on the host's network: compose made no network at all.
        assert set(_docker_ids("network")) == networks_before
        wait_until(
            lambda: _answers(f"{api}/health"),
            120,
            "the api service to answer",
            lambda: compose("logs", "--no-color", "--tail", "30", "api").stdout,
        )
        timings["api"] = time.monotonic() - t0
        # Both workers register as hosts of the fleet, each named by its container
        # (the override's replica id; on the host's network they share a hostname).
        workers = {cid[:12] for cid in _docker_ids("container", label, "label=com.docker.compose.service=worker")}
        assert len(workers) == 2

        def live_hosts() -> set[str]:
            try:
                hosts = _get(f"{api}/api/hosts", token)
            except OSError:
                return set()
            return {h["host_id"] for h in hosts if h["alive"] and h["state"] == "up"}

        wait_until(
            lambda: live_hosts() == workers,
            120,
            f"hosts {sorted(workers)} up",
            lambda: f"{live_hosts()}\n" + compose("logs", "--no-color", "--tail", "30", "worker").stdout,
        )
        timings["hosts"] = time.monotonic() - t0

        # ... and as Celery nodes in Flower's API (listed before the message is sent, so
        # Flower is watching the events of the task that runs it).
        nodes = {f"agent@{w}" for w in workers}

        def flower_workers() -> set[str]:
            try:
                return set(_get(f"{flower}/api/workers?refresh=1", login=login))
            except OSError:
                return set()

        seen: set[str] = set()

        def both_seen() -> bool:
            seen.update(flower_workers())
            return nodes <= seen

        wait_until(both_seen, 60, f"Flower to list {sorted(nodes)}", lambda: f"listed: {sorted(seen)}")
        # Behind its login: nothing without it, or with a wrong one (its page neither).
        for path in ("/", "/api/workers", "/api/tasks"):
            assert _status(f"{flower}{path}") == 401, path
            assert _status(f"{flower}{path}", "ops:wrong") == 401, path
        timings["flower"] = time.monotonic() - t0

        # A message through the api service, as `orchestrator send` sends it from anywhere.
        t1 = time.monotonic()
        marker = f"compose-{uuid.uuid4().hex[:8]}"
        cli_env = env | {
            "ORCHESTRATOR_DATA_DIR": str(tmp_path / "cli"),
            "ORCHESTRATOR_API_URL": api,
            "ORCHESTRATOR_API_TOKEN": token,
        }
        sent = subprocess.run(
            [str(BIN / "orchestrator"), "send", "main@local", f"$ echo {marker}", "--wait", "120", "--json"],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert f"via {api}" in sent.stderr  # the api service took it: nothing was stored in process
        replies = [json.loads(line) for line in sent.stdout.splitlines()]
        # The command ran in an agent container a worker started (the offline model's `$ `).
        assert any(r["message_type"] == "tool_result" and r["content"] == f"{marker}\n" for r in replies), replies
        answer = [r for r in replies if r["sender"] == "bot"]
        assert answer and marker in answer[-1]["content"], replies
        timings["answer"] = time.monotonic() - t1

        # `orchestrator hosts` in the api service's container lists both, and Flower
        # shows the run's task done by one of them.
        res = compose("exec", "-T", "api", "orchestrator", "hosts", "--json")
        assert res.returncode == 0, res.stderr
        hosts = json.loads(res.stdout)
        assert {h["host_id"] for h in hosts if h["alive"] and h["state"] == "up"} == workers, hosts

        run = _get(f"{api}/api/runs/{answer[-1]['metadata']['run_id']}", token)
        assert isinstance(run, dict) and run["state"] == "succeeded"
        task: dict[str, Any] = {}

        def task_done() -> bool:
            try:
                task.update(_get(f"{flower}/api/task/info/{run['celery_task_id']}", login=login))
            except OSError:
                return False
            return task.get("state") == "SUCCESS"

        wait_until(task_done, 30, "Flower to show the run's drain task done", lambda: str(task))
        assert task["name"] == "workers.tasks.drain_group" and task["worker"] in nodes, task
    except BaseException:
        print(compose("logs", "--no-color", "--tail", "60").stdout[-20000:])
        raise
    finally:
        t2 = time.monotonic()
        down = compose("down", "-v", "--remove-orphans", timeout=180)
        timings["down"] = time.monotonic() - t2
        print("COMPOSE: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    assert down.returncode == 0, down.stderr[-3000:]
    # Nothing left: no container (services or agents), volume or network of the stack.
    assert _docker_ids("container", label) == []
    assert _docker_ids("volume", label) == []
    assert _docker_ids("network", label) == [] and set(_docker_ids("network")) == networks_before
    # The agent containers carry the installation's id (a hash of its database URL).
    stack = Settings.load(
        data_dir=data,
        env_file=None,
        database_url=(f"postgresql://orchestrator:orchestrator@127.0.0.1:{ports['LOCAL_PG_PORT']}/orchestrator"),
    )
    assert _docker_ids("container", f"label=orchestrator.install={stack.install_id}") == []
