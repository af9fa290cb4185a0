"""Quotas and rate limits, counted by the database on its own clock.

**A group's quotas** (:func:`quota_wait`, :func:`group_usage`): runs started
in the last hour (``runs`` rows by ``created_at``) and model tokens (input +
output of the runs started since 00:00 UTC), against the group's own limits
(``groups.runs_per_hour``, ``groups.tokens_per_day``) or, where it has none
(NULL), the settings' (``ORCHESTRATOR_GROUP_RUNS_PER_HOUR``,
``ORCHESTRATOR_GROUP_TOKENS_PER_DAY``); 0 is no limit.  "Now" is the
database's (``hosts.database_now``), so workers whose clocks disagree judge a
group alike.  Over a quota the pipeline starts no run: the messages stay
pending, a 🏠 message (:func:`quota_message`, stored once per wait by
:func:`store_quota_notice`) says when the next run starts, and the run
starts once the quota frees: the oldest run of the hour turns an hour old,
or the UTC day ends.

**A sender's rate** (:func:`sender_retry_after`, :func:`record_sender_message`):
messages one sender sent into one chat in the last :data:`RATE_WINDOW_S`
seconds, checked by ingest inside its transaction before the message is
stored.  The count is not read from ``messages``: a message's ``timestamp``
is what its sender claims (an API client may send any; Telegram's is
Telegram's clock), so each accepted message also writes a ``sender_hits``
row stamped by the database, and the sender's rows older than the window
are deleted as new ones come (an idle sender keeps at most the limit's
worth).  Nothing of this runs while the limit is 0.  Keyed by (chat,
sender): sender ids are only unique within a channel, and the API's
(``cli-user``, ``web:Ann``) are chosen by the client.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, func, select

from orchestrator.core.settings import Settings
from orchestrator.model.messages import StoredMessage
from orchestrator.store.db import Database, driver_execute
from orchestrator.store.groups import Group
from orchestrator.store.host_notices import store_once
from orchestrator.store.hosts import database_now
from orchestrator.store.tables import RunRow

RUN_WINDOW = timedelta(hours=1)
DAY = timedelta(days=1)
# The sender rate limit's window: "messages per minute".
RATE_WINDOW_S = 60

QuotaName = Literal["runs_per_hour", "tokens_per_day"]


class QuotaWait(BaseModel):
    """A group over a quota: which one, and when (the database's clock) it frees."""

    model_config = ConfigDict(frozen=True)

    quota: QuotaName
    limit: int
    # Runs in the last hour, or tokens today.
    used: int
    # The database's time when this was measured, and when the next run may start.
    now: datetime
    until: datetime
    # Seconds from now to until (what a re-signal's countdown should be).
    wait_s: float

    @property
    def notice_id(self) -> str:
        """The id of this wait's 🏠 message: the same wait, checked again, stores nothing new."""
        return f"quota-{self.quota}-{self.until:%Y%m%dT%H%M%S%f}"


class GroupUsage(BaseModel):
    """A group's use of its quotas (``orchestrator groups usage``, ``GET /api/groups/{jid}/usage``)."""

    model_config = ConfigDict(frozen=True)

    chat_jid: str
    # The database's clock.
    now: datetime
    runs_last_hour: int
    # The limit in force (0: none) and the group's own, if it has one (None: the setting's).
    runs_per_hour: int
    runs_per_hour_override: int | None
    # Input + output tokens of the runs started since 00:00 UTC.
    tokens_today: int
    tokens_per_day: int
    tokens_per_day_override: int | None
    # The setting every sender of every chat is held to at ingest (0: none).
    sender_messages_per_minute: int
    # Over a quota: which, and when it frees; None: the next run may start now.
    waiting: QuotaWait | None


def effective_quotas(settings: Settings, group: Group) -> tuple[int, int]:
    """(runs per hour, tokens per day) in force for ``group``; 0: no limit."""
    runs = settings.quotas.group_runs_per_hour if group.runs_per_hour is None else group.runs_per_hour
    tokens = settings.quotas.group_tokens_per_day if group.tokens_per_day is None else group.tokens_per_day
    return runs, tokens


def group_usage(db: Database, settings: Settings, group: Group) -> GroupUsage:
    """What ``group`` used of its quotas, by the database's clock, and whether it must wait."""
    runs_limit, tokens_limit = effective_quotas(settings, group)
    now = database_now(db)
    hour_ago = now - RUN_WINDOW
    day_start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    of_group = RunRow.chat_jid == group.chat_jid
    in_hour = (of_group, RunRow.created_at > hour_ago)
    waits: list[QuotaWait] = []
    with db.read() as session:
        runs = session.execute(select(func.count()).select_from(RunRow).where(*in_hour)).scalar_one()
        tokens = session.execute(
            select(func.coalesce(func.sum(RunRow.input_tokens + RunRow.output_tokens), 0)).where(
                of_group, RunRow.created_at >= day_start
            )
        ).scalar_one()
        if runs_limit and runs >= runs_limit:
            # One run must leave the hour for each run over the limit, and one more to make room.
            oldest = session.execute(
                select(RunRow.created_at).where(*in_hour).order_by(RunRow.created_at).offset(runs - runs_limit).limit(1)
            ).scalar_one()
            waits.append(_wait("runs_per_hour", runs_limit, runs, now, oldest + RUN_WINDOW))
    if tokens_limit and tokens >= tokens_limit:
        waits.append(_wait("tokens_per_day", tokens_limit, int(tokens), now, day_start + DAY))
    return GroupUsage(
        chat_jid=group.chat_jid,
        now=now,
        runs_last_hour=runs,
        runs_per_hour=runs_limit,
        runs_per_hour_override=group.runs_per_hour,
        tokens_today=int(tokens),
        tokens_per_day=tokens_limit,
        tokens_per_day_override=group.tokens_per_day,
        sender_messages_per_minute=settings.quotas.sender_messages_per_minute,
        # Both quotas must free before a run starts: the later one decides.
        waiting=max(waits, key=lambda w: w.until) if waits else None,
    )


def _wait(quota: QuotaName, limit: int, used: int, now: datetime, until: datetime) -> QuotaWait:
    return QuotaWait(
        quota=quota, limit=limit, used=used, now=now, until=until, wait_s=max(0.0, (until - now).total_seconds())
    )


def quota_wait(db: Database, settings: Settings, group: Group) -> QuotaWait | None:
    """Why ``group``'s next run must wait, and until when (the database's clock); None: it may start now.

    What the pipeline asks before it starts a run (the messages stay pending
    meanwhile).  No query at all while neither quota is set for the group.
    """
    if effective_quotas(settings, group) == (0, 0):
        return None
    return group_usage(db, settings, group).waiting


def quota_message(wait: QuotaWait) -> str:
    """The 🏠 message's text (the renderer adds the 🏠): which quota, and when the next run starts."""
    # Rounded up to the minute: the run never starts before the time said.
    at = wait.until + timedelta(seconds=59, microseconds=999_999)
    at = at.replace(second=0, microsecond=0)
    days = (at.date() - wait.now.date()).days
    when = f"{at:%H:%M} UTC" + ("" if days == 0 else " tomorrow" if days == 1 else f" on {at:%Y-%m-%d}")
    if wait.quota == "runs_per_hour":
        what = f"reached its quota of {wait.limit:,} run{'' if wait.limit == 1 else 's'} per hour"
    else:
        what = f"used its quota of {wait.limit:,} model tokens for today (UTC)"
    return f"⏳ This group {what}; the next run starts at {when}. Messages sent meanwhile wait for it."


def store_quota_notice(db: Database, chat_jid: str, wait: QuotaWait) -> StoredMessage | None:
    """Store the 🏠 message of ``wait`` in ``chat_jid`` with its deliveries, once per wait.

    Returns the new message (then signal the chat's deliveries), or None when
    this wait's message is already stored (the same wait seen again: a
    re-signal, the sweeper).  Never shown to the model (a host message).
    """
    return store_once(
        db,
        chat_jid,
        notice_id=wait.notice_id,
        content=quota_message(wait),
        at=wait.now,
        metadata={"quota": wait.quota, "limit": wait.limit, "used": wait.used, "until": wait.until.isoformat()},
    )


# -- the sender rate limit (ingest's transaction) ------------------------------------------

# PostgreSQL: one sender's check-and-record is serialized by a transaction-scoped
# advisory lock (two-key space: never the message seq's one-key lock), taken
# before the seq lock, so two messages at once cannot both see room for one.
# SQLite: ingest's IMMEDIATE transaction already is.
_PG_SENDER_LOCK = "SELECT pg_advisory_xact_lock(726933, hashtext(:key))"
_WHERE = "chat_jid = :chat_jid AND sender = :sender AND at > "
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_SQLITE_SINCE = f"strftime('%Y-%m-%d %H:%M:%f', 'now', '-{RATE_WINDOW_S} seconds')"
# clock_timestamp(), not now(): a transaction that queued on the lock must not stamp the past.
_PG_NOW = "clock_timestamp()"
_PG_SINCE = f"clock_timestamp() - interval '{RATE_WINDOW_S} seconds'"
_SQL: dict[bool, dict[str, str]] = {
    is_sqlite: {
        "count": f"SELECT COUNT(*) FROM sender_hits WHERE {_WHERE}{since}",
        # Seconds from now until the hit at OFFSET :skip (oldest first) leaves the window.
        "frees": (f"SELECT {age} FROM sender_hits WHERE {_WHERE}{since} ORDER BY at LIMIT 1 OFFSET :skip"),
        "stored": "SELECT 1 FROM messages WHERE id = :id AND chat_jid = :chat_jid",
        "prune": f"DELETE FROM sender_hits WHERE chat_jid = :chat_jid AND sender = :sender AND at <= {since}",
        "record": f"INSERT INTO sender_hits (chat_jid, sender, at) VALUES (:chat_jid, :sender, {now})",
    }
    for is_sqlite, now, since, age in (
        (True, _SQLITE_NOW, _SQLITE_SINCE, f"(julianday(at) - julianday('now')) * 86400.0 + {RATE_WINDOW_S}"),
        (False, _PG_NOW, _PG_SINCE, f"EXTRACT(EPOCH FROM at - clock_timestamp()) + {RATE_WINDOW_S}"),
    )
}


def sender_retry_after(
    conn: Connection,
    db: Database,
    *,
    chat_jid: str,
    sender: str,
    message_id: str,
    limit: int,
) -> int | None:
    """Inside ingest's transaction, before the insert: whole seconds until ``sender`` may send
    into ``chat_jid`` again, or None when the message may be stored now.

    A message already stored (the same id again: a client's retry, a
    redelivered update) is never refused: ingest answers it as the duplicate
    it is.  ``limit`` > 0.
    """
    sql = _SQL[db.is_sqlite]
    keys: dict[str, Any] = {"chat_jid": chat_jid, "sender": sender}
    if not db.is_sqlite:
        driver_execute(conn, _PG_SENDER_LOCK, {"key": f"{len(chat_jid)}:{chat_jid}{sender}"})
    count = int(driver_execute(conn, sql["count"], keys).fetchone()[0])
    if count < limit:
        return None
    if driver_execute(conn, sql["stored"], {"id": message_id, "chat_jid": chat_jid}).fetchone() is not None:
        return None
    row = driver_execute(conn, sql["frees"], {**keys, "skip": count - limit}).fetchone()
    seconds = float(row[0]) if row is not None and row[0] is not None else float(RATE_WINDOW_S)
    return min(RATE_WINDOW_S, max(1, math.ceil(seconds)))


def record_sender_message(conn: Connection, db: Database, *, chat_jid: str, sender: str) -> None:
    """Inside ingest's transaction, after a new message was stored: count it in the
    sender's window (stamped by the database) and drop the sender's older rows."""
    sql = _SQL[db.is_sqlite]
    keys = {"chat_jid": chat_jid, "sender": sender}
    driver_execute(conn, sql["prune"], keys)
    driver_execute(conn, sql["record"], keys)
