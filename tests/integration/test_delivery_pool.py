"""Deliveries never wait for agent runs (issue 14): with the agent queue and
the delivery queue consumed by separate workers, as ``orchestrator up`` and
compose run them, a message reaches a group's other channels while the only
agent slot is busy with a long run.

Real worker processes, a real run in Docker, the file channels of
``fakes.channel`` (read from the worker's process), both backends.
"""

from __future__ import annotations

import time
from pathlib import Path

from fakes.channel import read_file_channel
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.attachments import attach_channel
from orchestrator.store.groups import add_group
from orchestrator.store.runs import list_runs
from tests.conftest import wait_until

from .conftest import Stack

ROOT = Path(__file__).resolve().parents[2]
BUSY, QUIET = "busy@g.us", "quiet@g.us"


def test_a_delivery_goes_out_while_every_agent_slot_is_busy(stack: Stack) -> None:
    stack.env.update({"ORCHESTRATOR_CHANNEL_PLUGINS": "fakes.channel:plugin", "PYTHONPATH": str(ROOT)})
    add_group(stack.db, chat_jid=BUSY, name="busy", folder="busy", requires_trigger=False)
    add_group(stack.db, chat_jid=QUIET, name="quiet", folder="quiet", requires_trigger=True)
    attach_channel(stack.db, QUIET, "mirror-b")
    stack.start_worker(concurrency=1, queues=("agent",))
    stack.start_worker(concurrency=1, queues=("delivery",))
    settings = stack.settings

    # The only agent slot: a run that sleeps.
    ingest(
        stack.db,
        settings,
        IncomingMessage(chat_jid=BUSY, sender="ann", content="$ sleep 8"),
        signal=stack.signals.group,
        signal_delivery=stack.signals.delivery,
    )

    def busy_state() -> str | None:
        runs = list_runs(stack.db, chat_jid=BUSY, limit=1)
        return runs[0].state if runs else None

    wait_until(lambda: busy_state() == "running", 90, "the busy group's run to start", stack.worker_logs)

    # A message that wakes nobody (no trigger) but is shown on the quiet group's channel.
    start = time.monotonic()
    ingest(
        stack.db,
        settings,
        IncomingMessage(chat_jid=QUIET, sender="bob", sender_name="Bob", content="just chatting", channel="mirror-a"),
        signal=stack.signals.group,
        signal_delivery=stack.signals.delivery,
    )
    wait_until(lambda: bool(read_file_channel(settings, "mirror-b")), 30, "the delivery to mirror-b", stack.worker_logs)
    latency = time.monotonic() - start
    assert busy_state() == "running", "the delivery waited for the run to end"
    assert [r["text"] for r in read_file_channel(settings, "mirror-b")] == ["Bob: just chatting"]
    print(f"delivery latency with every agent slot busy: {latency * 1000:.0f} ms")
    wait_until(lambda: busy_state() == "succeeded", 90, "the busy run to end", stack.worker_logs)
