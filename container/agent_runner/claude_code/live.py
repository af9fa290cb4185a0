"""A Claude Code session kept open between the runs of a warm container.

Starting the CLI and resuming its session from disk costs about half a
second per run; a turn of a session that stays open costs a tenth of that
(``bench/claude_code.py``).  So a serving runner (``serve.py``) keeps the CLI
of its group's session running after a run and hands the next run's
messages to the same session (the SDK's streaming input), on an event loop
thread that outlives the run.

A CLI is started with what a session cannot change: the model and its
limits, the system prompt (the instructions and the memory), the tools
offered, the network settings, the gateway's address.  Together they are
the session's ``key``.  A run whose key differs, whose session id is not the
kept one (a first run, a reset, another session), or that finds the CLI gone
(the host's clean-up under gVisor or through ``docker exec``, an agent that
killed it, a crash) closes the kept CLI and starts a new one with the
session resumed from disk, as a one-shot run does.  A turn that fails
closes the session.

The host's clean-up after a warm run kills every process of the container
but the runner.  The runner names its CLI (``KeepEvent``: pid and start
time), and the host spares it only if it is still that process, and never
under gVisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from ..protocol import KeepEvent
from ..tools import ToolContext
from .mapping import Emit, EventMapper

log = logging.getLogger(__name__)

T = TypeVar("T")
CLOSE_TIMEOUT_S = 5.0


@dataclass
class Turn:
    """What one run's tools and hooks reach while the session answers it."""

    emit: Emit
    mapper: EventMapper
    ctx: ToolContext


class _Loop:
    """An event loop on a thread of its own, for the life of the process: a kept CLI's pipes
    and tasks belong to the loop that started it, so every run's turn runs there too."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="claude-code-loop", daemon=True).start()
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()


LOOP = _Loop()


def process_started(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``, the process's start in clock ticks after boot."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    # After the name: state is field 3, so field 22 is at index 19.
    return int(fields[19]) if fields[0] != b"Z" else None


class CliSession:
    """One Claude Code CLI and its client, opened on ``LOOP``; one turn at a time."""

    def __init__(self, key: str, session_id: str | None) -> None:
        self.key = key
        self.session_id = session_id
        self.turn: Turn | None = None  # the run the session answers now, for tools and hooks
        self._client: Any = None
        self._pid: int | None = None
        self._started: int | None = None

    async def open(self, client: Any) -> None:
        """Connect ``client`` (a ``ClaudeSDKClient``): the CLI starts and says hello."""
        await client.connect()
        self._client = client
        # The SDK's own child (not a listing of the container's processes, which the agent
        # could join with a CLI of its own): the transport's process, when the SDK has one.
        process = getattr(getattr(client, "_transport", None), "_process", None)
        pid = getattr(process, "pid", None)
        if isinstance(pid, int):
            self._pid, self._started = pid, process_started(pid)

    async def ask(self, prompt: str, turn: Turn) -> None:
        """One turn: ``prompt`` in, the SDK's messages to ``turn``'s mapper until the result."""
        self.turn = turn
        try:
            await self._client.query(prompt)
            async for message in self._client.receive_response():
                turn.mapper.feed(message)
        finally:
            self.turn = None

    def alive(self) -> bool:
        """Is the CLI this session started still running (the same process)?"""
        return self._pid is not None and self._started is not None and process_started(self._pid) == self._started

    def kept(self) -> KeepEvent | None:
        """The CLI as the host's clean-up should spare it; None when it cannot be named."""
        if self._pid is None or self._started is None or not self.alive():
            return None
        return KeepEvent(pid=self._pid, started=self._started)

    async def close(self) -> None:
        """End the CLI (its stdin closed, then terminated); what fails here is only logged."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            await asyncio.wait_for(client.disconnect(), CLOSE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a CLI that is gone already, or will not go
            log.info("closing Claude Code: %s", exc)
            if self._pid is not None and self.alive():
                with contextlib.suppress(OSError):
                    os.kill(self._pid, 9)


class Kept:
    """The serving runner's one kept session (a warm container belongs to one group)."""

    def __init__(self) -> None:
        self.enabled = False  # set by the serving runner only: a one-shot run ends with its CLI
        self.session: CliSession | None = None

    def take(self, key: str, session_id: str | None) -> CliSession | None:
        """The kept session if this run may go on with it, else None (and the kept one closed)."""
        session, self.session = self.session, None
        if session is None:
            return None
        if session.key == key and session_id is not None and session.session_id == session_id and session.alive():
            return session
        why = (
            "its settings changed"
            if session.key != key
            else "the CLI is gone"
            if not session.alive()
            else "another session is asked for"
        )
        log.info("restarting Claude Code: %s", why)
        LOOP.run(session.close())
        return None

    def keep(self, session: CliSession) -> None:
        self.session = session


KEPT = Kept()


async def closing_on_failure(session: CliSession, work: Callable[[], Awaitable[T]]) -> T:
    """``work()``; the session closed if it raises (a failed turn leaves no CLI to go on with)."""
    try:
        return await work()
    except BaseException:
        await session.close()
        raise
