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
import uuid
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from orchestrator.core.errors import DataDirNotShared
from orchestrator.core.settings import Settings
from orchestrator.store.db import Database
from orchestrator.store.tables import InstallationRow

MARKER_FILE = ".orchestrator-installation"
_MARKER_KEY = "data_dir_marker"


def prove_data_dir(db: Database, settings: Settings) -> str:
    """Check (or, on first start, set) the data dir marker; return it.

    Raises :class:`DataDirNotShared` naming the data dir and what to do.
    """
    path = settings.data_dir / MARKER_FILE
    known = _stored(db)
    on_disk = _read(path)
    if known is None:
        # First start of this database (or of a database from before markers):
        # the data dir beside it is the installation's.  The file is written
        # before the row, so whoever later finds the row also finds the file
        # (a worker that read the row first and the file second would refuse
        # to start while the first worker is between the two writes).  Two
        # first starts at once: one creates the file, the other reads it; one
        # insert wins.  A marker already on disk (a database recreated beside
        # its files) is kept.
        on_disk = on_disk or _create(path, uuid.uuid4().hex)
        try:
            with db.write() as session:
                session.add(InstallationRow(key=_MARKER_KEY, value=on_disk))
        except IntegrityError:
            pass
        known = _stored(db)
        assert known is not None
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


def _create(path: Path, marker: str) -> str:
    """Create the marker file unless another process just did; return what it holds.

    Written whole under a private name and linked into place: ``link`` fails
    when the name exists, so a racing process never reads a half-written file
    and never replaces the winner's marker.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{MARKER_FILE}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(marker + "\n", encoding="utf-8")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    found = _read(path)
    if found is None:  # an empty file left by someone else: ours is as good
        tmp.write_text(marker + "\n", encoding="utf-8")
        tmp.replace(path)
        return marker
    return found
