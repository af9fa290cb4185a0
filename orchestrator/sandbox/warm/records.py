"""What a host keeps on its own disk about its warm containers.

All of it is host-only (``data/warm/<folder>/``, mode 0755, never handed to the
container's user, never mounted), so nothing an agent does can touch it:

* a *dirty* marker exists while a run is on a container, from the hand-over until
  the clean-up after it (:mod:`.cleanup`): a container whose marker outlived its run
  (a worker died mid-run) is never handed another;
* a *used* marker's mtime is when a run was last handed to a container: the least
  recently used idle ones go first when the host keeps too many (:mod:`.sizing`);
* ``adopted.json`` names the standby container a group took (:class:`Adoption`);
* one lock file per host (``data/warm/.<host>.lock``) makes this host's worker
  processes claim containers and choose the ones to stop one at a time.

The gateway folder a warm group's model gateway socket is bound in is the host's too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import msgspec

from orchestrator.core.settings import Settings


def gateway_dir(settings: Settings, folder: str) -> Path:
    """Where a warm group's model gateway socket is bound: host-only, mounted read-only."""
    return settings.data_dir / "gateway" / folder


def state_dir(settings: Settings, folder: str) -> Path:
    """Host-only: what the host remembers about a group's warm containers (the
    "a run is in progress" markers)."""
    return settings.data_dir / "warm" / folder


def host_only_dir(path: Path) -> Path:
    """Create ``path`` as the host's own folder (mode 0755, never handed to the
    container's user, never mounted writable)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)
    return path


class Adoption(msgspec.Struct, frozen=True):
    """A standby container taken by a group (``data/warm/<folder>/adopted.json``):
    which container, in which slot, and the warm configuration it serves."""

    container: str
    slot: str
    config: str


class Records:
    """The markers, adoption records and lock of this installation's warm containers on
    this host."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def dirty(self, folder: str, container_id: str) -> Path:
        """Exists while a run is in progress on the warm container ``container_id``."""
        return state_dir(self.settings, folder) / f"{container_id[:12]}.dirty"

    def used(self, folder: str, container_id: str) -> Path:
        """Its mtime is when a run was last handed to warm container ``container_id``."""
        return state_dir(self.settings, folder) / f"{container_id[:12]}.used"

    def mark_in_use(self, folder: str, container_id: str) -> None:
        """A run is on the container from now until WarmRun has cleaned up after it
        (the dirty marker), and it was used now (the LRU order)."""
        host_only_dir(state_dir(self.settings, folder))
        self.dirty(folder, container_id).touch()
        self.used(folder, container_id).touch()

    def last_used(self, folder: str, container_id: str) -> float:
        try:
            return self.used(folder, container_id).stat().st_mtime
        except OSError:
            return 0.0  # never handed a run (a start that failed): the first to go

    def forget_markers(self, folder: str, container_id: str) -> None:
        for marker in (self.dirty, self.used):
            with contextlib.suppress(FileNotFoundError):
                marker(folder, container_id).unlink()

    def _adoption_file(self, folder: str) -> Path:
        return state_dir(self.settings, folder) / "adopted.json"

    def adoption(self, folder: str) -> Adoption | None:
        try:
            return msgspec.json.decode(self._adoption_file(folder).read_bytes(), type=Adoption)
        except (OSError, msgspec.DecodeError):
            return None

    def record_adoption(self, folder: str, record: Adoption) -> None:
        host_only_dir(state_dir(self.settings, folder))
        self._adoption_file(folder).write_bytes(msgspec.json.encode(record))

    def forget_adoption(self, folder: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._adoption_file(folder).unlink()

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """This host's worker processes one at a time: claiming a container for a
        run and choosing the ones to stop never overlap, so a container being
        claimed is never stopped as idle."""
        path = host_only_dir(self.settings.data_dir / "warm") / f".{self.settings.fleet.effective_host_id}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
