"""A sandbox that runs nothing: each start plays the next script.

Implements ``orchestrator.sandbox.port.Sandbox`` so the pipeline's own logic
(retries, cancel, lost lease, time limits, output handling) is tested without
Docker.  A script says which event lines the "agent" writes, whether it then
hangs until killed, and how it ends; what the pipeline did to it (its spec,
its input, whether it was killed) is kept for the test to read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from agent_runner.protocol import ContainerInput, Event, decode_input, dump_event

from orchestrator.sandbox.containers import ContainerExit, ContainerSpec


@dataclass
class Script:
    events: list[Event] = field(default_factory=list)
    exit_code: int = 0
    timed_out: bool = False  # the sandbox's own time limit hit
    stderr: str = ""
    hang: bool = False  # after the events, write nothing until killed
    raise_after_events: BaseException | None = None  # e.g. the task queue's deadline


class FakeAgent:
    def __init__(self, script: Script, number: int) -> None:
        self.script = script
        self.id = f"fake-{number}"
        self.killed = threading.Event()
        self.started_reading = threading.Event()

    def __enter__(self) -> FakeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.killed.set()  # leaving the context cleans up, as a real sandbox does

    def lines(self, max_line_bytes: int = 0) -> Iterator[str]:
        self.started_reading.set()
        for event in self.script.events:
            yield dump_event(event)
        if self.script.raise_after_events is not None:
            raise self.script.raise_after_events
        if self.script.hang:
            # A real hung agent: nothing more until someone kills it (bounded, so a broken test ends).
            self.killed.wait(30)

    def kill(self) -> None:
        self.killed.set()

    def finish(self) -> ContainerExit:
        if self.killed.is_set():
            return ContainerExit(137, False, "killed")
        return ContainerExit(self.script.exit_code, self.script.timed_out, self.script.stderr)


class FakeSandbox:
    """Plays ``scripts`` in order, one per start; the last one again if there are more starts."""

    def __init__(self, *scripts: Script) -> None:
        assert scripts, "a fake sandbox needs at least one script"
        self.scripts = list(scripts)
        self.started: list[tuple[ContainerSpec, ContainerInput]] = []
        self.agents: list[FakeAgent] = []
        self.agent_started = threading.Event()

    def start(self, spec: ContainerSpec, payload: bytes) -> FakeAgent:
        script = self.scripts[min(len(self.started), len(self.scripts) - 1)]
        self.started.append((spec, decode_input(payload)))
        agent = FakeAgent(script, len(self.started))
        self.agents.append(agent)
        self.agent_started.set()
        return agent
