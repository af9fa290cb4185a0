"""Volume holds: one host at a time may have a group's volumes mounted.

A group's workspace and session folder can be ext4 images in the data dir
(``sandbox/quota.py``), and a fleet shares the data dir between machines.
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
from orchestrator.store.hosts import gone_for, owner_host
from orchestrator.store.tables import GroupRow, VolumeHoldRow

log = logging.getLogger(__name__)


def holder(db: Database, folder: str) -> str | None:
    with db.read() as session:
        return session.scalar(select(VolumeHoldRow.host_id).where(VolumeHoldRow.folder == folder))


def claim(db: Database, folder: str, host_id: str, *, gone_after_s: float) -> None:
    """Hold ``folder``'s volumes for ``host_id``, or raise :class:`VolumeHeldElsewhere`."""
    held_by = holder(db, folder)
    if held_by == host_id:
        return
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
            return
        assert held_by is not None  # a row that was there a moment ago is only ever replaced
    if gone_after_s > 0 and gone_for(db, {held_by}, gone_after_s):
        with db.write() as session:
            taken = session.execute(
                update(VolumeHoldRow)
                .where(VolumeHoldRow.folder == folder, VolumeHoldRow.host_id == held_by)
                .values(host_id=host_id, held_at=db_now(session))
            )
        if changed_rows(taken) == 1:
            log.warning(
                "took over the volumes of %s from host %s, gone for %.0fs or more", folder, held_by, gone_after_s
            )
            return
        return claim(db, folder, host_id, gone_after_s=gone_after_s)  # someone else moved first: look again
    raise VolumeHeldElsewhere(folder, held_by, gone_after_s)


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


def held_but_moved(db: Database, host_id: str) -> list[str]:
    """The folders whose volumes ``host_id`` holds while their group is placed on another host
    and no process of ``host_id`` holds its lease: to unmount and let go of."""
    with db.read() as session:
        rows = session.execute(
            select(VolumeHoldRow.folder, GroupRow.folder, GroupRow.placed_host, GroupRow.lease_owner)
            .outerjoin(GroupRow, GroupRow.folder == VolumeHoldRow.folder)
            .where(VolumeHoldRow.host_id == host_id)
        ).all()
    # A group removed since (no row): nothing will run it here again either.
    return [
        held
        for held, group, placed, lease in rows
        if group is None or (placed not in (None, host_id) and owner_host(lease) != host_id)
    ]
