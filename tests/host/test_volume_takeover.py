"""A group's volumes when their holder is gone or busy (issue 45), on both databases, with real
loop-mounted volumes (root, loop devices, e2fsprogs; CI has them).

* one machine: a host's hold is taken over at once by the host that holds the group's
  lease, and its mount is used as it is (one kernel: no second mount, no second loop
  device); a group moved between hosts of one machine keeps its mount;
* an earlier boot of this machine is one machine too; another machine is not: its hold goes
  with its leases, but its kernel's mount refuses a second one (ext4's multiple-mount
  protection) until that machine lets go; an image made before the protection waits for
  ORCHESTRATOR_DEAD_HOST_S;
* a run whose volumes another live host holds waits for them, said once in the chat,
  then runs when the holder lets go (it never fails for it).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import docker
import pytest
from sqlalchemy import update

from agent_runner.protocol import AssistantEvent, ResultEvent
from fakes.clock import FakeClock
from fakes.sandbox import FakeSandbox, Script
from orchestrator.core.errors import VolumeHeldElsewhere, VolumeMountedElsewhere
from orchestrator.core.settings import Settings
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.run.pipeline import Pipeline
from orchestrator.sandbox import mmp, quota
from orchestrator.sandbox.config import container_plan
from orchestrator.sandbox.fencing import hold_for_attempt, release_foreign, release_moved
from orchestrator.sandbox.quota import mount_existing
from orchestrator.sandbox.warm import WarmPool
from orchestrator.store import hosts
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group, get_group
from orchestrator.store.message_log import get_messages_after
from orchestrator.store.runs import list_runs
from orchestrator.store.tables import GroupRow, HostRow
from orchestrator.store.volume_holds import holder, release, shares_mounts
from tests.quota_support import require_volumes, volume_settings_fixture  # noqa: F401 - fixture

JID = "team@chat"


def _silent_for(db: Database, host_id: str, seconds: float) -> None:
    with db.write() as session:
        session.execute(
            update(HostRow)
            .where(HostRow.host_id == host_id)
            .values(heartbeat_at=hosts.database_now(db) - timedelta(seconds=seconds))
        )


def _two_hosts(db: Database, settings: Settings, machine_a: str, machine_b: str) -> tuple[Settings, Settings]:
    a = settings.replace(host_id="host-a", machine_id=machine_a)
    b = settings.replace(host_id="host-b", machine_id=machine_b)
    for s in (a, b):
        hosts.register(
            db,
            host_id=s.fleet.host_id,
            instance=s.fleet.host_id,
            version="test",
            concurrency=1,
            machine=s.fleet.machine_id,
        )
    add_group(db, chat_jid=JID, name="team", folder="team", requires_trigger=False)
    return a, b


def test_a_host_of_this_machine_leaves_its_mount_to_the_next_host_at_once(
    volume_settings: Settings, db: Database
) -> None:
    """Whatever the holder's heartbeat says: the claimer holds the group's lease, so no process of
    the holder runs the group, and one kernel means one mount."""
    require_volumes()
    a, b = _two_hosts(db, volume_settings.replace(dead_host_s=120), "machine-1", "machine-1")
    group = get_group(db, JID)
    vol = quota.Volume.of(a, "team")
    assert hold_for_attempt(db, a, group, "offline") is None
    workspace = container_plan(a, group).workspace
    (workspace / "notes.txt").write_text("written by host a\n")
    devices = quota.loop_devices_of(vol.image)
    assert vol.mounted() == "ours" and len(devices) == 1
    assert hold_for_attempt(db, b, group, "offline") == "host-a"  # host a beating, and all
    assert holder(db, "team") == "host-b"
    container_plan(b, group)
    # The same mount, not a second one: one kernel, one loop device, the same files.
    assert vol.mounted() == "ours" and quota.loop_devices_of(vol.image) == devices
    assert (workspace / "notes.txt").read_text() == "written by host a\n"
    # Host a, dead and back, finds it held by b: neither mounts it again nor lets go of b's hold.
    _silent_for(db, "host-a", hosts.ALIVE_WINDOW_S + 1)
    hosts.register(db, host_id="host-a", instance="host-a-again", version="test", concurrency=1, machine="machine-1")
    assert not release(db, "team", "host-a") and holder(db, "team") == "host-b"


def test_a_group_moved_to_a_host_of_this_machine_keeps_its_mount(volume_settings: Settings, db: Database) -> None:
    """The holder's beat hands the hold over as it is: unmounting would pull the mount from
    under the new host, which shares it."""
    require_volumes()
    a, b = _two_hosts(db, volume_settings, "machine-1", "machine-1")
    group = get_group(db, JID)
    hold_for_attempt(db, a, group, "offline")
    container_plan(a, group)
    vol = quota.Volume.of(a, "team")
    devices = quota.loop_devices_of(vol.image)
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == JID).values(placed_host="host-b"))
    assert release_moved(db, a, WarmPool(a, docker.from_env())) == ["team"]
    assert holder(db, "team") == "host-b"
    assert vol.mounted() == "ours" and quota.loop_devices_of(vol.image) == devices


def test_an_earlier_boot_of_this_machine_is_taken_over_once_it_is_dead(volume_settings: Settings, db: Database) -> None:
    require_volumes()
    a, b = _two_hosts(db, volume_settings.replace(dead_host_s=120), "m1/boot1", "m1/boot2")
    group = get_group(db, JID)
    hold_for_attempt(db, a, group, "offline")
    with pytest.raises(VolumeHeldElsewhere):  # beating in that boot: a clone with this machine's id
        hold_for_attempt(db, b, group, "offline")
    _silent_for(db, "host-a", hosts.ALIVE_WINDOW_S + 1)
    assert hold_for_attempt(db, b, group, "offline") == "host-a"


def test_an_unprotected_image_of_another_machine_waits_for_its_host_to_be_gone_for_good(
    volume_settings: Settings, db: Database
) -> None:
    """An image made before the multiple-mount protection: only the database fences it, so
    another machine's hold goes only after ORCHESTRATOR_DEAD_HOST_S; its next mount turns the
    protection on."""
    require_volumes()
    a, b = _two_hosts(db, volume_settings.replace(dead_host_s=60), "machine-1", "machine-2")
    group = get_group(db, JID)
    hold_for_attempt(db, a, group, "offline")
    container_plan(a, group)
    vol = quota.Volume.of(a, "team")
    quota.unmount_all(a)  # what machine 1's going away did to its mount
    subprocess.run(["tune2fs", "-O", "^mmp", str(vol.image)], check=True, capture_output=True)
    assert mmp.read_block(vol.image) is None
    _silent_for(db, "host-a", hosts.ALIVE_WINDOW_S + 1)
    with pytest.raises(VolumeHeldElsewhere):
        hold_for_attempt(db, b, group, "offline")
    _silent_for(db, "host-a", 61)
    assert hold_for_attempt(db, b, group, "offline") == "host-a"
    mount_existing(b, "team")
    block = mmp.read_block(vol.image)
    assert block is not None and block.in_use and vol.mounted() == "ours"


@pytest.fixture
def second_machine(volume_settings: Settings, tmp_path: Path) -> Iterator[Settings]:
    """The data dir as another machine sees it: the same files through a private bind mount at
    another path, so a volume mounted through one is not mounted through the other (two mount
    tables over one storage, as two machines have; one kernel, whose multiple-mount protection
    is the fence between them)."""
    require_volumes()
    there = tmp_path / "machine-2"
    there.mkdir()
    subprocess.run(["mount", "--bind", str(volume_settings.data_dir), str(there)], check=True)
    subprocess.run(["mount", "--make-private", str(there)], check=True)
    try:
        yield volume_settings.replace(data_dir=there)
    finally:
        for _ in range(2):
            quota.unmount_all(volume_settings.replace(data_dir=there))
        subprocess.run(["umount", "-l", str(there)], check=False)


# The kernel's 11 s check is the cost: once, on the fleet's database (the hold's rules ran on both above).
@pytest.mark.parametrize("db_backend", ["postgresql"])
def test_another_machines_mount_refuses_a_second_one_until_that_machine_lets_go(
    volume_settings: Settings, second_machine: Settings, db: Database
) -> None:
    """Another machine's dead host loses its hold with its leases (9 s), but its kernel keeps the
    image mounted: the second machine's mount is refused by the multiple-mount protection (the
    group waits), and succeeds once the first machine lets go (its restarted worker unmounts a
    volume whose hold is another machine's), with the files it wrote."""
    a, b = _two_hosts(db, volume_settings.replace(dead_host_s=120), "machine-1", "machine-2")
    b = b.replace(data_dir=second_machine.data_dir)
    group = get_group(db, JID)
    hold_for_attempt(db, a, group, "offline")
    workspace = container_plan(a, group).workspace
    (workspace / "notes.txt").write_text("written on machine 1\n")
    assert mmp.read_block(quota.Volume.of(a, "team").image) is not None  # made protected
    _silent_for(db, "host-a", hosts.ALIVE_WINDOW_S + 1)
    assert hold_for_attempt(db, b, group, "offline") == "host-a"  # the hold goes with the leases ...
    started = time.monotonic()
    with pytest.raises(VolumeMountedElsewhere, match="mounted on machine"):
        mount_existing(b, "team")  # ... the image does not: machine 1's kernel still has it
    refused_after = time.monotonic() - started
    assert quota.Volume.of(b, "team").mounted() is None
    # Machine 1's worker, back, lets go of what another machine's host holds now.
    hosts.register(db, host_id="host-a", instance="host-a-back", version="test", concurrency=1, machine="machine-1")
    pool = WarmPool(a, docker.from_env())
    assert release_foreign(db, a, pool) == ["team"]
    assert quota.Volume.of(a, "team").mounted() is None
    mount_existing(b, "team")
    assert (b.groups_dir / "team" / "notes.txt").read_text() == "written on machine 1\n"
    print(f"VOLUMES: another machine's mount refused after {refused_after:.1f} s")


def test_machines_share_mounts_in_one_boot_and_after_a_reboot_only() -> None:
    assert shares_mounts("m1/boot1", "m1/boot1")
    assert shares_mounts("m1/boot1", "m1/boot2")  # the reboot unmounted everything
    assert not shares_mounts("m1/boot1", "m2/boot1")
    assert not shares_mounts("unknown/boot1", "unknown/boot2")
    assert shares_mounts("machine-1", "machine-1") and not shares_mounts("machine-1", "machine-2")


def test_a_run_waits_for_volumes_held_by_a_live_host_says_so_once_and_runs_when_let_go(
    volume_settings: Settings, settings: Settings, db: Database
) -> None:
    require_volumes()
    on_db = volume_settings.replace(database_url=settings.effective_database_url, dead_host_s=120)
    a, b = _two_hosts(db, on_db, "machine-1", "machine-2")
    group = get_group(db, JID)
    hold_for_attempt(db, a, group, "offline")
    sandbox = FakeSandbox(Script([AssistantEvent(text="answered on b"), ResultEvent()]))
    pipeline = Pipeline(b, db, ChannelRegistry([]), sandbox, clock=FakeClock())
    ingest(db, b, IncomingMessage(chat_jid=JID, sender="u", content="hello"), signal=None)

    first = pipeline.step(JID)
    again = pipeline.step(JID)  # a re-signal of the same wait
    for step in (first, again):
        assert step.volume_holder == "host-a" and step.retry_in is not None and step.outcome is None
    assert not sandbox.started and list_runs(db, chat_jid=JID, limit=10) == []
    told = [m for m in get_messages_after(JID, 0, db=db) if m.message_type == "host"]
    assert len(told) == 1 and "still mounted by host 'host-a'" in told[0].content

    assert release(db, "team", "host-a")  # host a unmounted them, as its beat does for a moved group
    step = pipeline.step(JID)
    assert step.outcome is not None and step.outcome.run.state == "succeeded"
    assert holder(db, "team") == "host-b"
    replies = [m.content for m in get_messages_after(JID, 0, db=db) if m.sender == "bot"]
    assert replies == ["answered on b"]
    quota.unmount_all(b)
