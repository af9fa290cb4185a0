"""The clean-up between two runs on a warm container: everything the last run left running, killed.

Done by the host, not by the runner, which shares its uid with the agent and so cannot
be trusted to do it.  Every process in the container's pid namespace but the runner is
killed (through a pidfd, so a recycled pid is never hit); where this worker cannot see
the container's processes (it runs in a pid namespace of its own) or may not read the
runner's namespace (a host user that is not root: the runner is undumpable), a ``docker
exec`` of ``kill -9 -1`` does it (all but PID 1, the runner).  The runner reaps the
zombies.  The runner's own kept process (``keep``: a Claude Code CLI with the group's
session open) is spared when it is still that process (its pid and start time); ``docker
exec`` spares nothing.
"""

from __future__ import annotations

import os
import signal
import time

from docker.models.containers import Container

from agent_runner.protocol import KeepEvent
from orchestrator.core.errors import SandboxError


def clean_up(container: Container, container_id: str, spare: KeepEvent | None) -> None:
    """Kill everything but the runner (and ``spare``) in ``container``; raises
    ``SandboxError`` (or Docker's error, ``KeyError``, ``ValueError``) when it cannot:
    the container must then never take another run."""
    runner_pid = int(container.attrs["State"]["Pid"])
    cleaned = kill_all_but(runner_pid, container_id, spare=spare)
    if cleaned is None:
        result = container.exec_run(["/bin/bash", "-c", "kill -9 -1 2>/dev/null; exit 0"], stdin=False)
        if result.exit_code != 0:
            raise SandboxError(f"exit status {result.exit_code}")
    elif not cleaned:
        raise SandboxError("processes kept appearing (a fork bomb?)")


def _stat(pid: str) -> tuple[str, int]:
    """A process's state and start time (clock ticks after boot)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[19])


def _spared(pid: str, spare: KeepEvent | None, stat: tuple[str, int]) -> bool:
    """Is ``pid`` the process ``spare`` names: started then, with that pid in the container
    (the last of ``NSpid``)?  A pid and a start time name one process since boot; its parent
    is not asked (any orphan of the agent's is the runner's child too)."""
    if spare is None or stat[1] != spare.started:
        return False
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("NSpid:"):
                return line.split()[-1] == str(spare.pid)
    return False


def kill_all_but(
    runner_pid: int, container_id: str, rounds: int = 20, *, spare: KeepEvent | None = None
) -> bool | None:
    """SIGKILL every process in the pid namespace of ``runner_pid`` (the
    runner of container ``container_id``) except the runner, and ``spare``
    (a process the runner named, by its pid in the container and its start).

    True when none is left (zombies aside), False when processes kept
    appearing for ``rounds`` rounds, None when this process cannot see the
    container's processes (or the pid is not that container's any more).
    """
    try:
        namespace = os.readlink(f"/proc/{runner_pid}/ns/pid")
        with open(f"/proc/{runner_pid}/cgroup") as fh:
            in_container = container_id in fh.read()
        # Never our own namespace: a stale pid must not make this kill the host's processes.
        if not in_container or namespace == os.readlink("/proc/self/ns/pid"):
            return None
    except OSError:
        return None
    for _ in range(rounds):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == runner_pid:
                continue
            try:
                fd = os.pidfd_open(int(entry))
            except OSError:
                continue
            try:
                # Checked after the pidfd is open: it names this very process.
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    stat = _stat(entry)
                    if stat[0] != "Z" and not _spared(entry, spare, stat):
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                        found = True
            except OSError:
                pass
            finally:
                os.close(fd)
        if not found:
            return True
        time.sleep(0.002)
    return False
