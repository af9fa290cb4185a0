"""The closed sets of words the store keeps in text columns, held to the code and checked on read.

Each column's words are a ``Literal`` alias beside its data (``DeliveryState``,
``HostState``, ``RunState``, the scheduled tasks' three).  Two promises are held here:

* the alias is what the code writes and compares: every word the modules that use the
  column write into it or compare it with (keyword arguments, dict entries and
  assignments named after the column, comparisons and ``in_`` of the column, the
  column in SQL text) is one of the alias's, and every word of the alias is used;
* a word the code does not know, read from the database, is a ``StoreError`` naming the
  column and the word (``orchestrator/store/stored_literals.py``), on SQLite and
  PostgreSQL, by each way the rows are read.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import get_args

import pytest
from sqlalchemy import update

from orchestrator.core.errors import StoreError
from orchestrator.store import deliveries, delivery_changes, hosts, runs, schedules
from orchestrator.store.db import Database
from orchestrator.store.groups import add_group
from orchestrator.store.message_log import store_message_direct
from orchestrator.store.stored_literals import checked
from orchestrator.store.tables import DeliveryRow, HostRow, RunRow, ScheduledTaskRow

ROOT = Path(__file__).resolve().parents[2]

# -- the words the code uses ----------------------------------------------------------------


def _words_of(node: ast.expr | None, module: ModuleType) -> set[str]:
    """The words an expression stands for: a string, a module constant (a string or a
    collection of them), each branch of a conditional, each item of a literal collection."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        value = getattr(module, node.id, None)
        if isinstance(value, str):
            return {value}
        if isinstance(value, (tuple, list, set, frozenset)) and all(isinstance(v, str) for v in value):
            return set(value)
        return set()
    if isinstance(node, ast.IfExp):
        return _words_of(node.body, module) | _words_of(node.orelse, module)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {w for item in node.elts for w in _words_of(item, module)}
    return set()


def _is_column(node: ast.expr, column: str, table: str) -> bool:
    """``node`` reads the column: ``<x>.column`` where ``<x>`` is not another table's row
    class (``RunRow.state`` in the hosts module is the runs' column), or a name ``column``."""
    if isinstance(node, ast.Attribute) and node.attr == column:
        owner = node.value
        return not (isinstance(owner, ast.Name) and owner.id.endswith("Row") and owner.id != table)
    return isinstance(node, ast.Name) and node.id == column


def _sql_text(node: ast.expr, module: ModuleType) -> str | None:
    """A string or f-string's text, each ``{name}`` of a string constant filled in."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                parts.append(str(part.value))
            else:
                assert isinstance(part, ast.FormattedValue)
                words = _words_of(part.value, module)
                parts.append(next(iter(words)) if len(words) == 1 else "{?}")
        return "".join(parts)
    return None


def _sql_words(text: str, column: str) -> set[str]:
    words: set[str] = set()
    col = rf"\b{column}"
    for m in re.finditer(rf"{col}\s*(?:=|!=|<>)\s*'(\w+)'", text):
        words.add(m.group(1))
    for m in re.finditer(rf"{col}\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", text, re.IGNORECASE):
        words |= set(re.findall(r"'(\w+)'", m.group(1)))
    if re.search(rf"{col}\s*=\s*CASE\b", text):
        words |= set(re.findall(r"THEN\s+'(\w+)'", text))
    return words


def used_words(source: str, module: ModuleType, column: str, table: str, calls: tuple[str, ...] = ()) -> set[str]:  # noqa: C901 - an AST walk: one branch a node kind
    """Every word ``source`` (the text of ``module``) writes into ``column`` of ``table``
    (a row class's name) or compares it with; ``calls``: functions whose first positional
    argument is a word of the column (``Verdict("failed", ...)``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == column:
            found |= _words_of(node.value, module)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == column:
                    found |= _words_of(value, module)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                named = (isinstance(target, ast.Attribute) and target.attr == column) or (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.slice, ast.Constant)
                    and target.slice.value == column
                )
                if named:
                    found |= _words_of(node.value, module)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_column(o, column, table) for o in operands):
                for o in operands:
                    found |= _words_of(o, module)
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("in_", "not_in")
                and _is_column(func.value, column, table)
            ):
                for arg in node.args:
                    found |= _words_of(arg, module)
            elif isinstance(func, ast.Name) and func.id in calls and node.args:
                found |= _words_of(node.args[0], module)
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and (text := _sql_text(node, module)) is not None:
            found |= _sql_words(text, column)
    return found


@dataclass(frozen=True)
class Column:
    """A column's alias and where its words are used."""

    alias: object
    words: tuple[str, ...]  # the module's tuple of the alias's words
    column: str
    table: str  # its row class
    modules: tuple[str, ...]  # the modules that write or compare it
    calls: tuple[str, ...] = ()  # functions whose first argument is one of its words
    # Words written from a table of the code's own (typed with the alias)
    tabled: Callable[[], set[str]] = set

    def used(self) -> set[str]:
        found = self.tabled()
        for name in self.modules:
            module = importlib.import_module(name)
            assert module.__file__ is not None
            found |= used_words(Path(module.__file__).read_text(), module, self.column, self.table, self.calls)
        return found


def _task_transitions() -> set[str]:
    from orchestrator.run.schedules import _TRANSITIONS

    return {word for allowed, target in _TRANSITIONS.values() for word in (*allowed, target)}


_SCHEDULES = ("orchestrator.store.schedules", "orchestrator.run.schedules")
COLUMNS = [
    Column(
        deliveries.DeliveryState,
        deliveries.STATES,
        "state",
        "DeliveryRow",
        ("orchestrator.store.deliveries", "orchestrator.store.claims", "orchestrator.run.outbound"),
    ),
    Column(
        delivery_changes.ChangeState,
        delivery_changes.STATES,
        "state",
        "DeliveryChangeRow",
        ("orchestrator.store.delivery_changes", "orchestrator.store.claims", "orchestrator.run.outbound_changes"),
    ),
    Column(
        delivery_changes.ChangeKind,
        delivery_changes.KINDS,
        "kind",
        "DeliveryChangeRow",
        ("orchestrator.store.delivery_changes", "orchestrator.run.outbound_changes"),
    ),
    Column(hosts.HostState, hosts.STATES, "state", "HostRow", ("orchestrator.store.hosts",)),
    Column(
        runs.RunState,
        runs.RUN_STATES,
        "state",
        "RunRow",
        (
            "orchestrator.store.runs",
            "orchestrator.store.drafts",
            "orchestrator.store.leftovers",
            "orchestrator.store.slots",
            "orchestrator.store.replays",
            "orchestrator.run.attempt",
            "orchestrator.run.pipeline",
            "orchestrator.run.replay",
            "orchestrator.run.sweeper",
            "orchestrator.run.conclusion",
        ),
        calls=("Verdict",),
    ),
    Column(
        schedules.TaskState, schedules.TASK_STATES, "state", "ScheduledTaskRow", _SCHEDULES, tabled=_task_transitions
    ),
    Column(schedules.ScheduleKind, schedules.KINDS, "kind", "ScheduledTaskRow", _SCHEDULES),
    Column(schedules.ContextMode, schedules.CONTEXT_MODES, "context_mode", "ScheduledTaskRow", _SCHEDULES),
]


@pytest.mark.parametrize("col", COLUMNS, ids=[f"{c.table}.{c.column}" for c in COLUMNS])
def test_each_alias_is_the_words_its_code_uses(col: Column) -> None:
    assert col.words == get_args(col.alias)
    used = col.used()
    assert used - set(col.words) == set(), f"{col.table}.{col.column}: words used that the alias lacks"
    assert set(col.words) - used == set(), f"{col.table}.{col.column}: words of the alias no code uses"


def test_run_states_are_live_or_final() -> None:
    assert set(runs.LIVE_STATES) | runs.FINAL_STATES == set(runs.RUN_STATES)
    assert not set(runs.LIVE_STATES) & runs.FINAL_STATES


def test_task_counts_count_every_task_state() -> None:
    assert set(schedules.TaskCounts.model_fields) == set(schedules.TASK_STATES)


def test_the_survey_sees_a_word_the_alias_lacks() -> None:
    # The survey itself, fed code that writes, compares and selects words of its own.
    source = """
def f(session, row):
    session.execute(update(DeliveryRow).values(state="lost"))
    values = {"state": "gone" if row else PENDING}
    row.state = "odd"
    if row.state in ("strange", SENT):
        pass
    RunRow.state.in_(("not-mine",))
    DeliveryRow.state.not_in(["weird"])
    Verdict("judged")
    SQL = f"UPDATE deliveries SET state = 'zombie' WHERE state IN ('x', '{SENT}')"
"""
    found = used_words(source, deliveries, "state", "DeliveryRow", calls=("Verdict",))
    assert found == {"lost", "gone", "pending", "odd", "strange", "sent", "weird", "judged", "zombie", "x"}
    assert used_words(source, deliveries, "state", "DeliveryRow") == found - {"judged"}


# -- a word the code does not know, read back ---------------------------------------------------


def test_checked_names_the_column_and_the_word() -> None:
    assert checked(deliveries.STATES, "sent", "deliveries.state") == "sent"
    with pytest.raises(StoreError, match=r"deliveries\.state holds 'lost', which is not one of pending, sending"):
        checked(deliveries.STATES, "lost", "deliveries.state")
    with pytest.raises(StoreError, match="holds None"):
        checked(deliveries.STATES, None, "deliveries.state")


JID = "team@g.us"


def _set(db: Database, table: type, **values: str) -> None:
    with db.write() as session:
        session.execute(update(table).values(**values))


def test_an_unknown_delivery_state_is_refused(db: Database) -> None:
    add_group(db, chat_jid=JID, name="Team", folder="team")
    msg = store_message_direct(
        db=db, id="m1", chat_jid=JID, sender="ann", sender_name="Ann", content="hi", timestamp="2026-01-01T00:00:00Z"
    )
    with db.write() as session:
        deliveries.record_deliveries(session, msg, attached=[("log", None)])
    [row] = deliveries.list_deliveries(db)
    assert row.state == "pending"
    _set(db, DeliveryRow, state="lost")
    with pytest.raises(StoreError, match=r"deliveries\.state holds 'lost', which is not one of pending,"):
        deliveries.list_deliveries(db)
    with pytest.raises(StoreError, match=r"deliveries\.state holds 'lost'"):
        deliveries.outgoing(db, row.id)


def test_an_unknown_host_state_is_refused(db: Database) -> None:
    hosts.register(db, host_id="host-a", instance="1:aa", version="9", concurrency=1)
    assert [h.state for h in hosts.list_hosts(db)] == ["up"]
    assert hosts.gone_for(db, {"host-a"}, 60) == set()
    _set(db, HostRow, state="asleep")
    with pytest.raises(StoreError, match=r"hosts\.state holds 'asleep', which is not one of up, draining, stopped"):
        hosts.list_hosts(db)
    with pytest.raises(StoreError, match=r"hosts\.state holds 'asleep'"):
        hosts.gone_for(db, {"host-a"}, 60)


def test_an_unknown_run_state_is_refused(db: Database) -> None:
    run = runs.create_run(db, chat_jid=JID, cursor_from=0, cursor_to=1, celery_task_id=None, owner="host-a:1:aa")
    hosts.register(db, host_id="host-a", instance="1:aa", version="9", concurrency=1)
    assert [r.state for h in hosts.list_hosts(db) for r in h.runs] == ["queued"]
    _set(db, RunRow, state="paused")
    refusal = r"runs\.state holds 'paused', which is not one of queued, running, succeeded"
    readers: list[Callable[[], object]] = [
        lambda: runs.get_run(db, run.id),
        lambda: runs.list_runs(db),
        lambda: runs.run_state(db, run.id),
        lambda: runs.recent_run_ends(db, JID),
        lambda: runs.runs_changed(db, JID, live=[run.id], since=None),
        lambda: runs.unfinished_runs(db, JID),
        lambda: hosts.list_hosts(db),
    ]
    for read in readers:
        with pytest.raises(StoreError, match=refusal):
            read()
    assert runs.run_state(db, "no-such-run") is None


@pytest.mark.parametrize(
    ("column", "word", "refusal"),
    [
        ("state", "frozen", r"scheduled_tasks\.state holds 'frozen', which is not one of active, paused"),
        ("kind", "weekly", r"scheduled_tasks\.kind holds 'weekly', which is not one of cron, interval, once"),
        ("context_mode", "shared", r"scheduled_tasks\.context_mode holds 'shared', which is not one of group"),
    ],
)
def test_an_unknown_task_word_is_refused(db: Database, column: str, word: str, refusal: str) -> None:
    now = datetime.now(UTC)
    task = schedules.insert_task(
        db,
        task_id="t1",
        chat_jid=JID,
        prompt="p",
        kind="once",
        spec=now.isoformat(),
        context_mode="group",
        next_run_at=now,
        created_at=now,
    )
    assert schedules.count_tasks(db, JID).active == 1
    _set(db, ScheduledTaskRow, **{column: word})
    for read in (lambda: schedules.list_tasks(db), lambda: schedules.get_task(db, task.id)):
        with pytest.raises(StoreError, match=refusal):
            read()
    if column == "state":
        with pytest.raises(StoreError, match=refusal):
            schedules.count_tasks(db, JID)
