"""The exception tree (orchestrator/core/errors.py) held to the package and to its drawing.

Every module of ``orchestrator`` and ``workers`` is imported (in a child process: importing
them all here would leave their Celery apps, metrics and settings behind for the other
tests), and the tree is walked from ``OrchestratorError`` all the way down.  Each class
found must be (a) defined in ``orchestrator.core.errors``; (b) drawn in that module's
docstring, under its real parent, and the drawing must hold no other class; (c) drawn with
the modules that raise it, in brackets, each an existing module whose source names the
class.  The exceptions outside the tree must be named in the paragraph after the drawing.
Each check is also fed a wrong input, so that it is seen to fail.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import orchestrator.core.errors

ROOT = Path(__file__).resolve().parents[2]
ERRORS = "orchestrator.core.errors"
# The migration scripts: alembic loads them by path, one per schema revision.
SKIPPED = ("orchestrator.store.migrations.versions.",)
# Alembic's env script runs only inside alembic (it reads alembic.context.config on import).
CANNOT_IMPORT = {"orchestrator.store.migrations.env"}


# --- the survey: every module imported, the tree walked ------------------------------------


def below(root: type) -> list[type]:
    """Every subclass of ``root`` at any depth, each once, parents before their children."""
    found: list[type] = []
    todo = list(root.__subclasses__())
    while todo:
        cls = todo.pop(0)
        if cls not in found:
            found.append(cls)
            todo.extend(cls.__subclasses__())
    return found


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def survey() -> dict[str, object]:
    """Import every module of the two packages, then describe the tree and the other
    exceptions the packages define (what the child process prints as JSON)."""
    import orchestrator
    import workers

    failed: dict[str, str] = {}
    imported: list[str] = []
    for package in (orchestrator, workers):
        walk = pkgutil.walk_packages(
            package.__path__, f"{package.__name__}.", onerror=lambda n: failed.setdefault(n, "?")
        )
        for info in walk:
            if info.name.startswith(SKIPPED):
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # noqa: BLE001 - reported, and the test says which may fail
                failed[info.name] = f"{type(exc).__name__}: {exc}"
            else:
                imported.append(info.name)
    root = orchestrator.core.errors.OrchestratorError
    tree = [{"name": c.__name__, "module": c.__module__, "bases": [_name(b) for b in c.__bases__]} for c in below(root)]
    others = [
        {"name": c.__name__, "module": c.__module__}
        for c in below(BaseException)
        if c.__module__.split(".")[0] in ("orchestrator", "workers") and not issubclass(c, root)
    ]
    return {"failed": failed, "imported": imported, "tree": tree, "others": others}


@pytest.fixture(scope="module")
def surveyed() -> dict[str, object]:
    code = "import json; from tests.host.test_errors import survey; print(json.dumps(survey()))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return found


def _tree(surveyed: dict[str, object]) -> list[dict[str, object]]:
    tree = surveyed["tree"]
    assert isinstance(tree, list)
    return tree


# --- the checks, each a function of its input ----------------------------------------------


def stray(tree: list[dict[str, object]]) -> list[str]:
    """(a) The classes of the tree defined outside orchestrator.core.errors."""
    return [f"{c['name']} is defined in {c['module']}" for c in tree if c["module"] != ERRORS]


@dataclass(frozen=True)
class Drawn:
    parent: str | None
    text: str  # what the drawing says of the class, its lines joined


_BRANCH = re.compile(r"^(?P<rails>(?:│   |    )*)[├└]── (?P<name>\w+)(?P<text>.*)$")
_TOP = re.compile(r"^(?P<name>\w+)(?P<text>.*)$")
_BRACKETS = re.compile(r"\[([^\]]*)\]")
_MODULE = re.compile(r"^[a-z_]+(?:\.[a-z_]+)+$")


def drawing_of(doc: str) -> list[str]:
    """The literal block after the docstring's first ``::``, dedented."""
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.rstrip().endswith("::")), None)
    if start is None:
        raise ValueError("no drawing (no '::' block)")
    block = lines[start + 1 :]
    while block and not block[0].strip():
        block.pop(0)
    indent = len(block[0]) - len(block[0].lstrip(" ")) if block else 0
    if indent == 0:
        raise ValueError("no drawing (the '::' block is not indented)")
    drawing: list[str] = []
    for line in block:
        if not line.startswith(" " * indent):
            break
        drawing.append(line[indent:])
    return drawing


def parse_drawing(doc: str) -> dict[str, Drawn]:
    """Each drawn class with its parent (the name one level up the rails) and its text."""
    texts: dict[str, list[str]] = {}
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in drawing_of(doc):
        branch = _BRANCH.match(line)
        if branch is not None:
            depth = len(branch["rails"]) // 4 + 1
            if depth > len(stack):
                raise ValueError(f"{branch['name']} is drawn deeper than a class above it: {line!r}")
            name, parent, text = branch["name"], stack[depth - 1], branch["text"]
        elif not stack:
            top = _TOP.match(line)
            if top is None:
                raise ValueError(f"the drawing starts with no class: {line!r}")
            depth, name, parent, text = 0, top["name"], None, top["text"]
        elif line.startswith(("│", " ")):
            texts[stack[-1]].append(line.lstrip("│ "))  # the lines under a class go on with its text
            continue
        else:
            raise ValueError(f"neither a branch nor a line under one (a second top?): {line!r}")
        if name in texts:
            raise ValueError(f"{name} is drawn twice")
        stack = [*stack[:depth], name]
        texts[name], parents[name] = [text.strip()], parent
    return {name: Drawn(parents[name], " ".join(t for t in texts[name] if t)) for name in texts}


def drawing_mismatches(drawn: dict[str, Drawn], tree: list[dict[str, object]], top: str) -> list[str]:
    """(b) The classes found and not drawn, drawn and not found, or drawn under a class that
    is none of their bases."""
    problems: list[str] = []
    found = {str(c["name"]): c for c in tree}
    tops = [name for name, d in drawn.items() if d.parent is None]
    if tops != [top]:
        problems.append(f"the drawing's top is {tops}, not {top}")
    problems += [f"{name} is not drawn" for name in found if name not in drawn]
    problems += [f"{name} is drawn but no such class" for name in drawn if name not in found and name != top]
    for name, c in found.items():
        parent = drawn[name].parent if name in drawn else None
        bases = c["bases"]
        assert isinstance(bases, list)
        if parent is not None and f"{ERRORS}.{parent}" not in bases:
            problems.append(f"{name} is drawn under {parent}, but its bases are {bases}")
    return problems


def raiser_problems(drawn: dict[str, Drawn], root: Path) -> list[str]:
    """(c) The drawn classes naming no module that raises them (in one pair of brackets), or
    a module that does not exist or whose source does not name the class."""
    problems: list[str] = []
    for name, d in drawn.items():
        if d.parent is None:
            continue  # the root: raised as itself nowhere
        brackets = _BRACKETS.findall(d.text)
        if len(brackets) != 1:
            problems.append(f"{name}: {len(brackets)} pairs of brackets, not one naming its modules")
            continue
        for module in (m.strip() for m in brackets[0].split(",")):
            if not _MODULE.match(module):
                problems.append(f"{name}: {module!r} is no module name (room.module)")
                continue
            base = root / "orchestrator" / Path(*module.split("."))
            path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
            if path is None:
                problems.append(f"{name}: no module orchestrator.{module}")
            elif not re.search(rf"\b{name}\b", path.read_text(encoding="utf-8")):
                problems.append(f"{name}: orchestrator.{module} does not name it")
    return problems


def unlisted(others: list[dict[str, object]], doc: str) -> list[str]:
    """The exceptions outside the tree that the paragraph after the drawing does not name."""
    after = doc.split("\n".join("    " + line for line in drawing_of(doc)), 1)[-1]
    return [f"{o['name']} ({o['module']})" for o in others if f"``{o['name']}``" not in after]


# --- the tree as it is ---------------------------------------------------------------------

DOC = orchestrator.core.errors.__doc__ or ""


def test_every_module_imports(surveyed: dict[str, object]) -> None:
    failed, imported = surveyed["failed"], surveyed["imported"]
    assert isinstance(failed, dict) and isinstance(imported, list)
    assert set(failed) <= CANNOT_IMPORT, failed
    assert {"orchestrator.core.errors", "orchestrator.cli.api_client", "workers.tasks"} <= set(imported)
    assert len(imported) > 100


def test_every_error_is_defined_in_core_errors(surveyed: dict[str, object]) -> None:
    tree = _tree(surveyed)
    assert len(tree) > 30  # the walk went below the root's children
    assert stray(tree) == []


def test_the_drawing_has_every_class_under_its_parent(surveyed: dict[str, object]) -> None:
    assert drawing_mismatches(parse_drawing(DOC), _tree(surveyed), "OrchestratorError") == []


def test_the_drawing_names_the_modules_raising_each_class() -> None:
    assert raiser_problems(parse_drawing(DOC), ROOT) == []


def test_the_exceptions_outside_the_tree_are_named_as_a_modules_own(surveyed: dict[str, object]) -> None:
    others = surveyed["others"]
    assert isinstance(others, list) and others  # the walk finds them: the check has something to check
    assert unlisted(others, DOC) == []


# --- each check fails on a wrong input -----------------------------------------------------


class _Top(Exception):
    pass


class _Child(_Top):
    pass


class _Grandchild(_Child):
    pass


class _Other(_Top):
    pass


class _Both(_Grandchild, _Other):  # below two classes of the tree: found once
    pass


def test_the_walk_goes_all_the_way_down_and_finds_each_class_once() -> None:
    assert below(_Top) == [_Child, _Other, _Grandchild, _Both]


def _entry(name: str, bases: list[str], module: str = ERRORS) -> dict[str, object]:
    return {"name": name, "module": module, "bases": bases}


def test_a_class_defined_outside_core_errors_is_reported() -> None:
    tree = [_entry("Fine", [f"{ERRORS}.Top"]), _entry("Away", [f"{ERRORS}.Top"], module="orchestrator.store.slots")]
    assert stray(tree) == ["Away is defined in orchestrator.store.slots"]


WRONG = """Errors::

    Top
    ├── Store          the store [store.db]
    │   ├── Missing    a row that is not there, drawn
    │   │              under the store [store.runs, store.nowhere]
    │   └── Elsewhere  drawn under Store, a child of Top [store.db]
    └── Drawn          no such class (store.db)

The others: ``_Own``.
"""


def test_the_parser_reads_each_parent_from_the_depth_and_joins_the_lines() -> None:
    drawn = parse_drawing(WRONG)
    assert {name: d.parent for name, d in drawn.items()} == {
        "Top": None,
        "Store": "Top",
        "Missing": "Store",
        "Elsewhere": "Store",
        "Drawn": "Top",
    }
    assert drawn["Missing"].text == "a row that is not there, drawn under the store [store.runs, store.nowhere]"


def test_a_wrong_drawing_is_reported() -> None:
    tree = [
        _entry("Store", [f"{ERRORS}.Top"]),
        _entry("Missing", [f"{ERRORS}.Store", "builtins.LookupError"]),
        _entry("Elsewhere", [f"{ERRORS}.Top"]),
        _entry("Undrawn", [f"{ERRORS}.Top"]),
    ]
    assert drawing_mismatches(parse_drawing(WRONG), tree, "Top") == [
        "Undrawn is not drawn",
        "Drawn is drawn but no such class",
        f"Elsewhere is drawn under Store, but its bases are ['{ERRORS}.Top']",
    ]
    assert drawing_mismatches(parse_drawing(WRONG), tree, "OrchestratorError")[0].startswith("the drawing's top")


@pytest.mark.parametrize(
    ("drawing", "problem"),
    [
        ("Top\n│   └── Deep  x [a.b]", "Deep is drawn deeper"),
        ("Top\n├── Twice  x [a.b]\n└── Twice  y [a.b]", "Twice is drawn twice"),
        ("├── Orphan  x [a.b]", "Orphan is drawn deeper"),
        ("Top\nSecond  x [a.b]", "a second top"),
    ],
)
def test_a_malformed_drawing_is_refused(drawing: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_drawing("Errors::\n\n" + "".join(f"    {line}\n" for line in drawing.splitlines()))


def test_raisers_that_are_missing_or_wrong_are_reported(tmp_path: Path) -> None:
    (tmp_path / "orchestrator" / "store").mkdir(parents=True)
    (tmp_path / "orchestrator" / "store" / "db.py").write_text("raise Store('x')\nraise Elsewhere('y')\n")
    (tmp_path / "orchestrator" / "store" / "runs.py").write_text("raise Other()\n")
    assert raiser_problems(parse_drawing(WRONG), tmp_path) == [
        "Missing: orchestrator.store.runs does not name it",
        "Missing: no module orchestrator.store.nowhere",
        "Drawn: 0 pairs of brackets, not one naming its modules",
    ]


def test_an_exception_outside_the_tree_the_paragraph_does_not_name_is_reported() -> None:
    others: list[dict[str, object]] = [
        {"name": "_Own", "module": "orchestrator.sandbox.quota"},
        {"name": "Store", "module": "orchestrator.run.expand"},  # drawn, but not in the paragraph
    ]
    assert unlisted(others, WRONG) == ["Store (orchestrator.run.expand)"]
