"""Volume holds: one host at a time may have a group's volumes mounted.

A group's workspace and session folder can be ext4 images in the data dir
(``sandbox/quota/``), and a fleet shares the data dir between machines.
Each machine loop-mounts an image through its own kernel; two machines with
the same image mounted at once corrupt it (neither sees the other's cache).
So the database says which host holds a group's volumes (``volume_holds``, one
row per group folder):

* a host mounts a group's volumes only once it holds them (:func:`claim`,
  before every attempt that may mount; one read while it holds them already);
* a host lets go (:func:`release`) only after it unmounted them and no loop
  device of its machine is left on them: when the group moved to another host
  (``WarmPool.tend`` every heartbeat beat), or on ``groups unmount-volumes``;
* another host may take them over without that only once the holder has not
  beaten for ``ORCHESTRATOR_DEAD_HOST_S`` (a machine gone for good; a worker
  that comes back with the same host id holds them again).

A refused claim (:class:`VolumeHeldElsewhere`) is a retryable failure of the
attempt: the holder unmounts within a beat of seeing the group moved.
"""

from __future__ import annotations

import logging

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from orchestrator.core.errors import VolumeHeldElsewhere
from orchestrator.store.db import Database, changed_rows, db_now
from orchestrator.store.hosts import ALIVE_WINDOW_S, gone_for, machine_of, owner_host
from orchestrator.store.tables import GroupRow, VolumeHoldRow

log = logging.getLogger(__name__)


def holder(db: Database, folder: str) -> str | None:
    with db.read() as session:
        return session.scalar(select(VolumeHoldRow.host_id).where(VolumeHoldRow.folder == folder))


def holders(db: Database, folders: list[str]) -> dict[str, str]:
    """folder -> the host holding its volumes, for those of ``folders`` held."""
    with db.read() as session:
        rows = session.execute(
            select(VolumeHoldRow.folder, VolumeHoldRow.host_id).where(VolumeHoldRow.folder.in_(folders))
        ).all()
    return {folder: host for folder, host in rows}


def claim(
    db: Database,
    folder: str,
    host_id: str,
    *,
    gone_after_s: float,
    machine: str = "",
    same_machine_after_s: float = ALIVE_WINDOW_S,
) -> str | None:
    """Hold ``folder``'s volumes for ``host_id``, or raise :class:`VolumeHeldElsewhere`.

    Returns the host it took them over from (None: it held them already, or nobody did):
    a host of this ``machine`` (``core/machine.py``) that has not beaten for
    ``same_machine_after_s`` (dead for its leases, its sandboxes fenced), or any host
    gone for ``gone_after_s``."""
    held_by = holder(db, folder)
    if held_by == host_id:
        return None
    if held_by is None:
        insert = (sqlite.insert if db.is_sqlite else postgresql.insert)(VolumeHoldRow)
        with db.write() as session:
            session.execute(
                insert.values(folder=folder, host_id=host_id, held_at=db_now(session)).on_conflict_do_nothing(
                    index_elements=[VolumeHoldRow.folder]
                )
            )
        held_by = holder(db, folder)
        if held_by == host_id:
            return None
        assert held_by is not None  # a row that was there a moment ago is only ever replaced
    why = _why_taken(db, held_by, machine, same_machine_after_s, gone_after_s)
    if why is not None:
        with db.write() as session:
            taken = session.execute(
                update(VolumeHoldRow)
                .where(VolumeHoldRow.folder == folder, VolumeHoldRow.host_id == held_by)
                .values(host_id=host_id, held_at=db_now(session))
            )
        if changed_rows(taken) == 1:
            log.warning("took over the volumes of %s from host %s: %s", folder, held_by, why)
            return held_by
        # Someone else moved first: look again.
        return claim(
            db,
            folder,
            host_id,
            gone_after_s=gone_after_s,
            machine=machine,
            same_machine_after_s=same_machine_after_s,
        )
    raise VolumeHeldElsewhere(folder, held_by, gone_after_s)


def _why_taken(
    db: Database, held_by: str, machine: str, same_machine_after_s: float, gone_after_s: float
) -> str | None:
    """Why ``held_by``'s hold may be taken over now (None: it may not).  Asked only by a host
    that holds the group's lease: no process of ``held_by`` may run the group meanwhile."""
    theirs = machine_of(db, held_by) if machine else None
    if theirs is not None and theirs == machine:
        # One kernel: its mount is this host's mount too, so nothing is mounted twice; the lease
        # keeps its processes off the group, and the containers it left for the group are
        # removed before this host uses the workspace (run/volume_wait.py).
        return "it is of this machine: its mount is this host's"
    if (
        theirs is not None
        and shares_mounts(theirs, machine)
        and same_machine_after_s > 0
        and gone_for(db, {held_by}, same_machine_after_s)
    ):
        # An earlier boot of this machine: the reboot unmounted everything (unless it is a clone
        # with the same machine id, which would still be beating).
        return f"it ran in an earlier boot of this machine and has not beaten for {same_machine_after_s:.0f}s"
    if gone_after_s > 0 and gone_for(db, {held_by}, gone_after_s):
        return f"it has not beaten for {gone_after_s:.0f}s"
    return None


def shares_mounts(theirs: str, mine: str) -> bool:
    """Whether a host of machine ``theirs`` that is gone left its mounts to a host of ``mine``:
    the same machine and boot (one kernel), or the same machine in an earlier boot (a reboot
    unmounted everything).  ``<machine id>/<boot id>`` as ``core/machine.py`` makes them; an
    override (``ORCHESTRATOR_MACHINE_ID``) is compared whole."""
    if theirs == mine:
        return True
    their_machine, slash, _ = theirs.partition("/")
    my_machine, my_slash, _ = mine.partition("/")
    return bool(slash and my_slash) and their_machine == my_machine and their_machine != "unknown"


def release(db: Database, folder: str, host_id: str) -> bool:
    """``host_id`` lets go of ``folder``'s volumes (call once they are unmounted on its machine)."""
    with db.write() as session:
        return (
            changed_rows(
                session.execute(
                    delete(VolumeHoldRow).where(VolumeHoldRow.folder == folder, VolumeHoldRow.host_id == host_id)
                )
            )
            == 1
        )


def held_but_moved(db: Database, host_id: str) -> list[tuple[str, str | None]]:
    """The folders whose volumes ``host_id`` holds while their group is placed on another host
    and no process of ``host_id`` holds its lease, each with that host (None: the group is
    gone): to hand over, or unmount and let go of."""
    with db.read() as session:
        rows = session.execute(
            select(VolumeHoldRow.folder, GroupRow.folder, GroupRow.placed_host, GroupRow.lease_owner)
            .outerjoin(GroupRow, GroupRow.folder == VolumeHoldRow.folder)
            .where(VolumeHoldRow.host_id == host_id)
        ).all()
    # A group removed since (no row): nothing will run it here again either.
    return [
        (held, placed if group is not None else None)
        for held, group, placed, lease in rows
        if group is None or (placed not in (None, host_id) and owner_host(lease) != host_id)
    ]


def hand_over(db: Database, folder: str, from_host: str, to_host: str) -> bool:
    """``from_host``'s hold of ``folder`` becomes ``to_host``'s, mounts and all (hosts of one
    machine share its mounts); False when ``from_host`` no longer held it."""
    with db.write() as session:
        moved = session.execute(
            update(VolumeHoldRow)
            .where(VolumeHoldRow.folder == folder, VolumeHoldRow.host_id == from_host)
            .values(host_id=to_host, held_at=db_now(session))
        )
    return changed_rows(moved) == 1
