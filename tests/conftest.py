"""Shared fixtures.

Services (Docker engine, Redis) are real.  When one is missing, a test that
needs it fails under ``CI=true`` and is skipped (saying why) on a developer
machine without it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.db import Database, forget_databases
from orchestrator.settings import Settings, reset_settings

IN_CI = os.environ.get("CI", "").lower() == "true"
REDIS_URL = os.environ.get("ORCHESTRATOR_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def require_service(ok: bool, what: str) -> None:
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is not available")
    pytest.skip(f"{what} is not available on this developer machine")


def docker_available() -> bool:
    try:
        import docker

        docker.from_env().ping()
        return True
    except Exception:  # noqa: BLE001
        return False


def redis_available(url: str = REDIS_URL) -> bool:
    from urllib.parse import urlparse

    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 6379), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    yield Settings(data_dir=tmp_path / "data", _env_file=None)  # type: ignore[call-arg]


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    settings.ensure_dirs()
    database = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    database.migrate()
    yield database
    database.dispose()


@pytest.fixture(autouse=True)
def _isolated_process_state() -> Iterator[None]:
    yield
    reset_settings()
    forget_databases()
