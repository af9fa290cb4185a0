"""The store owns the SQL: outside ``orchestrator/store/`` no module imports SQLAlchemy or
the store's table mappings, and no string in it is an SQL statement.

Every ``.py`` under ``orchestrator/`` and ``workers/`` but the store's is parsed (``ast``):
each import, at the top, in a function or under ``TYPE_CHECKING``, and each string literal
(an f-string read with its fields as placeholders).  A failure names the file and line.

A literal is a statement when it starts with SELECT, INSERT, UPDATE, DELETE, WITH or BEGIN
and whitespace (any case), and either that word is in capitals or what follows has a
statement's shape (``select ... from``, ``insert into``, ``update t set``, ``delete from``,
``with x as (``, a lone ``begin``): so ``"with a token"`` and a help text's ``"With
--drain: ..."`` are English, and ``"SELECT 1"`` or ``"select id from runs"`` are SQL.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("orchestrator", "workers")
STORE = "orchestrator/store/"
TABLES = "orchestrator.store.tables"

_KEYWORD = r"^\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH|BEGIN)\s"
_STARTS = re.compile(_KEYWORD, re.IGNORECASE)
_CAPITALS = re.compile(_KEYWORD)
_SHAPED = re.compile(
    r"""^\s*(?:
        select\s.*\bfrom\s
      | insert\s+into\s
      | update\s+"?\w+"?\s+set\s
      | delete\s+from\s
      | with\s+(?:recursive\s+)?\w+\s*(?:\([^)]*\))?\s+as\s*\(
      | begin(?:\s+(?:immediate|deferred|exclusive|transaction))?\s*;?\s*$
    )""",
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)


def is_sql(text: str) -> bool:
    """Whether the string literal ``text`` is an SQL statement (see the module's doc)."""
    return bool(_STARTS.match(text)) and bool(_CAPITALS.match(text) or _SHAPED.match(text))


def _absolute(module: str | None, level: int, package: str) -> str:
    """The module a ``from ... import`` names, relative levels resolved against ``package``."""
    if not level:
        return module or ""
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _is_sqlalchemy(name: str) -> bool:
    return name == "sqlalchemy" or name.startswith("sqlalchemy.")


def _is_tables(name: str) -> bool:
    return name == TABLES or name.startswith(TABLES + ".")


def offences(source: str, rel: str) -> list[str]:  # noqa: C901 - an AST walk: one branch a node kind
    """``rel:line: what`` for each SQLAlchemy import, table-mapping import and SQL literal in ``source``."""
    tree = ast.parse(source, filename=rel)
    module = rel.removesuffix(".py").replace("/", ".")
    package = module.removesuffix(".__init__") if rel.endswith("__init__.py") else module.rpartition(".")[0]
    found: list[str] = []
    in_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            in_fstring.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_sqlalchemy(alias.name):
                    found.append(f"{where}: imports {alias.name}")
                elif _is_tables(alias.name):
                    found.append(f"{where}: imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            source_module = _absolute(node.module, node.level, package)
            if _is_sqlalchemy(source_module):
                found.append(f"{where}: imports from {source_module}")
            elif _is_tables(source_module):
                found.append(f"{where}: imports from {source_module}")
            elif source_module == "orchestrator.store" and any(a.name == "tables" for a in node.names):
                found.append(f"{where}: imports {TABLES}")
        elif isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
            if is_sql(text):
                found.append(f"{where}: SQL text {text[:60]!r}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring:
            if is_sql(node.value):
                found.append(f"{where}: SQL text {node.value[:60]!r}")
    return sorted(found, key=lambda o: int(o.split(":")[1]))


def _modules() -> list[Path]:
    return sorted(
        p for top in TOPS for p in (ROOT / top).rglob("*.py") if not p.relative_to(ROOT).as_posix().startswith(STORE)
    )


def test_no_sql_outside_the_store() -> None:
    modules = _modules()
    assert len(modules) > 50, "the walk found too few modules: is ROOT the repository?"
    found = [o for p in modules for o in offences(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix())]
    assert not found, "SQL outside orchestrator/store/ (move it into a store module):\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for() -> None:
    source = '''
from typing import TYPE_CHECKING
import sqlalchemy
import sqlalchemy.orm as orm
from sqlalchemy import select
from orchestrator.store.tables import GroupRow
from orchestrator.store import tables
from ..store import tables as t
import orchestrator.store.tables
if TYPE_CHECKING:
    from sqlalchemy.orm import Session

def f(x):
    from sqlalchemy.exc import SQLAlchemyError
    a = "SELECT 1"
    b = "update groups set cursor_seq = 1"
    c = f"SELECT {x} FROM groups"
    d = f"select {x} from groups"
    e = """WITH RECURSIVE chats(jid) AS (SELECT 1)"""
    g = "  DELETE FROM messages"
    h = "BEGIN IMMEDIATE"
    return a, b, c, d, e, g, h
'''
    found = offences(source, "orchestrator/run/example.py")
    lines = [int(o.split(":")[1]) for o in found]
    assert lines == [3, 4, 5, 6, 7, 8, 9, 11, 14, 15, 16, 17, 18, 19, 20, 21], found


def test_english_is_not_sql() -> None:
    for text in (
        "With --drain: wait up to this many seconds",
        " with ",
        "with a token",
        "update run_drafts",
        "Select a group",
        "begin the run",
        "Delete the group's folder",
        "SELECTED",
        "",
    ):
        assert not is_sql(text), text
    source = (
        'from orchestrator.store.db import Database\nfrom orchestrator.store import groups\nx = "Update the cursor."\n'
    )
    assert offences(source, "orchestrator/run/example.py") == []
