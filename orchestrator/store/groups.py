"""Registered groups: the chats the agent serves, each with its own folder.

A group's folder name is a slug (letters, digits, ``-`` and ``_``): it names
the group's workspace under the data dir, so traversal and absolute paths are
refused here, before anything touches the filesystem.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from orchestrator.core.errors import ConfigError, Conflict, InvalidMessage, StoreError, UnknownGroup
from orchestrator.core.jsontypes import JsonObject
from orchestrator.model.messages import SENDER_HOST, NewMessage, StoredMessage
from orchestrator.store.db import Database, changed_rows, driver_execute
from orchestrator.store.deliveries import record_deliveries
from orchestrator.store.hosts import ALIVE_WINDOW_S, place_sql
from orchestrator.store.message_log import insert_message, now_iso
from orchestrator.store.schedules import TaskCounts, count_tasks
from orchestrator.store.tables import GroupRow

# A folder name (also the API's schema pattern, orchestrator/http/routes/groups.py).
FOLDER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_SLUG = re.compile(FOLDER_PATTERN)

MAIN_JID = "main@local"


class Group(BaseModel):
    model_config = ConfigDict(frozen=True)

    chat_jid: str
    name: str
    folder: str
    is_main: bool
    requires_trigger: bool
    assistant_name: str | None
    cursor_seq: int
    pending_seq: int
    session_id: str | None
    # Per-group sandbox limits and extra mounts, as stored: checked against
    # ContainerConfig (orchestrator/sandbox/config.py, a floor above) when set.
    container_config: JsonObject | None = None
    # The group's own quotas (orchestrator/store/usage.py): None means the
    # settings' (group_runs_per_hour, group_tokens_per_day), 0 no limit.
    runs_per_hour: int | None = None
    tokens_per_day: int | None = None
    # The host the group is placed on (orchestrator/store/placement.py); None: no place yet.
    # Signals follow it only while that host is up and beating.
    placed_host: str | None = None
    # The group's own profile (orchestrator/run/profile.py checks and changes it), each None
    # for the installation's setting: the model ("provider:model" as ORCHESTRATOR_MODEL
    # spells it), the output cap and thinking budget (ORCHESTRATOR_MAX_TOKENS,
    # ORCHESTRATOR_THINKING_BUDGET), the trigger names that replace the installation's
    # (ORCHESTRATOR_ASSISTANT_NAME and ORCHESTRATOR_TRIGGER_ALIASES; the group's
    # assistant_name wakes it either way), and the optional tools its agent has
    # (agent_runner.protocol.OPTIONAL_TOOLS; None: all of them).
    model: str | None = None
    max_tokens: int | None = None
    thinking_budget: int | None = None
    trigger_names: list[str] | None = None
    tools: list[str] | None = None
    # Who may answer the agent's questions (platform identities: the sender ids its channels
    # give; orchestrator/run/questions.py); None: anyone in the chat.
    approvers: list[str] | None = None
    # Moves whenever a stored message of the chat changes or goes (the database's triggers,
    # revision 0027): the history a worker kept for the group is good while it stays the same
    # (orchestrator/run/history_cache.py).
    history_rev: int = 0


def group_from_row(row: GroupRow) -> Group:
    return group_from_values(tuple(getattr(row, column) for column in GROUP_COLUMNS))


# get_group as one fixed read on the driver: it runs twice in every run (docs/performance.md).
GROUP_COLUMNS = (
    "chat_jid",
    "name",
    "folder",
    "is_main",
    "requires_trigger",
    "assistant_name",
    "cursor_seq",
    "pending_seq",
    "session_id",
    "container_config",
    "runs_per_hour",
    "tokens_per_day",
    "placed_host",
    "model",
    "max_tokens",
    "thinking_budget",
    "trigger_names",
    "tools",
    "approvers",
    "history_rev",
)
# The JSON columns: the driver's own read gives their text on SQLite.
_JSON_COLUMNS = ("container_config", "trigger_names", "tools", "approvers")
_GET_GROUP = f"SELECT {', '.join(GROUP_COLUMNS)} FROM groups WHERE chat_jid = :chat_jid"


def group_from_values(values: tuple[Any, ...]) -> Group:
    row = dict(zip(GROUP_COLUMNS, values, strict=True))
    # An ORM row's values, or the driver's own: SQLite gives 0/1 for a boolean and the JSON columns' text.
    for column in _JSON_COLUMNS:
        value = row[column]
        row[column] = json.loads(value) if isinstance(value, str) else value
    row["is_main"] = bool(row["is_main"])
    row["requires_trigger"] = bool(row["requires_trigger"]) and not row["is_main"]
    return Group(**row)


def validate_folder(folder: str) -> str:
    # fullmatch: "$" alone would let a trailing newline through.
    if not _SLUG.fullmatch(folder or ""):
        raise InvalidMessage(
            f"group folder {folder!r} must be 1-64 letters, digits, '-' or '_' (no slashes, dots or absolute paths)"
        )
    return folder


def add_group(
    db: Database,
    *,
    chat_jid: str,
    name: str,
    folder: str,
    is_main: bool = False,
    requires_trigger: bool = True,
    assistant_name: str | None = None,
) -> Group:
    """Register a chat as a group; raises Conflict (a StoreError) if the jid or folder is taken, or
    when ``is_main`` and another group is main (there is one main group)."""
    if not chat_jid:
        raise InvalidMessage("chat_jid must not be empty")
    validate_folder(folder)
    if is_main and (other := main_group(db)) is not None:
        raise Conflict(f"the main group is {other.chat_jid!r} already; there is one")
    row = GroupRow(
        chat_jid=chat_jid,
        name=name or chat_jid,
        folder=folder,
        is_main=is_main,
        # The main group answers every message; a trigger would only get in the way.
        requires_trigger=False if is_main else requires_trigger,
        assistant_name=assistant_name,
        cursor_seq=0,
        pending_seq=0,
        created_at=datetime.now(UTC),
    )
    try:
        with db.write() as session:
            session.add(row)
    except IntegrityError as exc:
        # With is_main, also the database's own rule (revision 0017): another main group
        # written between our look and our insert.
        also = "; or another group is main (there is one)" if is_main else ""
        raise Conflict(f"group {chat_jid!r} or folder {folder!r} is already registered{also}") from exc
    return group_from_row(row)


def get_group(db: Database, chat_jid: str) -> Group:
    rows = db.read_fixed(_GET_GROUP, {"chat_jid": chat_jid})
    if not rows:
        raise UnknownGroup(chat_jid)
    return group_from_values(tuple(rows[0]))


class GroupProfile(Group):
    """What a group is, in one view: its registration, its sandbox, quotas, model, output cap,
    thinking budget, trigger names and tools as stored (None: the installation's), and its
    scheduled tasks counted.  ``orchestrator groups show`` and ``GET /api/groups/{chat_jid}``
    show it with what is in effect (``orchestrator/run/profile.py``: ``ProfileView``)."""

    tasks: TaskCounts = Field(description="The group's scheduled tasks by state.")


def group_profile(db: Database, chat_jid: str) -> GroupProfile:
    """The group's profile; UnknownGroup for a chat that is not a registered group."""
    group = get_group(db, chat_jid)
    return GroupProfile(**group.model_dump(), tasks=count_tasks(db, chat_jid))


def find_group(db: Database, chat_jid: str) -> Group | None:
    try:
        return get_group(db, chat_jid)
    except UnknownGroup:
        return None


def is_registered(db: Database, chat_jid: str) -> bool:
    """Whether ``chat_jid`` is a registered group (see :func:`registered_chats`)."""
    return chat_jid in registered_chats(db, (chat_jid,))


def registered_chats(db: Database, chat_jids: Collection[str]) -> set[str]:
    """Which of ``chat_jids`` are registered groups.

    The API asks it before storing posted messages, once for the posts it stores
    together (http/write_batches.py): one fixed statement on the driver, outside any
    transaction (no write lock on SQLite, no BEGIN on PostgreSQL), where
    :func:`find_group`'s ORM read of the whole row cost more than the ingest
    that follows it (docs/performance.md, "The HTTP path")."""
    wanted = {f"c{i}": jid for i, jid in enumerate(sorted(set(chat_jids)))}
    if not wanted:
        return set()
    sql = f"SELECT chat_jid FROM groups WHERE chat_jid IN ({', '.join(':' + k for k in wanted)})"
    return {row[0] for row in db.read_fixed(sql, wanted)}


def list_groups(db: Database) -> list[Group]:
    with db.read() as session:
        # Byte order on both backends (PostgreSQL would use the database's collation).
        key = GroupRow.chat_jid if db.is_sqlite else GroupRow.chat_jid.collate("C")
        return [group_from_row(r) for r in session.scalars(select(GroupRow).order_by(key))]


GROUP_SETTINGS = frozenset({"name", "requires_trigger", "assistant_name", "runs_per_hour", "tokens_per_day"})
# The quotas a group may set for itself: a count >= 0 (0: no limit), or None (the settings').
GROUP_QUOTAS = ("runs_per_hour", "tokens_per_day")
# Largest quota a column holds (a 32-bit INTEGER on PostgreSQL).
MAX_QUOTA = 2**31 - 1


def update_group(db: Database, chat_jid: str, changes: Mapping[str, object]) -> Group:
    """Change a group's name, trigger rule, assistant name or quotas (None clears an override).

    Only the keys in ``GROUP_SETTINGS``, checked here (the API hands over the
    fields a client sent); the folder, main flag and cursors never change
    here.  Raises UnknownGroup or InvalidMessage (nothing changed).
    """
    unknown = sorted(set(changes) - GROUP_SETTINGS)
    if unknown:
        raise InvalidMessage(f"cannot change {', '.join(unknown)} of a group")
    if "name" in changes and not (isinstance(changes["name"], str) and changes["name"].strip()):
        raise InvalidMessage("a group's name must not be empty")
    for key in GROUP_QUOTAS:
        value = changes.get(key)
        if (
            key in changes
            and value is not None
            and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUOTA)
        ):
            raise InvalidMessage(f"{key} must be a whole number from 0 (no limit) to {MAX_QUOTA}, or null")
    with db.write() as session:
        row = session.get(GroupRow, chat_jid)
        if row is None:
            raise UnknownGroup(chat_jid)
        for key, value in changes.items():
            setattr(row, key, value)
        session.flush()
        return group_from_row(row)


# A group's own settings over the installation's (None: the installation's); an import never
# sets them (store/transfer.py).
OWN_SETTINGS = ("model", "max_tokens", "thinking_budget", "trigger_names", "tools", "approvers")
# What a change of a group's profile may set (orchestrator/run/profile.py checks the values).
PROFILE_COLUMNS = GROUP_SETTINGS | {"container_config", *OWN_SETTINGS}


@dataclass(frozen=True, slots=True)
class ProfileNote:
    """What a change of a group's profile tells its chat, decided from the group before
    and after the change (see :func:`store_profile`)."""

    # The host message's text; None: nothing changed, and nothing is stored.
    text: str | None
    # The group's model changed: its session is forgotten with the change.
    forget_session: bool = False


@dataclass(frozen=True, slots=True)
class ProfileStored:
    group: Group  # as changed
    note: ProfileNote
    # The host message stored with the change (None: nothing changed); its deliveries are
    # queued, and a deliverer is the caller's to signal.
    message: StoredMessage | None


def store_profile(
    db: Database, chat_jid: str, changes: Mapping[str, object], *, note: Callable[[Group, Group], ProfileNote]
) -> ProfileStored:
    """Change the group's profile as given (values checked by the caller: orchestrator/run/profile.py)
    and store ``note``'s host message in its chat with its deliveries, in one transaction.

    The group's row is locked to the commit (on PostgreSQL; SQLite's write transaction
    excludes other writers), so the message says what this change did to what was there.
    Raises UnknownGroup, or InvalidMessage for a column that is no part of a profile.
    """
    unknown = sorted(set(changes) - PROFILE_COLUMNS)
    if unknown:
        raise InvalidMessage(f"cannot change {', '.join(unknown)} of a group")
    with db.write() as session:
        row = session.get(GroupRow, chat_jid, with_for_update=True)
        if row is None:
            raise UnknownGroup(chat_jid)
        before = group_from_row(row)
        for key, value in changes.items():
            setattr(row, key, value)
        session.flush()
        after = group_from_row(row)
        told = note(before, after)
        if told.forget_session:
            row.session_id = None
            session.flush()
            after = group_from_row(row)
        if told.text is None:
            return ProfileStored(after, told, None)
        new = NewMessage(
            id=f"profile-{uuid.uuid4().hex}",
            chat_jid=chat_jid,
            sender=SENDER_HOST,
            sender_name="host",
            content=told.text,
            timestamp=now_iso(),
            is_from_me=True,
            message_type="host",
        )
        message, _ = insert_message(session, db, new)
        record_deliveries(session, message)
    return ProfileStored(after, told, message)


def ensure_main_group(db: Database, chat_jid: str = MAIN_JID) -> Group:
    """Create the main group (``chat_jid``) on first start; the one there is otherwise.

    Raises :class:`ConfigError` when ``chat_jid`` is registered as an ordinary group
    (its privileges are not widened behind anyone's back) or another chat is main.
    """
    groups = list_groups(db)
    existing = next((g for g in groups if g.chat_jid == chat_jid), None)
    if existing is not None:
        if not existing.is_main:
            raise ConfigError(
                f"{chat_jid!r} is registered as an ordinary group, not the main group; "
                "pick another ORCHESTRATOR_MAIN_GROUP or remove that group first"
            )
        return existing
    other = next((g for g in groups if g.is_main), None)
    if other is not None:
        raise ConfigError(
            f"the main group is {other.chat_jid!r} already, not {chat_jid!r} "
            "(ORCHESTRATOR_MAIN_GROUP names the one there is, or is left empty)"
        )
    taken = {g.folder for g in groups}
    folder = "main" if "main" not in taken else f"main-{hashlib.sha256(chat_jid.encode()).hexdigest()[:8]}"
    try:
        return add_group(db, chat_jid=chat_jid, name="main", folder=folder, is_main=True)
    except StoreError:
        # Another process created it between our look and our insert.
        return get_group(db, chat_jid)


def main_group(db: Database) -> Group | None:
    """The main group, if there is one."""
    return next((g for g in list_groups(db) if g.is_main), None)


def send_targets(db: Database, group: Group) -> list[str]:
    """The other chats a run of ``group`` may post to: every registered chat for main, none otherwise."""
    if not group.is_main:
        return []
    # On every main run's path: one fixed read of the names alone, in byte order as
    # list_groups gives them, with no ORM session nor transaction (docs/performance.md).
    return [jid for (jid,) in db.read_fixed(_CHAT_JIDS[db.is_sqlite]) if jid != group.chat_jid]


_CHAT_JIDS = {
    True: "SELECT chat_jid FROM groups ORDER BY chat_jid",
    False: 'SELECT chat_jid FROM groups ORDER BY chat_jid COLLATE "C"',
}


def send_refusal(db: Database, group: Group, target: str) -> str | None:
    """Why ``group``'s agent may not post to ``target`` (None: it may).

    A group may always post to its own chat; only the main group may post
    elsewhere, and only to registered chats.  Decided here, on the host:
    the container's own check is a courtesy, not a control.
    """
    if target == group.chat_jid:
        return None
    if not group.is_main:
        return f"a non-main group may only post to its own chat ({group.chat_jid}), not {target!r}"
    if find_group(db, target) is None:
        return f"{target!r} is not a registered chat"
    return None


def tool_refusal(group: Group, tool: str) -> str | None:
    """Why ``group``'s agent may not use the optional ``tool`` (None: it may).  Decided here,
    on the host, from the group's profile: the runner offers only the group's tools, but what
    the sandbox writes is not to be trusted."""
    if group.tools is None or tool in group.tools:
        return None
    return f"{tool} is not among this group's tools (orchestrator groups set --tools)"


# -- the run path's marks on a group (in the caller's transaction) ---------------------------


@dataclass(frozen=True, slots=True)
class Routing:
    """What ingest reads of a message's group, in its transaction (see :func:`routing`)."""

    is_main: bool
    requires_trigger: bool
    assistant_name: str | None
    # The group's own trigger names (None: the installation's).
    trigger_names: list[str] | None
    pending_seq: int
    cursor_seq: int
    # The host the group is placed on while that host takes groups (else None): where its
    # signal goes (orchestrator/store/placement.py), read here so the signal needs no look-up.
    place: str | None
    # The group's open question (orchestrator/run/questions.py): a reply may answer it, a
    # trigger expires it; and who may answer (None: anyone in the chat).
    open_question: str | None = None
    approvers: list[str] | None = None


_ROUTING = (
    "SELECT is_main, requires_trigger, assistant_name, trigger_names, pending_seq, cursor_seq, {place}, "
    "open_question, approvers "
    "FROM groups WHERE chat_jid = :chat_jid"
)
# PostgreSQL: lock the group row until the commit, so that "was the group idle?" is
# decided in the same order as the worker's cursor updates (which lock the row too).
# SQLite: the IMMEDIATE transaction already excludes them.
_ROUTING_SQL = {
    True: _ROUTING.format(place=place_sql(sqlite=True)),
    False: _ROUTING.format(place=place_sql(sqlite=False)) + " FOR UPDATE OF groups",
}


def routing(conn: Connection, chat_jid: str) -> Routing | None:
    """The group ``chat_jid`` as ingest decides on it, in the caller's transaction ``conn``
    (None: no registered group).  One fixed read on the driver, the group's row locked to
    the commit on PostgreSQL (ingest's hot path: docs/performance.md)."""
    sql = _ROUTING_SQL[conn.dialect.name == "sqlite"]
    row = driver_execute(conn, sql, {"chat_jid": chat_jid, "window": ALIVE_WINDOW_S}).fetchone()
    if row is None:
        return None
    is_main, requires_trigger, assistant_name, names, pending_seq, cursor_seq, place, question, approvers = row
    # The JSON columns as the driver gives them: their text on SQLite, the list on PostgreSQL.
    names = json.loads(names) if isinstance(names, str) else names
    approvers = json.loads(approvers) if isinstance(approvers, str) else approvers
    return Routing(
        bool(is_main),
        bool(requires_trigger),
        assistant_name,
        names,
        pending_seq,
        cursor_seq,
        place,
        question,
        approvers,
    )


_MARK_PENDING = "UPDATE groups SET pending_seq = :seq WHERE chat_jid = :chat_jid AND pending_seq < :seq"


def mark_pending(session: Session | Connection, chat_jid: str, seq: int) -> None:
    """Record, inside the caller's transaction (an ORM session or a Core connection), that
    ``seq`` should wake the agent: the group's ``pending_seq`` rises to it (never falls)."""
    conn = session.connection() if isinstance(session, Session) else session
    driver_execute(conn, _MARK_PENDING, {"chat_jid": chat_jid, "seq": seq})


def advance_cursor(session: Session, chat_jid: str, cursor_to: int) -> None:
    """Move the group's cursor up to ``cursor_to`` (never back), in the caller's transaction."""
    session.execute(
        update(GroupRow)
        .where(GroupRow.chat_jid == chat_jid, GroupRow.cursor_seq < cursor_to)
        .values(cursor_seq=cursor_to)
    )


def clear_session(db: Database, chat_jid: str) -> None:
    """Forget the group's model session: its next run starts a new one."""
    with db.write() as session:
        session.execute(update(GroupRow).where(GroupRow.chat_jid == chat_jid).values(session_id=None))


def store_container_config(db: Database, chat_jid: str, config: JsonObject | None) -> bool:
    """Store the group's container config as given (checked by ``sandbox/config.py``, a floor
    above; None clears it); False when there is no such group."""
    with db.write() as session:
        updated = changed_rows(
            session.execute(update(GroupRow).where(GroupRow.chat_jid == chat_jid).values(container_config=config))
        )
    return bool(updated)
