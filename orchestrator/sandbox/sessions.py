"""A group's session folder: where an agent that keeps its own transcript keeps it.

``<data>/sessions/<folder>`` is mounted read-write at ``SESSION_MOUNT``
(``/session``) in the group's run containers when the provider keeps a
session of its own (``claude-code``: the CLI's transcripts, resumed by the
session id the host stores on the group).  Like the workspace, the folder is
the agent's: the host never reads what is in it, creates it without
following a link, hands it to the container's user, and only ever removes it
whole (``groups reset``), with a removal that never follows a symlink.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from agent_runner.protocol import SESSION_MOUNT

from orchestrator.core.errors import HostileEntry, MountRefused
from orchestrator.core.settings import Settings
from orchestrator.sandbox.containers import prepare_folder
from orchestrator.sandbox.hostile_fs import make_dirs
from orchestrator.store.groups import validate_folder

# Providers whose container gets the session folder.
SESSION_PROVIDERS = frozenset({"claude-code"})
SESSIONS = "sessions"


def session_dir(settings: Settings, folder: str) -> Path:
    validate_folder(folder)
    return settings.data_dir / SESSIONS / folder


def session_mount(settings: Settings, folder: str, provider: str) -> dict[str, str]:
    """host path -> ``SESSION_MOUNT`` for a provider that keeps a session, made if missing; else {}."""
    if provider not in SESSION_PROVIDERS:
        return {}
    path = session_dir(settings, folder)
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the host's own; below it, nothing is followed
    try:
        make_dirs(settings.data_dir, f"{SESSIONS}/{folder}")
    except HostileEntry as exc:
        raise MountRefused(f"session folder refused: {exc}") from exc
    prepare_folder(path)  # the container's user owns it, as it owns the workspace
    return {str(path): SESSION_MOUNT}


def forget_session(settings: Settings, folder: str) -> bool:
    """Remove the group's session folder (True if there was one)."""
    path = session_dir(settings, folder)
    if not path.exists() and not path.is_symlink():
        return False
    if path.is_symlink():  # not ours: never follow it, just drop the link
        path.unlink()
        return True
    # rmtree works by descriptor here (shutil.rmtree.avoids_symlink_attacks): a
    # link the agent planted inside is removed, never followed.
    assert shutil.rmtree.avoids_symlink_attacks
    shutil.rmtree(path)
    return True
