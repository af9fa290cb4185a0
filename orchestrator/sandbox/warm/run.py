"""One run on a warm container: the input line written to its runner's socket, event lines read back.

The connection stays open for the run (the fence's beats go through it); the runner
closes it once it wrote the run's result and is back to waiting.  The run's "exit" is
0 while the runner lives on (the pipeline judges the events), else the container's own
exit status.  After the run, everything it left running is killed (:mod:`.cleanup`)
before the container may take another; a container that cannot be cleaned, or whose
run was killed, is removed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from docker.errors import DockerException, NotFound
from docker.models.containers import Container

from agent_runner.protocol import KeepEvent, ProtocolError, ResultEvent, parse_event
from orchestrator.core.errors import SandboxError
from orchestrator.sandbox.bounded_io import DEFAULT_MAX_LINE_BYTES, TailBuffer
from orchestrator.sandbox.containers import ContainerExit, ContainerSpec, StreamedRun
from orchestrator.sandbox.runtime import RUNC
from orchestrator.sandbox.warm.cleanup import clean_up

log = logging.getLogger(__name__)

# How a run's container was had (orchestrator_container_start_seconds{mode}).
StartMode = Literal["cold", "warm", "standby"]

# The runner's log lines a run's end reads back (Docker splits longer lines at 16 KiB).
LOG_TAIL_LINES = 200


class WarmRun(StreamedRun):
    """One run on a warm container; the same surface as ``sandbox.RunningContainer``.
    ``discard``: removes a container that must not take another run."""

    def __init__(
        self,
        container: Container,
        sock: socket.socket,
        spec: ContainerSpec,
        payload: bytes,
        *,
        start_mode: StartMode,
        dirty_marker: Path,
        discard: Callable[[Container], None],
    ) -> None:
        self._container = container
        self._sock = sock
        self._dirty = dirty_marker
        self._discard = discard
        self.spec = spec
        # How it was had: a new container, a warm one reused, or a standby one adopted (a metric's label).
        self.start_mode = start_mode
        self.cold = start_mode != "warm"  # its runner just started (the run's trace says so)
        self.exit = None
        self._started = datetime.now(UTC)
        self._killed = False
        # The runner closed the stream (not a read error), and the last line it wrote.
        self._closed_by_runner = False
        self._last_line = ""
        self._spare: KeepEvent | None = None  # the runner's own process to keep (its CLI)
        self._watch(f"warm run in {container.name}", spec.timeout_s)
        try:
            sock.sendall(payload + b"\n")
            self._beat(sock.sendall, spec.fence_s)  # the connection stays open for the run
        except OSError as exc:
            log.warning("could not hand the run to %s: %s", container.name, exc)

    def kill(self) -> None:
        self._killed = True
        with contextlib.suppress(DockerException):
            self._container.kill()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def keep(self, process: KeepEvent) -> None:
        """Spare ``process`` at the clean-up, under runc only: under gVisor the agent can
        write into the runner's streams (``/proc/1/fd``), so the event may be its own."""
        if self._container.attrs.get("HostConfig", {}).get("Runtime") == RUNC.name:
            self._spare = process
        else:
            log.info("not sparing process %d of %s: not under runc", process.pid, self._container.name)

    def _chunks(self) -> Iterator[bytes]:
        """The run's output as it comes, until the runner closes the connection."""
        try:
            while chunk := self._sock.recv(65536):
                yield chunk
            self._closed_by_runner = True
        except OSError as exc:
            log.warning("lost the warm run's stream from %s: %s", self._container.name, exc)

    def lines(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[str]:
        for line in super().lines(max_line_bytes):
            if line.strip():
                self._last_line = line
            yield line

    def _answered(self) -> bool:
        """The runner ended the run with its result and closed the stream itself: it is
        back to waiting for the next run (a runner that died, or ended with an error,
        says nothing of the kind)."""
        if self._killed or not self._closed_by_runner or not self._last_line:
            return False
        try:
            return isinstance(parse_event(self._last_line), ResultEvent)
        except ProtocolError:
            return False

    def _log_tail(self) -> str:
        """The end of the runner's log since the run started, read in bounded memory
        (the agent can write to the runner's stderr at will)."""
        tail = TailBuffer()
        # OSError: requests' errors too (the container may vanish mid-read: auto-remove).
        with contextlib.suppress(DockerException, OSError):
            # follow=False: streaming would otherwise follow a live container's log forever.
            stream = self._container.logs(
                stdout=False,
                stderr=True,
                since=self._started,
                tail=LOG_TAIL_LINES,
                stream=True,
                follow=False,
            )
            try:
                for chunk in stream:
                    tail.write(chunk)
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
        return tail.text()

    def finish(self) -> ContainerExit:
        """The run's "exit": 0 while the runner lives on (the pipeline judges the
        events), else the container's own exit status."""
        self._watchdog.cancel()
        self._stop_beats()
        if self._answered():
            # Alive, and a run that went well: no Docker API call, and its log stays in
            # Docker's (``docker logs``) rather than being copied into the worker's.
            return self._ended(str(self._container.name), 0, "")
        stderr = self._log_tail()
        try:
            self._container.reload()
            alive = self._container.status == "running"
        except DockerException:
            alive = False
        status: int | None = 0
        if self._killed or not alive:
            try:
                status = int(self._container.wait(timeout=10).get("StatusCode", -1))
            except NotFound:  # already gone (auto-remove)
                status = 137 if self._killed else -1
            except Exception as exc:  # noqa: BLE001 - any other failure here means "unknown" too
                log.warning("could not read the exit status of %s: %s", self._container.name, exc)
                status = 137 if self._killed else -1
            with contextlib.suppress(DockerException):
                self._container.remove(force=True)
        return self._ended(str(self._container.name), status, stderr)

    def _close(self) -> None:
        self._stop_beats()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._clean_up()

    def _clean_up(self) -> None:
        """Kill everything the run left behind (background and ``setsid``
        processes) before the container may take another run (:func:`.cleanup.clean_up`);
        a container that cannot be cleaned is removed.  Runs after the replies were stored."""
        if self._killed:
            self._discard(self._container)
            return
        try:
            clean_up(self._container, self.id, self._spare)
        except (DockerException, SandboxError, KeyError, ValueError) as exc:
            # Gone (idle exit, crash) or beyond cleaning: never reuse it.
            log.info("could not clean up warm container %s after a run (%s); removing it", self._container.name, exc)
            self._discard(self._container)
            return
        with contextlib.suppress(FileNotFoundError):
            self._dirty.unlink()
