"""Where a warm run's time goes on the host, step by step, in one process.

Warm runs of the real runner (the agent image, the offline model) driven
through ``Pipeline.drain_group`` with no broker and no worker process, as
``bench.overhead``'s in-process figure is.  Each step the pipeline and the
run attempt call (the lease, the reads, the input, the run's row, the
container had, the reply stored, the run's end) is timed by wrapping the
name the caller looks up, for this measurement only; printed: when each
step starts after the step began and how long it takes, medians over the
runs, nested as called, and when the reply was stored.

    .venv/bin/python -m bench.run_path [--runs 30]

What it cannot see: the message's way to a worker (the signal, the broker,
the pool child), which ``bench.overhead`` measures whole (message -> run
created).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time
import types
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import install
from orchestrator.core.settings import Settings
from orchestrator.run import attempt, chat_outputs, pipeline
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.run.outbound import ChannelRegistry
from orchestrator.sandbox import warm
from orchestrator.sandbox.containers import docker_client
from orchestrator.sandbox.image import ensure_agent_image
from orchestrator.store import leases
from orchestrator.store.groups import ensure_main_group

JID = "main@local"
# Methods timed besides the functions the two modules import by name.
METHODS: list[tuple[type, list[str]]] = [
    (pipeline.Pipeline, ["run_once", "_build_input", "_first_attempt", "_attempt", "_conclude", "_mounts"]),
    (warm.WarmPool, ["start"]),
    (leases.Heartbeat, ["__enter__", "__exit__"]),
    (chat_outputs.ChatOutputs, ["emit"]),
]


@dataclass
class Timeline:
    """The steps of the run being measured: (name, depth, start, duration), start from ``t0``."""

    t0: float = 0.0
    depth: int = 0
    marks: list[tuple[str, int, float, float]] = field(default_factory=list)

    def timed(self, label: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def step(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            self.depth += 1
            try:
                return call(*args, **kwargs)
            finally:
                self.depth -= 1
                self.marks.append((label, self.depth, started - self.t0, time.perf_counter() - started))

        return step


def instrument(timeline: Timeline) -> None:
    """Wrap the steps (for this process's measurement only)."""
    for module in (pipeline, attempt):
        for name, value in list(vars(module).items()):
            if (
                isinstance(value, types.FunctionType)
                and value.__module__.startswith("orchestrator.")
                and value.__module__ != module.__name__
            ):
                setattr(module, name, timeline.timed(f"{module.__name__.rsplit('.', 1)[1]}.{name}", value))
    pipeline.leases.take = timeline.timed("leases.take", leases.take)  # type: ignore[attr-defined]
    for cls, names in METHODS:
        for name in names:
            if hasattr(cls, name):
                setattr(cls, name, timeline.timed(f"{cls.__name__}.{name}", getattr(cls, name)))


def measure(
    data_dir: Path, image: str, runs: int
) -> tuple[list[float], dict[tuple[str, int], list[tuple[float, float]]]]:
    """Each warm run's whole step (s) and each step's (start, duration) per run."""
    timeline = Timeline()
    instrument(timeline)
    settings, db = install(data_dir, image, warm_idle_s=120)
    ensure_main_group(db)
    pool = warm.WarmPool(settings, docker_client(settings))
    runner = pipeline.Pipeline(settings, db, ChannelRegistry([]), sandbox=pool)
    totals: list[float] = []
    steps: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    try:
        for i in range(runs + 1):  # the first run makes the warm container
            ingest(db, settings, IncomingMessage(chat_jid=JID, sender="bench", content=f"ping {i}"), signal=None)
            timeline.marks.clear()
            timeline.t0 = time.perf_counter()
            runner.drain_group(JID)
            if i == 0:
                continue
            totals.append(time.perf_counter() - timeline.t0)
            seen: Counter[str] = Counter()
            for label, depth, start, took in timeline.marks:
                seen[label] += 1
                steps[(label if seen[label] == 1 else f"{label} #{seen[label]}", depth)].append((start, took))
    finally:
        pool.stop_all()
        db.dispose()
    return totals, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    settings = Settings.load(env_file=None)
    ensure_agent_image(docker_client(settings), settings)
    with tempfile.TemporaryDirectory() as tmp:
        totals, steps = measure(Path(tmp), settings.sandbox.agent_image, args.runs)
    print(f"a warm run's step in one process, n = {args.runs}: p50 {statistics.median(totals) * 1000:.2f} ms")
    print(f"{'starts at':>9} {'takes':>7}  step (median ms; nested as called)")
    for key in sorted(steps, key=lambda k: statistics.median(s for s, _ in steps[k])):
        label, depth = key
        values = steps[key]
        start = statistics.median(s for s, _ in values) * 1000
        took = statistics.median(t for _, t in values) * 1000
        print(
            f"{start:9.2f} {took:7.2f}  {'  ' * depth}{label}"
            + ("" if len(values) == args.runs else f" (in {len(values)} runs)")
        )
    # The first output stored is the reply (the step is found at whatever depth it was called).
    emitted = next((v for (name, _), v in steps.items() if name == "ChatOutputs.emit"), [])
    if emitted:
        print(f"the reply stored at {statistics.median(s + t for s, t in emitted) * 1000:.2f} ms (median)")


if __name__ == "__main__":
    main()
