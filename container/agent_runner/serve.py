"""Warm mode: serve runs on a unix socket until idle.

``python3 -m agent_runner --serve SOCKET --idle-timeout S`` keeps the
interpreter, imports and provider clients warm between runs of one group.
The socket lives in the workspace (the host passes
``/workspace/.orchestrator/agent.sock``), which the host also sees, so any
worker process on the host can hand a run to this container: connect, write one
``ContainerInput`` JSON line, read event lines until the runner closes the
connection (after the ``result`` or ``error`` event).  One run at a time, as
the host's group lease already guarantees.  With no run for ``S`` seconds
the process exits (and the container, started with auto-remove, is gone).

A standby sandbox (``--standby``, orchestrator/sandbox/standby.py) serves on a
socket outside the workspace, in a small tmpfs of its own, and waits longer for
its first run (``--standby SECONDS``): it belongs to no group until the host binds a
group's workspace over its empty ``/workspace`` (mount propagation makes the
late bind visible here) and hands it that group's run.  Every path is looked
up afresh per run (no working directory is kept), so the bound workspace is
what the run sees.

What stays between runs: the interpreter, its imports and relays, and a Claude
Code CLI with its session open (``claude_code/live.py``), named to the host so
that its clean-up spares it.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from .claude_code.live import KEPT
from .one_run import run  # the same run function as the one-shot mode
from .protocol import Event, dump_event

log = logging.getLogger("agent_runner")

# A run's input is one line; bound it so a confused client cannot eat memory.
MAX_INPUT_BYTES = 64 * 1024 * 1024


def _read_line(conn: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            break
        if b"\n" in chunk:
            chunks.append(chunk[: chunk.index(b"\n")])
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_INPUT_BYTES:
            raise ValueError("run input too large")
    return b"".join(chunks)


def _reap_children() -> None:
    """Collect exited children.  The runner is PID 1: every process a run left
    behind is re-parented to it, and the host kills them after each run
    (orchestrator/warm.py); unreaped, they would stay zombies and eat the
    container's pids limit."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(socket_path: Path, workspace: Path, idle_timeout_s: float, *, first_timeout_s: float = 0.0) -> int:
    """Serve runs until idle for ``idle_timeout_s``; the first run is waited for
    ``first_timeout_s`` (0: as long as the idle timeout)."""

    KEPT.enabled = True  # runs to come: a Claude Code session may stay open between them
    socket_path.parent.mkdir(parents=True, exist_ok=True)
    if socket_path.exists() or socket_path.is_symlink():
        socket_path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(socket_path))
    os.chmod(socket_path, 0o600)
    server.listen(1)
    server.settimeout(idle_timeout_s if first_timeout_s == 0.0 else first_timeout_s)
    log.info("serving runs on %s (idle timeout %.0fs)", socket_path, idle_timeout_s)
    served = 0
    try:
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                log.info("idle for %.0fs after %d run(s); exiting", idle_timeout_s, served)
                return 0
            server.settimeout(idle_timeout_s)
            _reap_children()  # the previous run's, killed by the host since
            try:  # the workspace as it is now: a standby's was bound in after this process started
                os.chdir(workspace)
            except OSError as exc:
                log.warning("cannot enter the workspace %s: %s", workspace, exc)
            with conn:
                conn.settimeout(None)
                try:
                    raw = _read_line(conn)
                except (OSError, ValueError) as exc:
                    log.warning("could not read a run input: %s", exc)
                    continue

                def emit(event: Event, conn: socket.socket = conn) -> None:
                    conn.sendall((dump_event(event) + "\n").encode())

                try:
                    # The connection stays open for the run: the host's beats come on it.
                    run(raw, emit, workspace, host_fd=os.dup(conn.fileno()))
                except OSError as exc:  # the host went away mid-run: wait for the next one
                    log.warning("lost the connection during a run: %s", exc)
                served += 1
            _reap_children()
    finally:
        server.close()
        try:
            socket_path.unlink()
        except OSError:
            pass
