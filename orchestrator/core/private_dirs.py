"""Folders no other user of the machine may enter: the data dir, the runs' folders, the
agents' sessions, the file store, the link key's folder."""

from __future__ import annotations

import os
from pathlib import Path

# The data dir holds every chat (the SQLite database), the runs' model gateway sockets (each
# spends the API key; 0666, for the container's uid 1000) and the agents' sessions: no other
# user of the machine may enter it.  A container reaches its own folders through its bind
# mounts, which need no way through the host folders above them.
PRIVATE_DIR_MODE = 0o700


def private_dir(path: Path) -> Path:
    """Make ``path`` (its missing parents as usual) with mode 0700; if it exists and is this
    user's, take group and other access away (a folder made before, under a looser umask)."""
    path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, PRIVATE_DIR_MODE)
    return path
