"""What the run path asks of a sandbox: start an agent, read its lines, stop it.

Cold containers (:class:`~orchestrator.sandbox.containers.DockerSandbox`) and
warm ones (:class:`~orchestrator.sandbox.warm.WarmPool`) both fit; so does the
fake in ``fakes/sandbox.py``, which lets the pipeline's retry, cancel,
lost-lease and time-out logic be tested without Docker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Protocol

from agent_runner.protocol import KeepEvent
from orchestrator.sandbox.bounded_io import DEFAULT_MAX_LINE_BYTES
from orchestrator.sandbox.containers import ContainerExit, ContainerSpec


class AgentProcess(Protocol):
    """One started run: the agent's output lines and how it ended."""

    @property
    def id(self) -> str: ...

    def lines(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[str]:
        """Its stdout, one line at a time, each at most ``max_line_bytes``
        (:class:`~orchestrator.core.errors.OutputLimitExceeded` beyond)."""
        ...

    def kill(self) -> None:
        """Stop it now (a cancel, a lost lease, an output limit); safe to call twice."""
        ...

    def finish(self) -> ContainerExit:
        """Wait for the end: status, whether the sandbox's own time limit hit, stderr's tail."""
        ...

    def keep(self, process: KeepEvent) -> None:
        """The runner names a process of its own to keep for the next run (a warm container's
        clean-up may spare it; a container that ends with the run has nothing to keep)."""
        ...


class Sandbox(Protocol):
    def start(self, spec: ContainerSpec, payload: bytes) -> AbstractContextManager[AgentProcess]:
        """Start the agent on ``payload`` (a ContainerInput); leaving the context cleans up."""
        ...

    def expected_container(self, group_folder: str) -> str | None:
        """The id of the container the group's next run would most likely go to, known
        without asking anything (None: not known here).  A guess the run's row is written
        with (``running`` at once: one write less); :meth:`start` decides, and the run
        records the container it was really given when that is another."""
        ...
