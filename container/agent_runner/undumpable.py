"""The runner out of the agent's reach: ``prctl(PR_SET_DUMPABLE, 0)`` before anything else.

The agent's processes run as the runner's uid.  For the kernel, with no Yama
LSM on the host, the same uid is all one process needs to read and write
another's memory (``/proc/PID/mem``, ``ptrace``), read its environment and
take over its descriptors (``/proc/PID/fd``).  The runner holds what the agent
must never touch: the stream to the host that every event goes out on (stdout
of a one-shot container, the connection of a warm run), so an agent inside the
runner could forge any event (a reply, an edit, a file, its result and usage),
and, in a warm container, the host's clean-up counts on the runner being the
one process the agent did not start.

A process that is not dumpable answers all of that only to a process with
``CAP_SYS_PTRACE`` over it, and the agent has no capability at all
(``cap_drop=ALL``, ``no-new-privileges``): its ``/proc`` files belong to root,
``ptrace`` and ``pidfd_getfd`` are refused.  The flag is the process's (every
thread's) and only an ``execve`` sets it back, which the runner never does; a
child inherits it until its own ``execve``, so the agent's tools are ordinary,
dumpable processes that may debug each other, never the runner.  The Claude
Code CLI, the other process that speaks for the runner, is made undumpable by
its image instead (``Dockerfile.claude-code``: its binary is execute-only).
"""

from __future__ import annotations

import ctypes
import os

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def make_undumpable() -> None:
    """Set this process undumpable and check it took; raises OSError when it did not
    (the runner then refuses to run rather than run reachable)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(err)}")
    if (state := libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)) != 0:
        raise OSError(0, f"prctl(PR_GET_DUMPABLE) says {state} after setting 0")
