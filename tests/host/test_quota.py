"""The workspace quota (``orchestrator/sandbox/quota/``) on real parts: loop-mounted
ext4 volumes made, filled with what the workspace held, mounted once however
many threads and processes ask at the same time, grown, never shrunk; and the
checked mode's bounded walk, which refuses a workspace over its quota.

The volume tests need root, loop devices and e2fsprogs (skipped without them
on a developer machine, failed under ``CI=true``).  Every test releases what
it mounted (``tests/quota_support.py``), and the session checks once more.
The attack through a real agent container is in
``tests/integration/test_workspace_quota.py``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.core.errors import ContainerConfigError, MountRefused, WorkspaceQuotaError
from orchestrator.core.settings import Settings
from orchestrator.core.sizes import parse_quota
from orchestrator.sandbox import quota
from orchestrator.sandbox.config import (
    ContainerConfig,
    parse_container_config,
    set_container_config,
    workspace_quota,
)
from orchestrator.sandbox.late_mounts import MountEntry, mount_entries
from orchestrator.sandbox.quota import loop as quota_loop
from orchestrator.sandbox.quota import mode as quota_mode_module
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from tests.conftest import run_in_threads
from tests.quota_support import (  # fixtures
    _no_volume_left_mounted,  # noqa: F401
    fill,
    loops_under,
    mounts_under,
    require_volumes,
    volume_settings_fixture,  # noqa: F401
)

MiB = 1024**2
ROOT = Path(__file__).resolve().parents[2]


def _workspace(settings: Settings, folder: str = "team") -> Path:
    path = settings.groups_dir / folder
    path.mkdir(parents=True, exist_ok=True)
    return path


def _mounts_at(path: Path) -> list[MountEntry]:
    return [e for e in mount_entries() if e.mount_point == str(path.resolve())]


# -- sizes and settings ---------------------------------------------------------------


def test_quota_sizes() -> None:
    assert parse_quota("0") == 0
    assert parse_quota("64m") == 64 * MiB
    assert parse_quota(" 2G ") == 2 * 1024**3
    assert parse_quota("1t") == 1024**4
    for bad in ("", "2x", "-1g", "1.5g", "8m", "17t"):
        with pytest.raises(ValueError):
            parse_quota(bad)
    assert quota.workspace_quota_bytes(Settings.load(workspace_quota="2G", env_file=None)) == 2 * 1024**3
    with pytest.raises(ValueError):
        Settings.load(workspace_quota="lots", env_file=None)
    with pytest.raises(ValueError):
        Settings.load(workspace_quota_mode="maybe", env_file=None)


def test_the_auto_default_is_a_volume_or_nothing(tmp_path: Path) -> None:
    """``auto`` (the default): 2 GiB where a volume enforces it, none where only
    the per-run check could; an explicit size is kept either way."""
    auto = Settings.load(data_dir=tmp_path, workspace_quota="auto", env_file=None)
    can_mount = quota.volume_problem() is None
    assert quota.workspace_quota_bytes(auto) == (2 * 1024**3 if can_mount else 0)
    mode, why = quota.quota_mode(auto)
    assert mode == ("volume" if can_mount else "off"), why
    if not can_mount:
        assert "cannot loop-mount" in quota.describe_mode(auto)
    checked = Settings.load(data_dir=tmp_path, workspace_quota="auto", workspace_quota_mode="checked", env_file=None)
    assert quota.workspace_quota_bytes(checked) == 0
    assert "quota: off" in quota.describe_mode(checked) and "ORCHESTRATOR_WORKSPACE_QUOTA" in quota.describe_mode(
        checked
    )
    explicit = Settings.load(data_dir=tmp_path, workspace_quota="3g", workspace_quota_mode="checked", env_file=None)
    assert quota.workspace_quota_bytes(explicit) == 3 * 1024**3


def test_a_group_may_set_its_own_quota(tmp_path: Path) -> None:
    settings = Settings.load(data_dir=tmp_path, workspace_quota="1g", env_file=None)
    assert workspace_quota(settings, None) == 1024**3
    assert workspace_quota(settings, {"workspace_quota": "256m"}) == 256 * MiB
    assert workspace_quota(settings, {"workspace_quota": "0"}) == 0
    assert parse_container_config({"workspace_quota": "4G"}) == ContainerConfig(workspace_quota="4g")
    with pytest.raises(ContainerConfigError, match=r"container_config\.workspace_quota: .*below the 16m"):
        parse_container_config({"workspace_quota": "1m"})
    with pytest.raises(ContainerConfigError, match=r"container_config\.disk_quota"):
        parse_container_config({"disk_quota": "1g"})  # unknown keys are still refused


def test_a_quota_below_the_volume_is_refused(db: Database, settings: Settings) -> None:
    add_group(db, chat_jid="team@chat", name="team", folder="team")
    # A volume of 256m exists (an image file is enough: nothing is mounted here).
    image = quota.volumes_dir(settings) / "team.img"
    image.parent.mkdir(parents=True)
    with open(image, "wb") as fh:
        fh.truncate(256 * MiB)
    with pytest.raises(ContainerConfigError, match=r"workspace_quota: 128m is below .*256\.0 MiB.*only grow"):
        set_container_config(db, settings, "team@chat", {"workspace_quota": "128m"})
    assert set_container_config(db, settings, "team@chat", {"workspace_quota": "512m"}).container_config == {
        "workspace_quota": "512m"
    }
    assert set_container_config(db, settings, "team@chat", {"workspace_quota": "0"}).container_config


# -- the checked mode -----------------------------------------------------------------


def _checked(tmp_path: Path, size: str = "16m") -> Settings:
    return Settings.load(
        data_dir=tmp_path / "data",
        workspace_quota=size,
        workspace_quota_mode="checked",
        env_file=None,
    )


def test_checked_mode_refuses_a_workspace_over_its_quota(tmp_path: Path) -> None:
    settings = _checked(tmp_path)
    ws = _workspace(settings)
    assert quota.quota_mode(settings)[0] == "checked"
    (ws / "small").write_bytes(os.urandom(1 * MiB))
    quota.prepare_workspace(settings, "team", ws, quota.workspace_quota_bytes(settings))  # under: fine
    (ws / "deep" / "er").mkdir(parents=True)
    (ws / "deep" / "er" / "big").write_bytes(os.urandom(20 * MiB))
    with pytest.raises(WorkspaceQuotaError) as info:
        quota.prepare_workspace(settings, "team", ws, quota.workspace_quota_bytes(settings), chat_jid="team@chat")
    message = str(info.value)
    assert "workspace quota exceeded" in message and "21.0 MiB" in message and "16.0 MiB quota" in message
    assert "team@chat" in message and str(ws) in message
    assert isinstance(info.value, MountRefused)  # the pipeline fails such a run at once, without retries
    assert _mounts_at(ws) == []  # nothing mounted in this mode
    # A group with more room, or no quota, runs.
    quota.prepare_workspace(settings, "team", ws, 64 * MiB)
    quota.prepare_workspace(settings, "team", ws, 0)


def test_the_walk_follows_no_symlink_and_counts_a_file_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge").write_bytes(os.urandom(8 * MiB))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data").write_bytes(os.urandom(2 * MiB))
    os.link(ws / "data", ws / "data-again")  # a hard link: the same blocks
    os.symlink(outside, ws / "to-outside")
    os.symlink(outside / "huge", ws / "to-huge")
    os.mkfifo(ws / "fifo")  # stat only: never opened, never blocks
    with open(ws / "sparse", "wb") as fh:
        fh.truncate(1024**3)  # 1 GiB apparent, nothing allocated
    usage = quota.measure(ws)
    assert usage.complete
    assert 2 * MiB <= usage.bytes < 3 * MiB, usage
    assert usage.entries == 6


def test_the_walk_is_bounded(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    deep = ws
    for i in range(12):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    for i in range(50):
        (ws / f"f{i}").touch()
    assert quota.measure(ws).complete
    too_deep = quota.measure(ws, max_depth=10)
    assert not too_deep.complete and "deeper than 10" in too_deep.why
    too_many = quota.measure(ws, max_entries=20)
    assert not too_many.complete and "more than 20 entries" in too_many.why
    with pytest.raises(WorkspaceQuotaError, match=r"cannot be measured \(more than 20 entries"):
        quota.check_usage(ws, 16 * MiB, max_entries=20)  # refused, however little it holds


# -- the volume mode -----------------------------------------------------------------


def test_a_volume_is_made_mounted_and_keeps_what_the_workspace_held(volume_settings: Settings) -> None:
    require_volumes()
    settings = volume_settings
    assert quota.quota_mode(settings)[0] == "volume"
    ws = _workspace(settings)
    (ws / "notes.txt").write_text("kept\n")
    os.chown(ws / "notes.txt", 1000, 1000)
    os.chmod(ws / "notes.txt", 0o640)
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "mod.py").write_bytes(os.urandom(300_000))
    os.symlink("/etc/passwd", ws / "link")  # kept as a link, never followed
    os.symlink("src/pkg", ws / "rel")
    os.mkfifo(ws / "pipe")  # not moved (and never opened)
    with open(ws / "sparse", "wb") as fh:
        fh.truncate(200 * MiB)  # bigger than the quota, but a hole: it fits and stays sparse
        fh.seek(100 * MiB)
        fh.write(b"x")
    before = (ws / "src" / "pkg" / "mod.py").read_bytes()

    started = time.monotonic()
    quota.prepare_workspace(settings, "team", ws, quota.workspace_quota_bytes(settings))
    took = time.monotonic() - started
    print(f"first mount (mkfs, fill, mount) took {took * 1000:.0f} ms")

    mounts = _mounts_at(ws)
    assert len(mounts) == 1 and mounts[0].fstype == "ext4"
    image = quota.volumes_dir(settings) / "team.img"
    assert quota.loop_backing_file(mounts[0].source) == str(image)
    options = (
        next(line for line in Path("/proc/self/mountinfo").read_text().splitlines() if line.split()[4] == str(ws))
        .split()[5]
        .split(",")
    )
    assert "nosuid" in options and "nodev" in options and "noexec" not in options
    # The image: root's, 0600, sparse, in a 0700 folder beside (never inside) the groups.
    st = image.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode), st.st_size) == (0, 0o600, 64 * MiB)
    assert st.st_blocks * 512 < 16 * MiB
    assert stat.S_IMODE(image.parent.stat().st_mode) == 0o700
    # What the workspace held is there, as it was.
    assert sorted(p.name for p in ws.iterdir()) == ["link", "notes.txt", "rel", "sparse", "src"]
    assert (ws / "notes.txt").read_text() == "kept\n"
    nst = os.lstat(ws / "notes.txt")
    assert (nst.st_uid, nst.st_gid, stat.S_IMODE(nst.st_mode)) == (1000, 1000, 0o640)
    assert (ws / "src" / "pkg" / "mod.py").read_bytes() == before
    assert os.readlink(ws / "link") == "/etc/passwd" and os.readlink(ws / "rel") == "src/pkg"
    assert os.stat(ws / "sparse").st_size == 200 * MiB and os.stat(ws / "sparse").st_blocks * 512 < MiB
    # The volume is the quota: a file that does not fit is ENOSPC, for root too (no reserved blocks).
    with open(ws / "big", "wb") as fh, pytest.raises(OSError) as full:
        os.posix_fallocate(fh.fileno(), 0, 128 * MiB)
    assert full.value.errno == errno.ENOSPC
    (ws / "big").unlink()
    # A second prepare finds it mounted and does nothing.
    started = time.monotonic()
    quota.prepare_workspace(settings, "team", ws, quota.workspace_quota_bytes(settings))
    assert time.monotonic() - started < 0.5
    assert len(_mounts_at(ws)) == 1
    report = quota.report(settings, "team", quota.workspace_quota_bytes(settings))
    assert report.mode == "volume" and report.mounted and report.volume == str(image)
    assert 0 < report.used < 8 * MiB
    # Unmounted, the folder under it is empty: nothing was left behind, hidden.
    assert quota.unmount_all(settings) == ["team"]
    assert _mounts_at(ws) == [] and list(ws.iterdir()) == [] and loops_under(settings.data_dir) == []
    # Mounted again (as after a reboot): the same files.
    quota.prepare_workspace(settings, "team", ws, quota.workspace_quota_bytes(settings))
    assert (ws / "notes.txt").read_text() == "kept\n"


def test_preparing_at_once_from_threads_and_processes_mounts_once(volume_settings: Settings) -> None:
    require_volumes()
    settings = volume_settings
    ws = _workspace(settings)
    (ws / "seed.txt").write_text("seed\n")
    code = (
        "import sys; from pathlib import Path; from orchestrator.sandbox import quota; "
        "from orchestrator.core.settings import Settings; "
        "s = Settings.load(data_dir=Path(sys.argv[1]), workspace_quota='64m', env_file=None); "
        "quota.prepare_workspace(s, 'team', s.groups_dir / 'team', quota.workspace_quota_bytes(s))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(settings.data_dir)], cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    errors = run_in_threads(
        lambda _: quota.prepare_workspace(settings, "team", ws, quota.workspace_quota_bytes(settings)), 6
    )
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    assert errors == []
    assert len(_mounts_at(ws)) == 1
    assert len(quota.loop_devices_of(quota.volumes_dir(settings) / "team.img")) == 1
    assert (ws / "seed.txt").read_text() == "seed\n"
    assert not (quota.volumes_dir(settings) / "team.mnt").exists()


def test_a_larger_quota_grows_the_volume_and_a_smaller_one_does_not_shrink_it(volume_settings: Settings) -> None:
    require_volumes()
    settings = volume_settings
    ws = _workspace(settings)
    quota.prepare_workspace(settings, "team", ws, 64 * MiB)
    (ws / "data").write_bytes(os.urandom(40 * MiB))
    started = time.monotonic()
    quota.prepare_workspace(settings, "team", ws, 128 * MiB)
    print(f"growing 64m -> 128m took {(time.monotonic() - started) * 1000:.0f} ms")
    assert len(_mounts_at(ws)) == 1
    room = os.statvfs(ws)
    assert room.f_blocks * room.f_frsize > 100 * MiB
    assert (ws / "data").stat().st_size == 40 * MiB
    assert not (ws / "lost+found").exists()
    with open(ws / "more", "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 60 * MiB)  # did not fit before
    quota.prepare_workspace(settings, "team", ws, 64 * MiB)  # smaller: kept as it is
    assert (quota.volumes_dir(settings) / "team.img").stat().st_size == 128 * MiB
    report = quota.report(settings, "team", 64 * MiB)
    assert "not shrunk" in report.note


def test_quota_off_still_mounts_an_existing_volume(volume_settings: Settings) -> None:
    # The group's files live in the volume: turning the quota off must not show an empty folder.
    require_volumes()
    settings = volume_settings
    ws = _workspace(settings)
    quota.prepare_workspace(settings, "team", ws, 64 * MiB)
    (ws / "mine.txt").write_text("mine\n")
    quota.unmount_all(settings)
    quota.prepare_workspace(settings, "team", ws, 0)
    assert (ws / "mine.txt").read_text() == "mine\n"


def test_content_that_does_not_fit_is_refused_and_left_in_place(volume_settings: Settings) -> None:
    require_volumes()
    settings = volume_settings
    ws = _workspace(settings)
    (ws / "big").write_bytes(os.urandom(80 * MiB))
    with pytest.raises(WorkspaceQuotaError, match="cannot move into its volume"):
        quota.prepare_workspace(settings, "team", ws, 64 * MiB)
    assert _mounts_at(ws) == [] and (ws / "big").stat().st_size == 80 * MiB
    assert not (quota.volumes_dir(settings) / "team.img").exists()  # a new one is dropped again
    quota.prepare_workspace(settings, "team", ws, 128 * MiB)
    assert len(_mounts_at(ws)) == 1 and (ws / "big").stat().st_size == 80 * MiB


def test_a_foreign_mount_is_left_alone_and_checked(volume_settings: Settings, tmp_path: Path) -> None:
    # An operator's own filesystem at the workspace (here a small tmpfs) is not mounted over.
    require_volumes()
    settings = volume_settings
    ws = _workspace(settings)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(ws)], check=True)
    try:
        (ws / "big").write_bytes(os.urandom(20 * MiB))
        with pytest.raises(WorkspaceQuotaError, match="workspace quota exceeded"):
            quota.prepare_workspace(settings, "team", ws, 16 * MiB)
        quota.prepare_workspace(settings, "team", ws, 64 * MiB)
        assert [e.fstype for e in _mounts_at(ws)] == ["tmpfs"]
    finally:
        subprocess.run(["umount", str(ws)], check=True)
    assert mounts_under(tmp_path) == []


def test_a_volume_that_cannot_be_mounted_falls_back_to_the_check(
    volume_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_volumes()
    settings = volume_settings
    ws = _workspace(settings)
    (ws / "big").write_bytes(os.urandom(20 * MiB))
    monkeypatch.setattr(quota_loop, "MOUNT_OPTIONS", "loop,nosuid,nodev,no_such_option")  # every mount fails
    monkeypatch.setattr(quota_mode_module, "_volume_broken", {})
    # Forced volume mode: refused, saying why; nothing left behind.
    forced = settings.replace(**{"workspace_quota_mode": "volume"})
    with pytest.raises(WorkspaceQuotaError, match="cannot set up the workspace volume"):
        quota.prepare_workspace(forced, "team", ws, 64 * MiB)
    assert sorted(p.name for p in quota.volumes_dir(settings).iterdir()) == ["team.lock"]
    # auto: checked instead (logged), for this process's next runs too.
    with pytest.raises(WorkspaceQuotaError, match="workspace quota exceeded"):
        quota.prepare_workspace(settings, "team", ws, 16 * MiB)
    assert quota.quota_mode(settings)[0] == "checked"
    quota.prepare_workspace(settings, "team", ws, 64 * MiB)
    assert _mounts_at(ws) == [] and (ws / "big").stat().st_size == 20 * MiB
    assert sorted(p.name for p in quota.volumes_dir(settings).iterdir()) == ["team.lock"]


def test_a_worker_that_cannot_mount_an_existing_volume_refuses_the_run(
    volume_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_volumes()
    settings = volume_settings
    ws = _workspace(settings)
    quota.prepare_workspace(settings, "team", ws, 64 * MiB)
    (ws / "mine.txt").write_text("mine\n")
    quota.unmount_all(settings)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # as a worker that is not root sees it
    monkeypatch.setattr(quota_mode_module, "_modes", {})
    assert quota.quota_mode(settings)[0] == "checked"
    with pytest.raises(WorkspaceQuotaError, match="lives in the volume .* cannot mount .*not run as root"):
        quota.prepare_workspace(settings, "team", ws, 64 * MiB)
    assert list(ws.iterdir()) == []  # it never ran on the empty folder


def test_cli_shows_usage_and_quota(volume_settings: Settings) -> None:
    require_volumes()
    settings = volume_settings
    db = Database(settings.effective_database_url, lock_dir=settings.data_dir)
    db.migrate()
    add_group(db, chat_jid="team@chat", name="team", folder="team")
    add_group(db, chat_jid="solo@chat", name="solo", folder="solo")
    db.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env.update(ORCHESTRATOR_DATA_DIR=str(settings.data_dir), ORCHESTRATOR_WORKSPACE_QUOTA="64m")
    cli = str(Path(sys.executable).parent / "orchestrator")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, "groups", *args], env=env, capture_output=True, text=True, timeout=60)

    ok = run("set", "team@chat", "--container-config", '{"workspace_quota": "128m"}')
    assert ok.returncode == 0, ok.stderr
    assert "workspace quota 128.0 MiB" in ok.stdout, ok.stdout
    ws = _workspace(settings)
    quota.prepare_workspace(settings, "team", ws, 128 * MiB)
    (ws / "data").write_bytes(os.urandom(3 * MiB))
    shown = run("quota", "team@chat")
    assert shown.returncode == 0, shown.stderr
    assert "used of 128.0 MiB (mode volume" in shown.stdout, shown.stdout
    assert "team.img: 128.0 MiB, mounted" in shown.stdout, shown.stdout
    doc = json.loads(run("quota", "team@chat", "--json").stdout)
    assert doc["mounted"] and doc["quota"] == 128 * MiB and 3 * MiB < doc["used"] < 8 * MiB
    refused = run("set", "team@chat", "--container-config", '{"workspace_quota": "64m"}')
    assert refused.returncode == 1 and "volumes only grow" in refused.stderr, refused.stderr
    # A group without a volume, in the checked mode: measured.
    (_workspace(settings, "solo") / "f").write_bytes(os.urandom(MiB))
    env["ORCHESTRATOR_WORKSPACE_QUOTA_MODE"] = "checked"
    solo = run("quota", "solo@chat")
    assert solo.returncode == 0 and "1.0 MiB used of 64.0 MiB (mode checked" in solo.stdout, solo.stdout
    # Before the data dir can go: every volume unmounted, the files kept in its image.
    released = run("unmount-volumes")
    assert released.returncode == 0 and "unmounted 1 workspace volume(s): team" in released.stderr, released.stderr
    assert quota.Volume.of(settings, "team").mounted() is None and not (ws / "data").exists()
    quota.prepare_workspace(settings, "team", ws, 128 * MiB)  # the next run mounts it again
    assert (ws / "data").stat().st_size == 3 * MiB
    assert not (quota.volumes_dir(settings) / "solo.img").exists()


# -- scratch volumes (a replay's copy) --------------------------------------------------


def test_a_scratch_volume_stops_writes_at_its_quota_and_leaves_nothing(volume_settings: Settings) -> None:
    """A replay's scratch copy lives in a throw-away volume: writing past its quota is
    ENOSPC (what an agent in the replay's container meets), and on the way out it is
    unmounted and its image deleted."""
    require_volumes()
    settings = volume_settings
    where = settings.runs_dir / "r1.scratch"
    where.mkdir(parents=True)
    with quota.scratch_volume(settings, "r1", where, 16 * MiB) as bounded:
        assert bounded
        assert _mounts_at(where), "the scratch folder is a mount point"
        written = fill(where / "big", 64 * MiB)
        assert written < 16 * MiB
        assert shutil.disk_usage(where).total <= 16 * MiB
    assert not _mounts_at(where)
    assert sorted(p.name for p in quota.volumes_dir(settings).iterdir() if p.name.startswith("replay.")) == []
    assert not loops_under(settings.data_dir)


def test_no_quota_is_a_plain_folder(tmp_path: Path) -> None:
    settings = Settings.load(data_dir=tmp_path / "data", workspace_quota="0", env_file=None)
    where = tmp_path / "scratch"
    where.mkdir()
    with quota.scratch_volume(settings, "r2", where, 0) as bounded:
        assert not bounded and not _mounts_at(where)


KILLED_HOLDER = """
import os, sys, time
from pathlib import Path
from orchestrator.core.settings import Settings
from orchestrator.sandbox import quota
settings = Settings.load(data_dir=Path(sys.argv[1]), workspace_quota="64m", env_file=None)
where = Path(sys.argv[2]); where.mkdir(parents=True)
with quota.scratch_volume(settings, "killed", where, 16 * 1024**2):
    print("mounted", flush=True)
    time.sleep(600)
"""


def test_a_killed_replays_scratch_volume_is_removed_by_the_next_one(volume_settings: Settings) -> None:
    """A worker SIGKILLed mid-replay leaves its scratch volume mounted; the next scratch
    volume of the data dir unmounts and deletes it (its holder's lock died with it), and
    never one still in use."""
    require_volumes()
    settings = volume_settings
    stale = settings.runs_dir / "killed.scratch"
    holder = subprocess.Popen(
        [sys.executable, "-c", KILLED_HOLDER, str(settings.data_dir), str(stale)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "mounted"
        assert _mounts_at(stale)
        # While its holder lives, it is in use: left alone.
        assert quota.remove_stale_scratch(settings) == []
        assert _mounts_at(stale)
    finally:
        holder.kill()
        holder.wait()
    assert _mounts_at(stale), "SIGKILL leaves the mount"
    where = settings.runs_dir / "next.scratch"
    where.mkdir(parents=True)
    with quota.scratch_volume(settings, "next", where, 16 * MiB) as bounded:
        assert bounded
        assert not _mounts_at(stale)
        left = sorted(p.name for p in quota.volumes_dir(settings).iterdir() if "killed" in p.name)
        assert left == []
    assert not _mounts_at(where)


# -- one machine at a time (a fleet shares the data dir) -------------------------------------


def test_a_volume_is_mounted_by_one_host_at_a_time_and_follows_its_group(
    volume_settings: Settings,
    db: Database,
) -> None:
    """Two hosts on one shared data dir: the group's volume is mounted only by the host that holds
    it, refused to the other, unmounted and let go when the group moves, then mounted by the new
    host; a holder gone for good is taken over."""
    from datetime import timedelta

    import docker
    from sqlalchemy import update

    from orchestrator.core.errors import VolumeHeldElsewhere
    from orchestrator.sandbox.config import container_plan
    from orchestrator.sandbox.fencing import hold_for_attempt, release_moved
    from orchestrator.sandbox.warm import WarmPool
    from orchestrator.store import hosts
    from orchestrator.store.groups import get_group
    from orchestrator.store.tables import GroupRow, HostRow
    from orchestrator.store.volume_holds import holder

    require_volumes()
    # Two machines (the storage's sharing is what this is about): one host each.
    a = volume_settings.replace(host_id="host-a", machine_id="machine-a")
    b = volume_settings.replace(host_id="host-b", dead_host_s=60, machine_id="machine-b")
    for host in ("host-a", "host-b"):
        hosts.register(db, host_id=host, instance=host, version="test", concurrency=1, machine=f"machine-{host[-1]}")
    add_group(db, chat_jid="team@chat", name="team", folder="team")

    def place(host: str) -> None:
        with db.write() as session:
            session.execute(update(GroupRow).where(GroupRow.chat_jid == "team@chat").values(placed_host=host))

    place("host-a")
    group = get_group(db, "team@chat")
    vol = quota.Volume.of(a, "team")
    hold_for_attempt(db, a, group, "offline")
    plan = container_plan(a, group)
    assert vol.mounted() == "ours" and holder(db, "team") == "host-a"
    (plan.workspace / "notes.txt").write_text("written on host a\n")
    # Host b may not mount it while host a has it: a retryable refusal naming the holder.
    with pytest.raises(VolumeHeldElsewhere, match="held by host 'host-a'"):
        hold_for_attempt(db, b, group, "offline")
    # Host a's beat lets go only once the group has moved.
    pool_a = WarmPool(a, docker.from_env())
    assert release_moved(db, a, pool_a) == [] and vol.mounted() == "ours"
    place("host-b")
    assert release_moved(db, a, pool_a) == ["team"]
    assert vol.mounted() is None and not quota.loop_devices_of(vol.image) and holder(db, "team") is None
    # Now host b holds and mounts it, with what host a wrote.
    hold_for_attempt(db, b, group, "offline")
    container_plan(b, group)
    assert vol.mounted() == "ours" and holder(db, "team") == "host-b"
    assert (plan.workspace / "notes.txt").read_text() == "written on host a\n"
    # Host b silent, but not yet dead for its leases: it still holds them.  Dead (the image has
    # the multiple-mount protection, so the storage fences the mount): another host takes the
    # hold over (tests/host/test_volume_takeover.py has the mount refused meanwhile).
    with db.write() as session:
        session.execute(
            update(HostRow)
            .where(HostRow.host_id == "host-b")
            .values(heartbeat_at=hosts.database_now(db) - timedelta(seconds=5))
        )
    with pytest.raises(VolumeHeldElsewhere):
        hold_for_attempt(db, a.replace(dead_host_s=60), group, "offline")
    with db.write() as session:
        session.execute(
            update(HostRow)
            .where(HostRow.host_id == "host-b")
            .values(heartbeat_at=hosts.database_now(db) - timedelta(seconds=hosts.ALIVE_WINDOW_S + 1))
        )
    hold_for_attempt(db, a.replace(dead_host_s=60), group, "offline")
    assert holder(db, "team") == "host-a"
