"""Files on this machine's side of the command line: one to send, opened and checked before
anything is sent; one received, saved in a downloads folder without replacing anything.

Both ``orchestrator send`` (``--file``, ``--wait``) and ``orchestrator chat`` (``/file``, a
reply's files) use them.  Nothing here is imported before a command needs it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, NamedTuple


class LocalFile(NamedTuple):
    """A file opened to send: the name it is sent under, its handle and its size."""

    name: str
    file: BinaryIO
    size: int


def open_local_file(path: str) -> LocalFile:
    """``path`` opened for reading: a regular file (a FIFO or a device is refused, never waited
    on), readable now.  Raises :class:`ValueError` naming the path and why."""
    try:
        # O_NONBLOCK: a FIFO (or a device) is refused below, not waited on.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    file: BinaryIO = os.fdopen(fd, "rb")
    try:
        file.read(0)
    except OSError as exc:
        file.close()
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    return LocalFile(name=os.path.basename(path.rstrip("/")) or "file", file=file, size=st.st_size)


def save_download(folder: Path, name: str, fetch: Callable[[Callable[[bytes], object]], int]) -> Path:
    """Create a file for ``name`` in ``folder`` (made if missing) and fill it with what
    ``fetch`` hands its writer; the path.  The name is made safe (``safe_name``: no folders, no
    leading dot, no control characters), so the file is always directly in ``folder``; it is
    created with ``O_EXCL`` and ``O_NOFOLLOW`` relative to the folder's descriptor, taking the
    first free one of ``numbered_names``: nothing there is replaced, no link is followed.  A
    failed download leaves no file."""
    from orchestrator.store.file_names import numbered_names, safe_name

    folder.mkdir(parents=True, exist_ok=True)
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for candidate in numbered_names(safe_name(name)):
            try:
                fd = os.open(
                    candidate,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o666,
                    dir_fd=dir_fd,
                )
            except FileExistsError:
                continue
            break
        else:
            raise FileExistsError(f"every numbered name for {name!r} is taken in {folder}")
        try:
            with os.fdopen(fd, "wb") as out:
                fetch(out.write)
        except BaseException:
            os.unlink(candidate, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)
    return folder / candidate
