"""A sandbox that runs nothing: each start plays the next script.

Implements ``orchestrator.sandbox.port.Sandbox`` so the pipeline's own logic
(retries, cancel, lost lease, time limits, output handling) is tested without
Docker.  A script says which event lines the "agent" writes, whether it then
hangs until killed, and how it ends; what the pipeline did to it (its spec,
its input, whether it was killed) is kept for the test to read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from agent_runner.protocol import ContainerInput, Event, KeepEvent, decode_input, dump_event
from orchestrator.sandbox.containers import ContainerExit, ContainerSpec


@dataclass
class Script:
    events: list[Event] = field(default_factory=list)
    exit_code: int = 0
    timed_out: bool = False  # the sandbox's own time limit hit
    stderr: str = ""
    hang: bool = False  # after the events, write nothing until killed
    raise_after_events: BaseException | None = None  # e.g. the task queue's deadline
    # After the events, wait for this before ending (a run the test holds open).
    gate: threading.Event | None = None
    # Called with each event's index before the agent writes it (the world changing mid-run).
    before_event: Callable[[int], None] | None = None


class FakeAgent:
    def __init__(self, script: Script, number: int, on_exit: Callable[[], None] | None = None) -> None:
        self.script = script
        self.id = f"fake-{number}"
        self.killed = threading.Event()
        self.started_reading = threading.Event()
        self.kept: list[KeepEvent] = []  # the processes the runner named to keep
        self._on_exit = on_exit

    def __enter__(self) -> FakeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.killed.set()  # leaving the context cleans up, as a real sandbox does
        if self._on_exit is not None:
            self._on_exit()

    def lines(self, max_line_bytes: int = 0) -> Iterator[str]:
        self.started_reading.set()
        for index, event in enumerate(self.script.events):
            if self.script.before_event is not None:
                self.script.before_event(index)
            yield dump_event(event)
        if self.script.raise_after_events is not None:
            raise self.script.raise_after_events
        if self.script.gate is not None:
            self.script.gate.wait(30)  # bounded, so a broken test ends
        if self.script.hang:
            # A real hung agent: nothing more until someone kills it (bounded, so a broken test ends).
            self.killed.wait(30)

    def kill(self) -> None:
        self.killed.set()

    def keep(self, process: KeepEvent) -> None:
        self.kept.append(process)

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
        # Agents started and not yet ended, and the most there ever were at once
        # (pipelines in several threads may share one fake).
        self.live = 0
        self.peak = 0
        self._lock = threading.Lock()

    def expected_container(self, group_folder: str) -> str | None:
        return None  # each agent is its own "container", made when it starts

    def start(self, spec: ContainerSpec, payload: bytes) -> FakeAgent:
        with self._lock:
            script = self.scripts[min(len(self.started), len(self.scripts) - 1)]
            self.started.append((spec, decode_input(payload)))
            agent = FakeAgent(script, len(self.started), self._ended)
            self.agents.append(agent)
            self.live += 1
            self.peak = max(self.peak, self.live)
        self.agent_started.set()
        return agent

    def _ended(self) -> None:
        with self._lock:
            self.live -= 1
