"""compose.yaml describes the whole fleet and Debian's docker-compose accepts it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_service

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid_and_complete() -> None:
    require_service(shutil.which("docker-compose") is not None, "docker-compose (apt-get install docker-compose)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCHESTRATOR_", "DOCKER_HOST"))}
    # Without a token compose stops before anything starts, saying what to set.
    refused = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert refused.returncode != 0 and "set ORCHESTRATOR_API_TOKEN" in refused.stderr, refused.stderr
    # Nor without Flower's login: it listens on 0.0.0.0 in its container, and shows every task.
    refused = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env | {"ORCHESTRATOR_API_TOKEN": "t0ken"},
    )
    assert refused.returncode != 0 and "set ORCHESTRATOR_FLOWER_BASIC_AUTH" in refused.stderr, refused.stderr
    res = subprocess.run(
        ["docker-compose", "-f", str(ROOT / "compose.yaml"), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env | {"ORCHESTRATOR_API_TOKEN": "t0ken", "ORCHESTRATOR_FLOWER_BASIC_AUTH": "ops:l0gin"},
    )
    assert res.returncode == 0, res.stderr
    config = yaml.safe_load(res.stdout)
    services = config["services"]
    assert {"postgres", "redis", "api", "worker", "deliverer", "beat", "flower"} <= set(services)
    # Runs and deliveries in separate workers: a reply never waits for an agent slot.
    assert services["worker"]["command"][:3] == ["worker", "--queues", "agent"]
    assert services["deliverer"]["command"][:3] == ["worker", "--queues", "delivery"]
    worker = services["worker"]
    assert any("/var/run/docker.sock" in str(v) for v in worker["volumes"])
    assert "ports" not in worker  # scalable: --scale worker=N must not clash on ports
    env = worker["environment"]
    assert env["ORCHESTRATOR_DATABASE_URL"].startswith("postgresql://")
    assert env["ORCHESTRATOR_BROKER_URL"].startswith("redis://")
    # The api service binds 0.0.0.0 in its container: it starts only with a token.
    assert services["api"]["environment"]["ORCHESTRATOR_API_TOKEN"] == "t0ken"
    # First start: the agent image is built by a one-shot service the workers wait for,
    # a main group is made, and every model setting reaches every service.
    image = services["agent-image"]
    assert image["command"] == ["image", "build"] and image["restart"] == "no"
    assert any("/var/run/docker.sock" in str(v) for v in image["volumes"])
    for name in ("worker", "deliverer"):
        assert services[name]["depends_on"]["agent-image"]["condition"] == "service_completed_successfully"
    for name in ("api", "worker", "deliverer", "beat", "flower", "agent-image"):
        env_of = services[name]["environment"]
        assert env_of["ORCHESTRATOR_MAIN_GROUP"] == "main@local"
        assert {
            "ORCHESTRATOR_MODEL",
            "ORCHESTRATOR_ANTHROPIC_API_KEY",
            "ORCHESTRATOR_ANTHROPIC_BASE_URL",
            "ORCHESTRATOR_OPENAI_BASE_URL",
            "ORCHESTRATOR_OPENAI_API_KEY",
            "ORCHESTRATOR_MAX_TOKENS",
            "ORCHESTRATOR_RUN_TOKEN_BUDGET",
        } <= set(env_of), name
    # Each worker's /metrics inside the compose network, never published.
    for name in ("worker", "deliverer"):
        assert services[name]["environment"]["ORCHESTRATOR_METRICS_PORT"] == "9108"
        assert "ports" not in services[name] and "9108" in services[name]["expose"]
    # The Docker socket (root on the host) only where containers are started or removed.
    for name in ("api", "beat", "flower"):
        assert not any("docker.sock" in str(v) for v in services[name].get("volumes", [])), name
    # Flower behind its login: started by `orchestrator flower` (the image's entrypoint), which
    # hands the login to Flower through its environment and refuses 0.0.0.0 without one; never
    # celery's own command, nor its unauthenticated API; the login is Flower's alone.
    flower = services["flower"]
    assert "entrypoint" not in flower and flower["command"][:1] == ["flower"], flower
    assert flower["command"][flower["command"].index("--address") + 1] == "0.0.0.0"
    assert flower["environment"]["ORCHESTRATOR_FLOWER_BASIC_AUTH"] == "ops:l0gin"
    assert "FLOWER_UNAUTHENTICATED_API" not in flower["environment"]
    assert "l0gin" not in " ".join(flower["command"])
    for name in set(services) - {"flower"}:
        assert "ORCHESTRATOR_FLOWER_BASIC_AUTH" not in services[name].get("environment", {}), name
