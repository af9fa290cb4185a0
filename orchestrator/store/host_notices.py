"""A 🏠 message stored once per occasion: what the host tells a chat about a wait.

A wait is seen again and again (each re-signal, each sweep): its message must be stored
and delivered the first time only, so it is keyed by an id the occasion determines and
inserted only if that id is new in the chat.  Never shown to the model (a host message).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.model.messages import SENDER_HOST, NewMessage, StoredMessage
from orchestrator.store.db import Database
from orchestrator.store.deliveries import record_deliveries
from orchestrator.store.message_log import insert_message


def store_once(
    db: Database,
    chat_jid: str,
    *,
    notice_id: str,
    content: str,
    at: datetime,
    metadata: dict[str, Any] | None = None,
) -> StoredMessage | None:
    """Store ``content`` as the host's message ``notice_id`` in ``chat_jid`` with its
    deliveries; None when that message is there already (then nothing is delivered again)."""
    new = NewMessage(
        id=notice_id,
        chat_jid=chat_jid,
        sender=SENDER_HOST,
        sender_name="host",
        content=content,
        timestamp=at.isoformat(),
        is_from_me=True,
        message_type="host",
        metadata=metadata,
    )
    with db.write() as session:
        msg, created = insert_message(session, db, new)
        if created:
            record_deliveries(session, msg)
    return msg if created else None
