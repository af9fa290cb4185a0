"""The newcomer's docs hold against the tree.

``docs/architecture.md`` and ``docs/start.md`` (and the focused pages they
link to) are read in the first hour, so what they name must exist and what
they say must be how things are now:

* the floors list in architecture.md is the ``layers`` contract of
  ``[tool.importlinter]`` in ``pyproject.toml``, floor by floor (a floor may
  hold independent siblings, written ``"a | b"`` in both places);
* every link to a page under ``docs/`` points at a file that exists, and at a
  heading that exists when it names one;
* every backticked repository path (``orchestrator/run/queue.py``,
  ``scripts/up.sh``, ``tests/host/test_x.py::test_y``) exists, and so does
  every path named in a fenced block (the data-flow diagram);
* architecture.md stays under 600 lines, its module rows say what a module
  is for in one line, and no page tells history ("used to", "issue 12"):
  history belongs in git.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
START = DOCS / "start.md"
# The pages a newcomer is sent to first, and the focused pages they link to
# (docs/performance.md and docs/web.md are kept by their own owners).
PAGES = [ARCHITECTURE, START] + [
    DOCS / name
    for name in (
        "messages.md",
        "protocol.md",
        "runs.md",
        "sandbox.md",
        "fleet.md",
        "recovery.md",
        "traces.md",
        "testing.md",
    )
]
HOUSE = "## The house: rooms and modules"
MAX_LINES = 600
MAX_ROW_TEXT = 160
HISTORY = re.compile(r"\bused to\b|\bno longer\b|\bare gone\b|\bwas removed\b|\bpreviously\b|\bissue \d+", re.I)
# Top-level folders whose paths the docs name; a backticked token under one of them is a path.
TOP = ("orchestrator", "workers", "container", "tests", "fakes", "scripts", "docs", "bench", "deploy", ".ci")
PATH_TOKEN = re.compile(rf"^(?:{'|'.join(re.escape(t) for t in TOP)})/[A-Za-z0-9_./-]*$")
PATH_IN_TEXT = re.compile(rf"(?<![\w./-])(?:{'|'.join(re.escape(t) for t in TOP)})/[A-Za-z0-9_./-]*[A-Za-z0-9_/]")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    assert heading in text, f"no section {heading!r}"
    return text.split(heading, 1)[1].split("\n## ", 1)[0]


# -- (a) the floors ------------------------------------------------------------------------


def _siblings(floor: str) -> frozenset[str]:
    """``"a | b"`` (independent siblings) or ``"a : b"`` (siblings) -> {"a", "b"}."""
    return frozenset(part.strip() for part in re.split(r"[|:]", floor) if part.strip())


def contract_floors(pyproject: str) -> list[frozenset[str]]:
    """The layers of the layers contract in ``[tool.importlinter]``, from the ground up."""
    config = tomllib.loads(pyproject)["tool"]["importlinter"]
    layered = [c for c in config["contracts"] if c.get("type") == "layers"]
    assert len(layered) == 1, f"expected one layers contract in pyproject.toml, found {len(layered)}"
    return [_siblings(layer) for layer in reversed(layered[0]["layers"])]


def _module(path: str) -> str:
    """``orchestrator/core/`` -> ``orchestrator.core``; ``orchestrator/root.py`` -> ``orchestrator.root``."""
    path = path.strip().rstrip("/")
    return path.removesuffix(".py").replace("/", ".")


def doc_floors(architecture: str) -> list[frozenset[str]]:
    """The numbered floors list of the house section, from the ground up: each item opens with
    its floor's folders or modules in backticks, siblings separated by ``|``."""
    floors = []
    for line in _section(architecture, HOUSE).splitlines():
        item = re.match(r"^\d+\.\s+((?:`[^`]+`\s*\|\s*)*`[^`]+`)", line)
        if item:
            floors.append(frozenset(_module(p) for p in re.findall(r"`([^`]+)`", item.group(1))))
    return floors


def test_the_floors_list_is_the_layer_contract() -> None:
    doc = doc_floors(_text(ARCHITECTURE))
    contract = contract_floors((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert doc, "architecture.md's house section has no numbered floors list"

    def show(floors: list[frozenset[str]]) -> list[str]:
        return [" | ".join(sorted(floor)) for floor in floors]

    assert show(doc) == show(contract), "docs/architecture.md's floors differ from pyproject.toml's layers"


def test_the_floor_parsers_read_siblings_and_catch_a_difference() -> None:
    pyproject = '[tool.importlinter]\n[[tool.importlinter.contracts]]\ntype = "layers"\nlayers = ["c", "a | b", "z"]\n'
    assert contract_floors(pyproject) == [{"z"}, {"a", "b"}, {"c"}]
    doc = f"{HOUSE}\n\n1. `z/`: the ground.\n2. `a/` | `b.py`: two siblings.\n3. `c/`: the top.\n\n## Next\n"
    assert doc_floors(doc) == contract_floors(pyproject)
    swapped = doc.replace("1. `z/`", "1. `c/`").replace("3. `c/`", "3. `z/`")
    assert doc_floors(swapped) != contract_floors(pyproject)


# -- (b) links ---------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", _text(page))
    return {_slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*$", text, flags=re.M)}


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """Links from ``page`` (its ``text``, if given) to pages under docs/ whose file, or
    heading, does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", _text(page) if text is None else text)):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        name, _, anchor = target.partition("#")
        linked = (page.parent / name).resolve() if name else page
        if not linked.is_relative_to(DOCS) or linked.suffix != ".md":
            continue
        if not linked.is_file():
            broken.append(target)
        elif anchor and anchor not in _anchors(linked):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_docs_link_leads_somewhere(page: Path) -> None:
    assert page.is_file(), f"{page.relative_to(ROOT)} is missing"
    assert broken_links(page) == []


def test_a_broken_link_is_found() -> None:
    probe = "# Probe\n\n[a](nowhere.md), [b](start.md#no-such-heading), [c](start.md#tests), [d](https://x.org/y.md)\n"
    assert broken_links(START, probe) == ["nowhere.md", "start.md#no-such-heading"]


# -- (c) paths ----------------------------------------------------------------------------


def named_paths(text: str) -> set[str]:
    """Repository paths a page names: backticked tokens under a top-level folder, and paths in
    fenced blocks; a test id's ``::name`` is left off."""
    paths = set()
    for token in re.findall(r"`([^`\n]+)`", FENCE.sub("", text)):
        token = token.split("::", 1)[0]
        if PATH_TOKEN.match(token):
            paths.add(token)
    for block in FENCE.findall(text):
        paths.update(PATH_IN_TEXT.findall(block))
    return paths


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_named_path_exists(page: Path) -> None:
    assert page.is_file(), f"{page.relative_to(ROOT)} is missing"
    missing = sorted(p for p in named_paths(_text(page)) if not (ROOT / p.rstrip("/")).exists())
    assert missing == [], f"{page.name} names paths that do not exist"


def test_a_missing_path_is_found() -> None:
    text = "See `orchestrator/run/queue.py`, `tests/host/test_docs.py::test_x`, `data/groups/<folder>`, `/workspace`.\n"
    text += "```\n  └─ step        orchestrator/run/no_such_module.py\n```\n"
    assert named_paths(text) == {
        "orchestrator/run/queue.py",
        "tests/host/test_docs.py",
        "orchestrator/run/no_such_module.py",
    }


# -- (d) size, rows, tense ---------------------------------------------------------------


def test_architecture_is_read_in_an_hour() -> None:
    lines = _text(ARCHITECTURE).count("\n")
    assert lines < MAX_LINES, f"docs/architecture.md has {lines} lines; move detail to a focused page"
    long_rows = [
        (path, len(what))
        for path, what in re.findall(r"^\| `([^`]+)` \| (.*) \|$", _section(_text(ARCHITECTURE), HOUSE), flags=re.M)
        if len(what) > MAX_ROW_TEXT
    ]
    assert long_rows == [], f"module rows say what a module is for in one line (≤ {MAX_ROW_TEXT} characters)"


def history_told(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if HISTORY.search(line)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_say_how_things_are_now(page: Path) -> None:
    assert page.is_file(), f"{page.relative_to(ROOT)} is missing"
    assert history_told(_text(page)) == [], f"{page.name} tells history; it belongs in git"


def test_history_is_found() -> None:
    told = "The sweeper used to run.\nIt is fine.\nSee issue 30.\nThe cache is no longer kept.\nPreviously, X."
    assert history_told(told) == [
        "The sweeper used to run.",
        "See issue 30.",
        "The cache is no longer kept.",
        "Previously, X.",
    ]


def test_the_package_docstring_names_every_public_name() -> None:
    import orchestrator

    doc = orchestrator.__doc__ or ""
    public = doc.split("Public API::", 1)[1].split("\n\n", 2)[1]
    named = set(re.findall(r"\b[A-Za-z_]\w*\b", public)) - {"from", "import", "orchestrator"}
    assert set(orchestrator.__all__) <= named, sorted(set(orchestrator.__all__) - named)
