"""A file the agent hands its chat (``send_file``), taken out of the workspace into the file store.

The path comes from the container, and the workspace is the agent's (``hostile_fs``): the
file is opened by descriptor from the workspace down, no symlink followed on the way
(``..`` and absolute paths refused), non-blocking (a FIFO cannot hang the worker), and
accepted only when ``fstat`` of the open descriptor says it is a regular file.  Its size is
checked on that descriptor before a byte is read (a 2 GiB sparse file is refused at once),
and no more than the per-file limit plus one byte is ever read from it (a file that grows
while it is read is still refused by the store's own count).  The bytes are stored like
a person's upload (``store/files.py``): content-addressed, the type sniffed, the name
(the path's last part) made safe, counted against the group's total.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import FileTooLarge
from orchestrator.sandbox.hostile_fs import open_regular, opened_root
from orchestrator.store.file_rows import StoredFile
from orchestrator.store.files import CHUNK_BYTES, FileStore


def take_file(workspace: Path, relative: str, store: FileStore, chat_jid: str) -> StoredFile:
    """Store the regular file at ``relative`` below ``workspace`` as a file of ``chat_jid``.
    Raises :class:`~orchestrator.core.errors.HostileEntry` for what is no regular file
    reached without a link, :class:`FileTooLarge` past the per-file or the group's limit."""
    with opened_root(workspace) as root:
        fd = open_regular(root, relative)
    try:
        size = os.fstat(fd).st_size
        if size > store.max_bytes:
            raise FileTooLarge(f"{relative} is {size} bytes", store.max_bytes, "file_max_bytes")
        return store.store(chat_jid, _bounded(fd, store.max_bytes + 1), os.path.basename(relative.rstrip("/")))
    finally:
        os.close(fd)


def _bounded(fd: int, limit: int) -> Iterator[bytes]:
    """The file's bytes from its start, ``limit`` at most (the store refuses past its own)."""
    offset = 0
    while offset < limit:
        chunk = os.pread(fd, min(CHUNK_BYTES, limit - offset), offset)
        if not chunk:
            return
        offset += len(chunk)
        yield chunk
