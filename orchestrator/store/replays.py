"""Replays' rows, and what a run said as it was stored.

A replay (``orchestrator/run/replay.py``) is a row of ``runs`` with ``replay_of`` set,
and a row of ``replay_outputs`` for what it said: its outputs as the messages they would
have been, zlib-compressed JSON, kept there and never in ``messages``.  A chat run's
outputs are its stored messages, ids ``<run id>-NNNN``: :func:`run_messages` reads them
for a run diff (``orchestrator/run/run_diff.py``) and for a parked run's next attempt
(the outputs its earlier attempts stored, ``orchestrator/run/pipeline.py``).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
from sqlalchemy import select, update

from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.messages import MessageType, decode_part
from orchestrator.model.parts import Part
from orchestrator.store.db import Database, db_now
from orchestrator.store.runs import Run
from orchestrator.store.tables import MessageRow, ReplayOutputRow, RunRow


def add_replay(db: Database, *, replay_id: str, original: Run, model: str) -> None:
    """A queued replay of ``original`` (the same batch, no owner, no task yet) with ``model``
    (as ORCHESTRATOR_MODEL spells it), and its empty ``replay_outputs`` row, in one transaction."""
    with db.write() as session:
        now = db_now(session)
        session.add(
            RunRow(
                id=replay_id,
                chat_jid=original.chat_jid,
                state="queued",
                attempts=1,
                cursor_from=original.cursor_from,
                cursor_to=original.cursor_to,
                celery_task_id=None,
                owner=None,
                input_tokens=0,
                output_tokens=0,
                created_at=now,
                replay_of=original.id,
            )
        )
        session.add(ReplayOutputRow(run_id=replay_id, model=model))


def seconds_running(db: Database, run_id: str) -> float | None:
    """How long ``run_id`` has run, on the database's clock (None: it never started)."""
    with db.read() as session:
        started = session.scalar(select(RunRow.started_at).where(RunRow.id == run_id))
        return None if started is None else max(0.0, (db_now(session) - started).total_seconds())


def save_outputs(
    db: Database, run_id: str, outputs: Sequence[Mapping[str, Any]], copy_report: JsonObject | None
) -> None:
    """Keep what the replay ``run_id`` said (``outputs``, the messages they would have been)
    and what its workspace copy left out (None: no copy was made)."""
    data = zlib.compress(msgspec.json.encode(outputs))
    with db.write() as session:
        session.execute(
            update(ReplayOutputRow)
            .where(ReplayOutputRow.run_id == run_id)
            .values(outputs_json=data, copy_report=copy_report)
        )


def replay_outputs(db: Database, run_id: str) -> list[JsonObject]:
    """What the replay ``run_id`` said, as :func:`save_outputs` kept it ([]: nothing kept yet)."""
    with db.read() as session:
        data = session.scalar(select(ReplayOutputRow.outputs_json).where(ReplayOutputRow.run_id == run_id))
    if data is None:
        return []
    outputs: list[JsonObject] = msgspec.json.decode(zlib.decompress(data))
    return outputs


class RunMessage(NamedTuple):
    """One output of a chat run as it was stored (superseded or not)."""

    seq: int
    id: str
    sender: str
    sender_name: str
    content: str
    message_type: MessageType
    metadata: JsonObject | None

    @property
    def part(self) -> Part:
        """What this output is (``orchestrator.model.parts``), decoded on each read."""
        return decode_part(self.message_type, self.sender, self.metadata)


def run_messages(db: Database, run_id: str) -> list[RunMessage]:
    """The messages the chat run ``run_id`` stored (in any chat; superseded ones included:
    the record of what it said), in seq order."""
    with db.read() as session:
        rows = session.execute(
            select(
                MessageRow.seq,
                MessageRow.id,
                MessageRow.sender,
                MessageRow.sender_name,
                MessageRow.content,
                MessageRow.message_type,
                MessageRow.meta,
            )
            .where(MessageRow.id.like(f"{run_id}-%"))
            .order_by(MessageRow.seq)
        ).all()
    return [RunMessage(*row) for row in rows]  # type: ignore[arg-type]  # a str column; the store took only the Literal
