"""compose.yaml describes the whole fleet and Debian's docker-compose accepts it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.conftest import require_service

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_valid_and_complete() -> None:
    require_service(shutil.which("docker-compose") is not None, "docker-compose (apt-get install docker-compose)")
    res = subprocess.run(["docker-compose", "-f", str(ROOT / "compose.yaml"), "config"],
                         capture_output=True, text=True, timeout=60)
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
    assert "ORCHESTRATOR_API_TOKEN" in services["api"]["environment"]
