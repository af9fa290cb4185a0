"""Entry point of the sandbox image: ``python3 -m agent_runner``.

stdin: one ``ContainerInput`` JSON document, up to its first newline or its end,
then, while the run goes on, the host's beats (``fence.py``); or, with
``--serve SOCKET``, runs arrive on a unix socket (see ``serve.py``).
stdout: one protocol event per line, flushed at once; nothing else.
stderr: logs.
Exit codes: 0 success (last event ``ResultEvent``); 2 unusable input;
1 any other failure (last event ``ErrorEvent``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .one_run import make_emitter, run
from .undumpable import make_undumpable

# The only place the environment is read; everything below gets the path passed in.
DEFAULT_WORKSPACE = "/workspace"
WORKSPACE_ENV = "AGENT_WORKSPACE"
LOG_LEVEL_ENV = "AGENT_LOG_LEVEL"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get(LOG_LEVEL_ENV, "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # First, before any input, connection or child exists: the agent shares our uid.
    try:
        make_undumpable()
    except OSError as exc:
        logging.getLogger("agent_runner").error("refusing to run within the agent's reach: %s", exc)
        return 1
    parser = argparse.ArgumentParser(prog="agent_runner")
    parser.add_argument("--serve", metavar="SOCKET", help="warm mode: serve runs on this unix socket")
    parser.add_argument("--idle-timeout", type=float, default=300.0, help="warm mode: exit after this idle time")
    parser.add_argument(
        "--standby",
        type=float,
        metavar="SECONDS",
        help="a standby sandbox: wait this long for the first run (the host binds a group's "
        "workspace in first, then hands it the run); the idle timeout counts after it",
    )
    args = parser.parse_args(argv)
    workspace = Path(os.environ.get(WORKSPACE_ENV, DEFAULT_WORKSPACE))
    if args.serve:
        from .serve import serve

        return serve(Path(args.serve), workspace, args.idle_timeout, first_timeout_s=args.standby or 0.0)
    raw, host_fd = read_input()
    return run(raw, make_emitter(sys.stdout), workspace, host_fd=host_fd)


def read_input(fd: int = 0) -> tuple[bytes, int]:
    """The run's input: stdin's first line (or all of it, up to its end), and a descriptor
    of stdin for the host's fence (``fence.py``).  stdin itself becomes ``/dev/null``:
    the host's beats follow the input there, and nothing the agent starts may read
    (or hold) the stream the runner watches."""
    chunks: list[bytes] = []
    while chunk := os.read(fd, 1 << 20):
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])  # what follows is the host's beats
            break
        chunks.append(chunk)
    host_fd = os.dup(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    return b"".join(chunks), host_fd


if __name__ == "__main__":
    sys.exit(main())
