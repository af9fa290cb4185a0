"""What the workspace quota tests share: loop-mounted volumes cleaned up
whatever happens (per test, and once more at the end of the session), and
the check that the host can make them at all."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.core.settings import Settings
from orchestrator.sandbox import quota
from orchestrator.sandbox.late_mounts import mount_entries
from tests.conftest import require_service


def require_volumes() -> None:
    """Volume tests need root, loop devices and e2fsprogs (CI has them: they fail there without)."""
    problem = quota.volume_problem()
    require_service(problem is None, f"loop-mounted volumes ({problem})")


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below ``base`` in this mount namespace, deepest first."""
    root = str(base.resolve())
    points = {e.mount_point for e in mount_entries() if e.mount_point == root or e.mount_point.startswith(root + "/")}
    return sorted(points, key=lambda p: p.count("/"), reverse=True)


def loops_under(base: Path) -> list[str]:
    """Loop devices whose backing file lies below ``base``."""
    root = str(base.resolve()) + "/"
    out = []
    for dev in sorted(Path("/sys/block").glob("loop*")):
        backing = quota.loop_backing_file(dev.name)
        if backing and backing.startswith(root):
            out.append(f"/dev/{dev.name}")
    return out


def release_everything(base: Path) -> tuple[list[str], list[str]]:
    """Unmount whatever is mounted below ``base`` and detach its loop devices; returns what was left."""
    mounts = mounts_under(base)
    for point in mounts:
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)
    # An unmounted loop device is detached by the kernel a moment later (autoclear).
    deadline = time.monotonic() + 5
    while (loops := loops_under(base)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for dev in loops:
        subprocess.run(["losetup", "-d", dev], capture_output=True)
    return mounts, loops


@pytest.fixture(scope="session", autouse=True)
def _no_volume_left_mounted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session's safety net: nothing of ours stays mounted or attached after the tests."""
    yield
    base = tmp_path_factory.getbasetemp()
    mounts, loops = release_everything(base)
    if mounts or loops:
        print(f"workspace quota tests: released leftover mounts {mounts} and loop devices {loops}")


@pytest.fixture(name="volume_settings")
def volume_settings_fixture(tmp_path: Path) -> Iterator[Settings]:
    """A data dir with a 64m workspace quota; every volume below it released afterwards,
    and the test fails if one was still mounted by then (what ``unmount_all`` missed)."""
    settings = Settings.load(data_dir=tmp_path / "data", workspace_quota="64m", env_file=None)
    settings.ensure_dirs()
    try:
        yield settings
    finally:
        quota.unmount_all(settings)
        mounts, loops = release_everything(tmp_path)
    assert (mounts, loops) == ([], []), "unmount_all left mounts or loop devices behind"


def fill(path: Path, size: int) -> int:
    """Write up to ``size`` bytes of data into ``path``; the bytes written before ENOSPC."""
    written = 0
    chunk = os.urandom(1024 * 1024)
    with open(path, "wb") as fh:
        try:
            while written < size:
                written += fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return written
