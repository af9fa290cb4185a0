"""The soak's checks (bench/soak.py ``check``) find what they claim to find.

The soak passes when this function finds nothing, so each invariant is shown
failing here on a real database (both backends): a 5xx, an acknowledged
message that was not stored, a trigger answered twice or never, a delivery
received twice or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench.soak import Receiver, Tally, check
from orchestrator.model.messages import SENDER_BOT
from orchestrator.store.db import Database
from orchestrator.store.message_log import now_iso, store_message_direct

CHAT = "soak0@bench"
INSTALL = "inst"


def _msg(db: Database, mid: str, **extra: Any) -> None:
    fields = {
        "sender": "talker0",
        "sender_name": "t",
        "is_from_me": False,
        "message_type": "user",
        "content": mid,
        **extra,
    }
    store_message_direct(db=db, id=mid, chat_jid=CHAT, timestamp=now_iso(), **fields)


def _reply(db: Database, mid: str) -> None:
    _msg(db, mid, sender=SENDER_BOT, sender_name="Andy", is_from_me=True, message_type="assistant")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def _tally(acked: list[str], triggers: list[str]) -> Tally:
    tally = Tally()
    tally.statuses["2xx"] = len(acked)
    tally.acked = set(acked)
    tally.triggers = {CHAT: triggers}
    return tally


def test_a_clean_soak_passes(db: Database, receiver: Receiver) -> None:
    _msg(db, "soak-t-1")
    _reply(db, "r1")
    _msg(db, "soak-c-1")
    _msg(db, "soak-t-2")
    _reply(db, "r2")
    assert (
        check(db, INSTALL, _tally(["soak-t-1", "soak-c-1", "soak-t-2"], ["soak-t-1", "soak-t-2"]), receiver, []) == []
    )


def test_each_broken_invariant_is_reported(db: Database, receiver: Receiver) -> None:
    _msg(db, "soak-t-1")
    _reply(db, "r1")
    _reply(db, "r1b")  # answered twice
    _msg(db, "soak-t-2")  # never answered
    tally = _tally(["soak-t-1", "soak-t-2", "soak-c-lost"], ["soak-t-1", "soak-t-2"])
    tally.note(502, "POST /api/messages: 502")
    receiver.seen.update({f"{INSTALL}-99": 2})  # a delivery no row names, received twice
    failures = check(db, INSTALL, tally, receiver, [])
    text = "\n".join(failures)
    assert "1 5xx" in text
    assert "1 lost ['soak-c-lost']" in text
    assert "2 trigger(s) not answered exactly once: ['soak-t-1: 2', 'soak-t-2: 0']" in text
    assert "1 received twice" in text and "1 unknown ids" in text
