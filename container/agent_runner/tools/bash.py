"""The ``bash`` tool: run one shell command in the workspace, bounded in time and output.

The command runs in its own session (process group) so that a timeout can
kill everything it started, not just the shell.  Output is read in a thread
while we wait, so a chatty command never blocks on a full pipe, and only the
first ``output_cap_bytes`` are kept so a runaway command cannot exhaust memory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

from ..providers.base import ToolSpec
from .base import NonBlank, ToolArgs, ToolContext, ToolOutcome

TIMEOUT_EXIT_CODE = 124  # what coreutils' timeout(1) returns
READ_CHUNK = 65536
# After the shell is gone, how long to wait for the reader to see EOF.
DRAIN_GRACE_S = 2.0

BASH_SPEC = ToolSpec(
    name="bash",
    description=(
        "Run a shell command with `bash -c` in the workspace directory and return its "
        "combined stdout and stderr plus the exit code. There is no network access. "
        "Each call is a fresh shell: state such as `cd` or variables does not persist, "
        "and background processes are stopped when the command returns."
    ),
    input_schema={
        "type": "object",
        "properties": {"command": {"type": "string", "description": "The command to run."}},
        "required": ["command"],
    },
)


class BashArgs(ToolArgs):
    command: NonBlank


def bash(args: BashArgs, ctx: ToolContext) -> ToolOutcome:
    output, exit_code = run_bash(
        args.command,
        cwd=resolve_cwd(ctx.workspace),
        timeout_s=ctx.limits.bash_timeout_s,
        output_cap_bytes=ctx.limits.output_cap_bytes,
    )
    return ToolOutcome(output, exit_code)


class _CappedReader:
    """Drain a pipe, keeping only the first ``cap`` bytes but counting all of them."""

    def __init__(self, stream: IO[bytes], cap: int) -> None:
        self._stream = stream
        self._cap = cap
        self._kept = bytearray()
        self.total = 0

    def drain(self) -> None:
        try:
            # A pipe from Popen: a BufferedReader, which has read1 (IO[bytes] does not).
            while chunk := self._stream.read1(READ_CHUNK):  # type: ignore[attr-defined]
                self.total += len(chunk)
                room = self._cap - len(self._kept)
                if room > 0:
                    self._kept += chunk[:room]
        except (OSError, ValueError):
            pass  # pipe closed under us: keep what we have
        finally:
            # Closed here, not by the caller: closing while this thread is
            # blocked in read1 would block the caller until EOF.
            self._stream.close()

    def text(self) -> str:
        return self._kept.decode("utf-8", errors="replace")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def resolve_cwd(workspace: Path) -> Path:
    """The workspace when it exists (in the image), else the current directory."""
    return workspace if workspace.is_dir() else Path.cwd()


def run_bash(
    command: str,
    *,
    cwd: Path,
    timeout_s: float,
    output_cap_bytes: int,
    drain_grace_s: float = DRAIN_GRACE_S,
) -> tuple[str, int]:
    """Run ``bash -c command``; return (merged output, exit code).

    Timeout -> the whole process group is killed and the exit code is 124.
    A signal death is reported as 128+N, like a shell does.
    """
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    assert proc.stdout is not None
    reader = _CappedReader(proc.stdout, output_cap_bytes)
    thread = threading.Thread(target=reader.drain, name="bash-output", daemon=True)
    thread.start()
    timed_out = False
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        returncode = proc.wait()
    # Stray background jobs would keep the pipe open (and outlive the call).
    _kill_group(proc.pid)
    # A process that left the group (setsid) may still hold the pipe: give
    # up waiting for EOF after a grace period and return what was read.
    thread.join(drain_grace_s)

    output = reader.text()
    if reader.total > output_cap_bytes:
        output += f"\n[output truncated: showing the first {output_cap_bytes} of {reader.total} bytes]"
    if timed_out:
        output += f"\n[timed out after {timeout_s:g}s; the command's process group was killed]"
        return output, TIMEOUT_EXIT_CODE
    exit_code = returncode if returncode >= 0 else 128 - returncode
    return output, exit_code
