"""A group's session folder: where an agent that keeps its own transcript keeps it.

``<data>/sessions/<folder>`` is mounted read-write at ``SESSION_MOUNT``
(``/session``) in the group's run containers when the provider keeps a
session of its own (``keeps_session`` in its row of ``sandbox/providers.py``;
``claude-code``: the CLI's transcripts, resumed by the session id the host
stores on the group).  Like the workspace, the folder is
the agent's: the host never reads what is in it, creates it without
following a link, hands it to the container's user, and only ever removes it
whole (``groups reset``), with a removal that never follows a symlink.

It lives on the data dir's filesystem, beside the database and the broker,
so it is bounded as the workspace is (``ORCHESTRATOR_SESSION_QUOTA``, the
workspace's mode): a loop-mounted volume of its own,
``<data>/volumes/session.<folder>.img`` (``fallocate -l 500G /session/x``
is ENOSPC inside the sandbox), or a usage check before each run.  The
folder is handed to the container's user once, when its top is not the
user's yet: everything below it was made by the container's user (the host
writes nothing there), so a walk on every attempt would only let the agent
make each run slower.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import docker

from agent_runner.protocol import SESSION_MOUNT
from orchestrator.core.errors import HostileEntry, MountRefused
from orchestrator.core.private_dirs import private_dir
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import parse_quota
from orchestrator.sandbox.containers import CONTAINER_UID, docker_client, prepare_folder
from orchestrator.sandbox.hostile_fs import make_dirs
from orchestrator.sandbox.providers import facts_of
from orchestrator.sandbox.quota import Volume, group_volumes, prepare_workspace
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store.db import Database
from orchestrator.store.groups import clear_session, get_group, validate_folder

SESSIONS = "sessions"
# ORCHESTRATOR_SESSION_QUOTA=auto: transcripts are text; a long-lived group's fit many times over.
AUTO_SESSION_QUOTA_BYTES = 512 * 1024**2


def session_dir(settings: Settings, folder: str) -> Path:
    validate_folder(folder)
    return settings.sessions_dir / folder


def session_quota_bytes(settings: Settings) -> int:
    """What one group's session folder may take (0: no quota)."""
    if settings.sandbox.session_quota == "auto":
        return AUTO_SESSION_QUOTA_BYTES
    return parse_quota(settings.sandbox.session_quota)


def session_volume(settings: Settings, folder: str) -> Volume:
    """The volume that bounds the group's session folder (its image exists once made)."""
    validate_folder(folder)
    return group_volumes(settings, folder)[1]


def keeps_session(provider: str) -> bool:
    """Whether ``provider``'s containers get the group's session folder."""
    facts = facts_of(provider)
    return facts is not None and facts.keeps_session


def session_mount(settings: Settings, folder: str, provider: str) -> dict[str, str]:
    """host path -> ``SESSION_MOUNT`` for a provider that keeps a session, made if missing; else {}."""
    if not keeps_session(provider):
        return {}
    path = session_dir(settings, folder)
    # The host's own, and no other user's (the container reaches its folder through the
    # bind mount alone); below sessions/, nothing is followed.
    private_dir(settings.data_dir)
    private_dir(settings.sessions_dir)
    try:
        make_dirs(settings.data_dir, f"{SESSIONS}/{folder}")
    except HostileEntry as exc:
        raise MountRefused(f"session folder refused: {exc}") from exc
    quota = session_quota_bytes(settings)
    fix = (
        f"free space in {path} on the host (orchestrator groups reset forgets the session), "
        "or raise ORCHESTRATOR_SESSION_QUOTA"
    )
    # Before the hand-over: a new volume's root takes the folder's owner and mode.
    prepare_workspace(
        settings, folder, path, quota, volume=session_volume(settings, folder), what="session folder", fix=fix
    )
    if os.lstat(path).st_uid != CONTAINER_UID:
        prepare_folder(path)  # the container's user owns it, as it owns the workspace
    return {str(path): SESSION_MOUNT}


def forget_session(settings: Settings, folder: str) -> bool:
    """Remove the group's session folder (True if there was one)."""
    path = session_dir(settings, folder)
    vol = session_volume(settings, folder)
    had_volume = vol.image.exists()
    if had_volume:
        # The transcripts are in the image: unmount it, then the image goes with them.
        vol.unmount()
        for leftover in (vol.image, vol.lock):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
    if not path.exists() and not path.is_symlink():
        return had_volume
    if path.is_symlink():  # not ours: never follow it, just drop the link
        path.unlink()
        return True
    # rmtree works by descriptor here (shutil.rmtree.avoids_symlink_attacks): a
    # link the agent planted inside is removed, never followed.
    assert shutil.rmtree.avoids_symlink_attacks
    shutil.rmtree(path)
    return True


def reset_session(db: Database, settings: Settings, chat_jid: str, client: docker.DockerClient | None = None) -> int:
    """Start the group afresh: forget its model session, stop its warm container.

    Returns how many containers were stopped.
    """
    group = get_group(db, chat_jid)
    clear_session(db, chat_jid)
    stopped = WarmPool(settings, client or docker_client(settings)).stop(group.folder)
    forget_session(settings, group.folder)  # after the stop: no container writes into it any more
    return stopped
