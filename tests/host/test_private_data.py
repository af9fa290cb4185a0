"""The data dir is the host user's alone: no other local user reads a chat or spends the API key.

The SQLite file holds every chat, and each run's model gateway socket (0666 on
purpose: the container's uid 1000 connects to it through its bind mount)
spends the API key.  So the data dir, its ``runs/`` and ``sessions/`` are 0700
and the database with its ``-wal`` and ``-shm`` 0600, made so under the usual
umask (022) and tightened at start-up when an older version made them looser.
A container needs none of this: a bind mount reaches its folder without a way
through the host folders above it (the integration tests run every agent
container under pytest's own root-only temp folder).

The other user here is the machine's uid 1000 (the container's uid too), by
``setpriv`` in a child process, as root only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.settings import Settings
from orchestrator.run.attempt import GATEWAY_SOCKET
from orchestrator.sandbox.gateway import GatewayConfig, ModelGateway
from orchestrator.sandbox.warm import gateway_dir, host_only_dir
from orchestrator.store.db import open_database
from orchestrator.store.groups import add_group
from tests.conftest import require_service

OTHER_UID = 1000
# What the other user tries: open each file for reading, connect to each socket.
PROBE = r"""
import errno, json, socket, sys
out = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        if name.startswith("socket"):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
            finally:
                s.close()
        else:
            open(path, "rb").close()
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A folder every user may enter (pytest's own temp root is root's and 0700: nothing under
    it would be reachable by another user whatever the data dir's mode)."""
    path = Path(tempfile.mkdtemp(prefix="orch-private-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _settings(data_dir: Path) -> Settings:
    return Settings.load(data_dir=data_dir, env_file=None, database_url="")


def _write(settings: Settings) -> None:
    """Open the installation as a process does, and write (the WAL and its index appear)."""
    db = open_database(settings)
    add_group(db, chat_jid="private@local", name="Private", folder="private")
    db.engine.dispose()


def test_the_data_dir_and_the_database_are_made_for_this_user_alone(open_root: Path, usual_umask: None) -> None:
    settings = _settings(open_root / "data")
    settings.ensure_dirs()
    db = open_database(settings)
    add_group(db, chat_jid="private@local", name="Private", folder="private")
    database = settings.data_dir / "orchestrator.db"
    with db.engine.connect():  # held open: the -wal and -shm files are there
        assert {p.name: _mode(p) for p in settings.data_dir.glob("orchestrator.db*")} == {
            "orchestrator.db": 0o600,
            "orchestrator.db-wal": 0o600,
            "orchestrator.db-shm": 0o600,
        }
    db.engine.dispose()
    for folder in (settings.data_dir, settings.runs_dir, settings.sessions_dir):
        assert _mode(folder) == 0o700, folder
    assert _mode(database) == 0o600


def test_a_database_in_a_folder_of_its_own_gets_a_private_folder(open_root: Path, usual_umask: None) -> None:
    # ORCHESTRATOR_DATABASE_URL naming a SQLite file elsewhere: a new folder for it is private;
    # an existing one is the operator's and left as it is.
    path = open_root / "db" / "chats.db"
    settings = Settings.load(data_dir=open_root / "data", env_file=None, database_url=f"sqlite:///{path}")
    _write(settings)
    assert _mode(path.parent) == 0o700 and _mode(path) == 0o600
    assert _mode(open_root) == 0o755


def test_modes_an_older_version_left_are_tightened_at_start(open_root: Path, usual_umask: None) -> None:
    data = open_root / "data"
    for folder in (data, data / "runs", data / "sessions", data / "groups"):
        folder.mkdir(mode=0o755)
    # SQLite as an older version left it: 0644 under umask 022, its -wal and -shm too.
    held = sqlite3.connect(data / "orchestrator.db")
    held.execute("PRAGMA journal_mode=WAL")
    held.execute("CREATE TABLE t (x)")
    held.execute("INSERT INTO t VALUES (1)")
    held.commit()
    loose = {p.name: _mode(p) for p in data.glob("orchestrator.db*")}
    assert loose == {"orchestrator.db": 0o644, "orchestrator.db-wal": 0o644, "orchestrator.db-shm": 0o644}
    try:
        settings = _settings(data)
        settings.ensure_dirs()
        db = open_database(settings, migrate=False)
        assert {p.name: _mode(p) for p in data.glob("orchestrator.db*")} == dict.fromkeys(loose, 0o600)
        db.engine.dispose()
    finally:
        held.close()
    for folder in (data, data / "runs", data / "sessions"):
        assert _mode(folder) == 0o700, folder


def _as_other_user(targets: dict[str, Path]) -> dict[str, str]:
    python = shutil.which("python3", path="/usr/bin:/bin")  # the suite's own may be out of its reach
    assert python
    done = subprocess.run(
        [
            "setpriv",
            f"--reuid={OTHER_UID}",
            f"--regid={OTHER_UID}",
            "--clear-groups",
            python,
            "-c",
            PROBE,
            json.dumps({k: str(v) for k, v in targets.items()}),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, str] = json.loads(done.stdout)
    return answer


def test_another_local_user_reads_no_chat_and_reaches_no_gateway(open_root: Path, usual_umask: None) -> None:
    # CI runs as root with util-linux: there, a missing one fails the test (require_service).
    require_service(
        os.geteuid() == 0 and shutil.which("setpriv") is not None,
        "root and setpriv (util-linux), to act as another user",
    )
    settings = _settings(open_root / "data")
    settings.ensure_dirs()
    _write(settings)
    # A cold run's gateway folder and a warm group's, as the pipeline makes them: host-only
    # folders (0755) with the socket (0666) the container's user connects to.
    run_socket = host_only_dir(settings.runs_dir / "run-1") / GATEWAY_SOCKET
    warm_socket = host_only_dir(gateway_dir(settings, "private")) / GATEWAY_SOCKET
    # The same, out in the open: the other user can act at all, and would connect.
    control = open_root / "control.sock"
    readable = open_root / "readable.txt"
    readable.write_text("x")
    with (
        ModelGateway(run_socket, GatewayConfig(base_url="http://127.0.0.1:9", api_key="sk-private")) as gw1,
        ModelGateway(warm_socket, GatewayConfig(base_url="http://127.0.0.1:9", api_key="sk-private")) as gw2,
        socket.socket(socket.AF_UNIX) as listener,
    ):
        listener.bind(str(control))
        os.chmod(control, 0o666)
        listener.listen()
        assert _mode(run_socket) == _mode(warm_socket) == 0o666  # as the container needs them
        answers = _as_other_user(
            {
                "database": settings.data_dir / "orchestrator.db",
                "control file": readable,
                "socket of a run": run_socket,
                "socket of a warm group": warm_socket,
                "socket control": control,
            }
        )
        assert gw1 and gw2
    assert answers == {
        "database": "EACCES",
        "control file": "ok",
        "socket of a run": "EACCES",
        "socket of a warm group": "EACCES",
        "socket control": "ok",
    }, answers
