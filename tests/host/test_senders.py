"""The sender vocabulary: which senders the model sees, which are stored only,
which are never stored, and which types each harness sender may store."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import InvalidMessage
from orchestrator.model.views import format_messages_for_sdk
from orchestrator.store.db import Database
from orchestrator.store.message_log import get_messages_after, store_message_direct

JID = "c@local"

# sender, message_type, seen by the model?
VOCABULARY = [
    ("system", "system", True),
    ("host", "host", False),
    ("bot", "assistant", True),
    ("deploy", "system", True),
    ("tui-user", "user", True),
    ("command_output", "tool_result", True),  # tool results stored before the agent's took "tool_result"
    ("thinking", "assistant", False),
    ("tool_use", "assistant", False),
    ("tool_result", "tool_result", True),  # the agent's tool results: the conversation's, as command_output's were
    ("result_meta", "assistant", False),
    ("+15551234567@s.whatsapp.net", "user", True),
]


def _store(db: Database, mid: str, sender: str, message_type: str) -> None:
    store_message_direct(
        db=db,
        id=mid,
        chat_jid=JID,
        sender=sender,
        sender_name=sender,
        content=f"from {sender}",
        timestamp="2026-11-26T10:00:00+00:00",
        message_type=message_type,
    )


def test_who_the_model_sees(db: Database) -> None:
    for i, (sender, kind, _) in enumerate(VOCABULARY):
        _store(db, f"m{i}", sender, kind)
    view = format_messages_for_sdk(get_messages_after(JID, 0, db=db))
    assert [m.content for m in view] == [f"from {s}" for s, _, seen in VOCABULARY if seen]


def test_system_notices_are_never_stored(db: Database) -> None:
    with pytest.raises(InvalidMessage, match="ephemeral and is never stored"):
        _store(db, "n", "system_notice", "system")
    assert get_messages_after(JID, 0, db=db) == []


@pytest.mark.parametrize(
    ("sender", "kind", "problem"),
    [
        ("bot", "user", "sender 'bot' stores assistant messages, not 'user'"),
        ("host", "assistant", "sender 'host' stores host messages, not 'assistant'"),
        ("command_output", "assistant", "sender 'command_output' stores tool_result messages"),
        ("system", "user", "sender 'system' stores system messages"),
        ("alice", "chat", "message_type 'chat' is not one of"),
    ],
)
def test_a_harness_sender_cannot_store_another_type(db: Database, sender: str, kind: str, problem: str) -> None:
    with pytest.raises(InvalidMessage, match=problem):
        _store(db, "x", sender, kind)
    assert get_messages_after(JID, 0, db=db) == []
