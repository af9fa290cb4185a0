"""Proof that a process sees this installation's data dir.

A fleet keeps one data dir on shared storage (NFS, EFS, CephFS, a Kubernetes
ReadWriteMany volume): group workspaces and sessions live there, and a group
whose runs land on two hosts must find the same files on both.  A worker
whose ``ORCHESTRATOR_DATA_DIR`` is a local folder would silently split a
group's state, so before it takes any work it proves it sees the shared one:
the first process to start writes a random marker into the database and into
``<data dir>/.orchestrator-installation``; every later worker checks that the
file holds what the database says, and refuses to start otherwise.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from orchestrator.core.errors import ConfigError
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.tables import InstallationRow

MARKER_FILE = ".orchestrator-installation"
_MARKER_KEY = "data_dir_marker"


class DataDirNotShared(ConfigError):
    """This process's data dir is not the installation's (the marker is missing or another's)."""


def prove_data_dir(db: Database, settings: Settings) -> str:
    """Check (or, on first start, set) the data dir marker; return it.

    Raises :class:`DataDirNotShared` naming the data dir and what to do.
    """
    path = settings.data_dir / MARKER_FILE
    on_disk = _read(path)
    known = _stored(db)
    if known is None:
        # First start of this database (or of a database from before markers):
        # the data dir beside it is the installation's.  It keeps a marker it
        # already has (a database recreated beside its files).  Two first
        # starts at once: one insert wins and its process writes the file.
        mine = on_disk or uuid.uuid4().hex
        try:
            with db.write() as session:
                session.add(InstallationRow(key=_MARKER_KEY, value=mine))
        except IntegrityError:
            pass
        known = _stored(db)
        assert known is not None
        if known == mine and on_disk is None:
            _write(path, known)
        deadline = time.monotonic() + 5
        while (on_disk := _read(path)) is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the winner of the race is writing it
    # Never written here when the database already had a marker: a worker
    # with an empty local data dir must not make it look like the shared one.
    if on_disk != known:
        raise DataDirNotShared(
            f"the data dir {settings.data_dir} is not this installation's: {path} "
            + ("is missing" if on_disk is None else "names another installation")
            + ". Every worker of a fleet must see the same data dir (group workspaces and sessions live "
            "there): mount the installation's shared data dir (NFS, EFS, CephFS, a ReadWriteMany volume) "
            "at ORCHESTRATOR_DATA_DIR on this host, or point ORCHESTRATOR_DATABASE_URL at this data dir's "
            "own database."
        )
    return known


def _stored(db: Database) -> str | None:
    with db.read() as session:
        return session.scalar(select(InstallationRow.value).where(InstallationRow.key == _MARKER_KEY))


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _write(path: Path, marker: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{MARKER_FILE}.{os.getpid()}.tmp")
    tmp.write_text(marker + "\n", encoding="utf-8")
    tmp.replace(path)
