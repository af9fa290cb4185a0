"""An inotify watch of one folder: a wait that returns when files were written or moved into it.

Two readers wait on folders of the data dir rather than poll them: the embedded broker's
consumers (``orchestrator/run/fs_transport.py``, a message file renamed into its folder)
and the chat streams of the embedded stack (``orchestrator/store/chat_listener.py``, a
chat's wake-up file closed after writing).  inotify comes from ``inotify_simple`` (a
wrapper of Linux's calls, no compiled code); where it cannot be had (not Linux, the
per-user instance or watch limit reached) making a watch raises ImportError or OSError
and the caller polls instead.

The kernel queues every event from the moment the watch exists, so a file that lands
between a look at the folder and the wait that follows is already queued when the
wait starts, and the wait returns at once: no wake-up is lost as long as the watch is
made before the first look.  A queue that overflowed (the kernel dropped events) and a
folder shared over a network filesystem (inotify sees this machine's writes only) are
why both readers keep a slow poll underneath.
"""

from __future__ import annotations

import os
from pathlib import Path


class FolderWatch:
    """The watch of ``folder``: :meth:`wait` gives the names of the files closed after
    writing (``closed``) or moved into it (``moved_in``) since the last wait."""

    def __init__(self, folder: str | Path, *, closed: bool = True, moved_in: bool = True) -> None:
        from inotify_simple import INotify, flags  # type: ignore[import-untyped]

        self._flags = flags
        self._inotify = INotify()
        mask = (flags.CLOSE_WRITE if closed else 0) | (flags.MOVED_TO if moved_in else 0)
        try:
            self._inotify.add_watch(str(folder), mask)
        except BaseException:
            self._inotify.close()
            raise
        self.pid = os.getpid()  # an inherited watch (across a fork) carries the parent's events too
        self.gone = False  # the folder was removed or unmounted: the watch is dead

    def wait(self, timeout_s: float) -> list[str]:
        """The names written or moved in, once at least one is there, or [] after ``timeout_s``."""
        names = []
        for event in self._inotify.read(timeout=max(0, int(timeout_s * 1000))):
            if event.mask & self._flags.IGNORED:
                self.gone = True
            elif event.name:
                names.append(event.name)
        return names

    def close(self) -> None:
        self._inotify.close()
