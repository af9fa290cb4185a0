"""Channels through the real worker: a message that arrives on one channel,
the agent's run in Docker, and every displayed message delivered by the
``deliver`` task on the ``delivery`` queue to the group's other channels,
with a flaky channel retried (Celery countdown) and still served once.

The channels live in the worker process (``fakes.channel:plugin``,
loaded through ``ORCHESTRATOR_CHANNEL_PLUGINS``) and write what they are
given to files the test reads.
"""

from __future__ import annotations

from pathlib import Path

from fakes.channel import read_file_channel
from orchestrator.model.parts import RECORD_KINDS
from orchestrator.run.ingest import IncomingMessage, ingest
from orchestrator.store.attachments import attach_channel
from orchestrator.store.deliveries import list_deliveries
from orchestrator.store.groups import ensure_main_group
from orchestrator.store.message_log import get_messages_after
from tests.conftest import wait_until

from .conftest import Stack

JID = "main@local"
ROOT = Path(__file__).resolve().parents[2]


def test_a_message_from_one_channel_reaches_the_others_once_each(stack: Stack) -> None:
    stack.env.update(
        {
            "ORCHESTRATOR_CHANNEL_PLUGINS": "fakes.channel:plugin",
            "ORCHESTRATOR_DELIVERY_RETRY_BASE_S": "0.3",
            "PYTHONPATH": str(ROOT),
        }
    )
    ensure_main_group(stack.db)
    for name in ("mirror-a", "mirror-b", "flaky"):
        attach_channel(stack.db, JID, name)
    stack.start_worker(concurrency=2)
    settings = stack.settings
    sent = ingest(
        stack.db,
        settings,
        IncomingMessage(chat_jid=JID, sender="ann", sender_name="Ann", content="$ echo mirrored", channel="mirror-a"),
        signal=stack.signals.group,
        signal_delivery=stack.signals.delivery,
    ).message

    def shown() -> list[int]:
        # Record parts (tool_use, the run's result_meta) are never delivered.
        return [m.seq for m in get_messages_after(JID, 0, db=stack.db) if m.part.kind not in RECORD_KINDS]

    def all_sent() -> bool:
        rows = list_deliveries(stack.db, chat_jid=JID)
        return len(shown()) >= 3 and len(rows) == 3 * len(shown()) - 1 and all(d.state == "sent" for d in rows)

    wait_until(
        all_sent,
        120,
        "every displayed message on every other channel",
        lambda: f"{list_deliveries(stack.db, chat_jid=JID)}\n{stack.worker_logs()}",
    )

    a, b, flaky = (read_file_channel(settings, n) for n in ("mirror-a", "mirror-b", "flaky"))
    texts = [r["text"] for r in b]
    assert texts[0] == "Ann: $ echo mirrored"
    assert texts[1].startswith("🔧 ✅ exit 0 · bash") and "mirrored" in texts[1]
    assert any(t.startswith("Andy: ") for t in texts[2:])
    assert [r["text"] for r in flaky] == texts  # the same history, despite two failures
    assert [r["text"] for r in a] == texts[1:]  # not echoed back to where it came from
    assert [r["seq"] for r in b] == shown()
    assert b[0]["origin_channel"] == "mirror-a" and b[0]["seq"] == sent.seq
    first = list_deliveries(stack.db, message_seq=sent.seq)
    assert sorted((d.channel, d.attempts) for d in first) == [("flaky", 3), ("mirror-b", 1)]
    assert "flaky is down (call 2)" in (next(d for d in first if d.channel == "flaky").last_error or "")
