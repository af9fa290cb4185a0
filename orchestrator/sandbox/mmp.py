"""ext4's multiple-mount protection (MMP): the storage's own fence between machines.

A fleet shares the data dir, and with it the groups' volume images; the database says
which host may mount one (``store/volume_holds.py``), but a database can be wrong about a
machine it cannot reach.  An image with the ``mmp`` feature carries a block that the
kernel that mounted it rewrites every :data:`UPDATE_INTERVAL_S` seconds; another kernel's
mount reads it twice, ``2 × 5 + 1`` seconds apart, and is refused while it changes
("Device is already active on another node").  A cleanly unmounted image says so in the
block and mounts at once; one whose machine died waits those 11 s, then mounts.

Here the host reads what the block says (no program run: the superblock's fields at their
documented offsets) and turns the feature on for an image made before it was used.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

# 2 s: the shortest that still makes the kernel's check interval its minimum, 5 s (twice
# the update interval, at least 5), so a refused or crashed mount waits 11 s; 1 s would
# write the block twice as often for no shorter wait.
UPDATE_INTERVAL_S = 2

_SUPERBLOCK_OFFSET = 1024
_LOG_BLOCK_SIZE = 0x18  # le32: block size = 1024 << this
_FEATURE_INCOMPAT = 0x60  # le32
_INCOMPAT_MMP = 0x100
_MMP_BLOCK = 0x168  # le64: the MMP block's number
_MMP_MAGIC = 0x004D4D50
# The sequence a clean unmount leaves, and the one e2fsck holds while it checks; anything
# else is a kernel's running count (or a mount that never ended: a crash).
SEQ_CLEAN = 0xFF4D4D50
SEQ_FSCK = 0xE24D4D50


@dataclass(frozen=True)
class MmpBlock:
    """What an image's MMP block says: its sequence and the node that wrote it last."""

    sequence: int
    node: str

    @property
    def in_use(self) -> bool:
        """A kernel may have it mounted (or did, and died): not cleanly let go of."""
        return self.sequence not in (SEQ_CLEAN, SEQ_FSCK)


def read_block(image: Path) -> MmpBlock | None:
    """The image's MMP block, or None when the feature is off (or the image is unreadable)."""
    try:
        fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        sb = os.pread(fd, 1024, _SUPERBLOCK_OFFSET)
        if len(sb) < 1024 or not struct.unpack_from("<I", sb, _FEATURE_INCOMPAT)[0] & _INCOMPAT_MMP:
            return None
        block_size = 1024 << struct.unpack_from("<I", sb, _LOG_BLOCK_SIZE)[0]
        number = struct.unpack_from("<Q", sb, _MMP_BLOCK)[0]
        raw = os.pread(fd, 128, number * block_size)
    except (OSError, struct.error, OverflowError):
        return None
    finally:
        os.close(fd)
    if len(raw) < 80 or struct.unpack_from("<I", raw, 0)[0] != _MMP_MAGIC:
        return None
    node = raw[16:80].split(b"\0", 1)[0].decode("utf-8", "replace")
    return MmpBlock(struct.unpack_from("<I", raw, 4)[0], node)


def mkfs_options() -> list[str]:
    """What ``mkfs.ext4`` is given for a new image to carry the feature."""
    return ["-O", "mmp", "-E", f"mmp_update_interval={UPDATE_INTERVAL_S}"]


def enable_argv(image: Path) -> list[str]:
    """The ``tune2fs`` command that turns the feature on for an image mounted nowhere."""
    return ["tune2fs", "-O", "mmp", "-E", f"mmp_update_interval={UPDATE_INTERVAL_S}", str(image)]
