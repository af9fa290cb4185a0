"""The house keeps its floors: the layer contract holds and the map in the docs is the tree.

``lint-imports`` reads every import (function-level ones too) and checks the
contracts in ``pyproject.toml``: a room imports only rooms below it, the
agent runner imports nothing of the host and the host nothing of the runner
but its protocol, and no room has a cycle.  The contracts cannot be gone
around: every room is on a floor (a new one fails here until it is placed),
and every module loaded by its name (``tests/host/loaded_by_name.py``), which
import-linter cannot see, exists, loads and is one its loader may import.
The last test holds ``docs/architecture.md``'s module tables against the files.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grimp
import pytest

from tests.host.loaded_by_name import LOADED_BY_NAME, NOT_LOADS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PYPROJECT = ROOT / "pyproject.toml"
# Top-level packages that hold to contracts of their own rather than to the floors: the agent
# runner runs in the container (a protected package, imported by the host only for its protocol).
CONTAINER_SIDE = {"agent_runner"}
# Packages at the checkout's root that are not shipped: they drive the product from outside.
NOT_SHIPPED = {"tests", "bench", "fakes"}
# Packages import-linter reads that are not shipped: the test doubles, held away from the product.
LINTED_NOT_SHIPPED = {"fakes"}


def test_the_layer_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a test dependency: pip install -e '.[test]'"
    res = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout, res.stdout[-2000:]


def _linter() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return config


def _contracts(kind: str) -> list[dict[str, Any]]:
    return [c for c in _linter()["contracts"] if c["type"] == kind]


def test_every_room_is_on_a_floor() -> None:
    # A room the floors do not name is held to nothing: it could import anything and
    # anything could import it.  Rooms: each package and module directly under
    # orchestrator/, and each top-level package (those shipped, and any other at the root).
    config = tomllib.loads(PYPROJECT.read_text())
    shipped = {p for p in config["tool"]["setuptools"]["packages"] if "." not in p}
    on_disk = {p.parent.name for p in ROOT.glob("*/__init__.py")} - NOT_SHIPPED
    assert on_disk <= shipped, f"packages at the root that are not shipped: {sorted(on_disk - shipped)}"
    assert shipped | LINTED_NOT_SHIPPED == set(_linter()["root_packages"]), "import-linter sees only its root_packages"
    house = ROOT / "orchestrator"
    room_packages = {f"orchestrator.{d.name}" for d in house.iterdir() if (d / "__init__.py").exists()}
    room_modules = {f"orchestrator.{f.stem}" for f in house.glob("*.py") if f.stem != "__init__"}
    top = shipped - {"orchestrator"} - CONTAINER_SIDE
    [floors] = _contracts("layers")
    named = {n.strip().strip("()") for layer in floors["layers"] for n in re.split(r"[|:]", layer)}
    unplaced = sorted((room_packages | room_modules | top) - named)
    assert not unplaced, f"rooms on no floor of {floors['name']!r} in pyproject.toml: {unplaced}"
    # Each room package (and the house) has no cycle inside it either.
    acyclic = {a for c in _contracts("acyclic_siblings") for a in c["ancestors"]}
    unchecked = sorted(({"orchestrator"} | room_packages | top | CONTAINER_SIDE) - acyclic)
    assert not unchecked, f"rooms not in the 'no cycles inside a room' contract: {unchecked}"
    # The container's side is protected: nothing of the host imports it but what the contract lets through.
    protected = {m for c in _contracts("protected") for m in c["protected_modules"]}
    assert CONTAINER_SIDE <= protected, f"not protected: {sorted(CONTAINER_SIDE - protected)}"


# -- modules loaded by their name ----------------------------------------------------------


@pytest.fixture(scope="module")
def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*_linter()["root_packages"], include_external_packages=False, cache_dir=None)


def _broken_contracts(graph: grimp.ImportGraph, extra: Iterable[tuple[str, str]]) -> list[str]:
    """The contracts of pyproject.toml that ``graph`` breaks once the ``extra`` imports are in it
    (checked by import-linter itself, as ``lint-imports`` does)."""
    from importlinter import Contract, configuration
    from importlinter.application.use_cases import read_user_options
    from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
    from importlinter.contracts.forbidden import ForbiddenContract
    from importlinter.contracts.independence import IndependenceContract
    from importlinter.contracts.layers import LayersContract
    from importlinter.contracts.protected import ProtectedContract

    kinds: dict[str, Callable[..., Contract]] = {
        "layers": LayersContract,
        "forbidden": ForbiddenContract,
        "protected": ProtectedContract,
        "independence": IndependenceContract,
        "acyclic_siblings": AcyclicSiblingsContract,
    }
    configuration.configure()
    options = read_user_options(str(PYPROJECT))
    graph = copy.deepcopy(graph)
    for importer, imported in extra:
        graph.add_import(importer=importer, imported=imported, line_number=0, line_contents="loaded by name")
    broken = []
    for contract_options in options.contracts_options:
        contract = kinds[contract_options["type"]](
            name=contract_options["name"], session_options=options.session_options, contract_options=contract_options
        )
        if not contract.check(copy.deepcopy(graph), verbose=False).kept:
            broken.append(contract.name)
    return broken


def _module_of(target: str) -> str:
    return target.partition(":")[0]


def test_modules_loaded_by_name_are_ones_their_loaders_may_import(import_graph: grimp.ImportGraph) -> None:
    assert _broken_contracts(import_graph, []) == []
    for entry in LOADED_BY_NAME:
        loader = entry.loader
        edges = [(loader, _module_of(t)) for t in entry.targets if loader is not None and loader != _module_of(t)]
        if not edges:
            continue
        missing = [m for _, m in edges if m not in import_graph.modules]
        assert not missing, f"{entry.where} loads modules that do not exist: {missing}"
        broken = _broken_contracts(import_graph, edges)
        if entry.exception:
            assert broken, f"{entry.where}: {entry.targets} now keeps every contract; drop its exception"
        else:
            assert not broken, f"{entry.where} loads {entry.targets} by name ({entry.how}), which breaks {broken}"


def test_each_single_import_a_contract_ignores_still_happens(import_graph: grimp.ImportGraph) -> None:
    # Wildcard exceptions are permissions (the host may read the protocol); one naming a single
    # import is a debt, and goes once the import does.
    stale = [
        ignored
        for contract in _linter()["contracts"]
        for ignored in contract.get("ignore_imports", [])
        if "*" not in ignored
        and not import_graph.direct_import_exists(
            importer=ignored.partition("->")[0].strip(), imported=ignored.partition("->")[2].strip()
        )
    ]
    assert not stale, f"ignore_imports in pyproject.toml that no code makes any more: {stale}"


LOADS_EACH = r"""
import importlib, json, sys
failed = {}
for target in json.loads(sys.argv[1]):
    module, _, attr = target.partition(":")
    try:
        loaded = importlib.import_module(module)
        if attr:
            getattr(loaded, attr)
    except Exception as exc:  # noqa: BLE001 - each failure is reported by name
        failed[target] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


def test_each_module_loaded_by_name_exists_and_loads(tmp_path: Path) -> None:
    # In a process of its own: loading workers.app's app builds a worker's root from the
    # environment (its data dir here a scratch one).
    targets = sorted({t for entry in LOADED_BY_NAME for t in entry.targets})
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCHESTRATOR_")}
    env["ORCHESTRATOR_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-c", LOADS_EACH, json.dumps(targets)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {}


def test_the_list_of_modules_loaded_by_name_is_the_code() -> None:
    # The tables the loaders read are the list's targets.
    import orchestrator
    from orchestrator.channels import registry

    [lazy] = [e for e in LOADED_BY_NAME if e.where == "orchestrator/__init__.py"]
    resolved = {f"orchestrator{module}:{name}" for name, module in orchestrator._LAZY.items()}
    assert resolved == set(lazy.targets)
    plugins = {
        _module_of(t) for e in LOADED_BY_NAME if e.where == "orchestrator/channels/registry.py" for t in e.targets
    }
    assert set(registry._RENAMED.values()) <= plugins
    # Console scripts and entry points are loaded by name.
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    declared = set(project.get("scripts", {}).values()) | {
        v for group in project.get("entry-points", {}).values() for v in group.values()
    }
    scripts = {t for e in LOADED_BY_NAME if e.where == "pyproject.toml" for t in e.targets}
    assert declared == scripts
    # Every file that loads by name, or writes a module's full name, is in the list.
    unlisted = []
    for path, calls, names in _names_written():
        entries = [e for e in LOADED_BY_NAME if e.where == path]
        if calls and not entries:
            unlisted.append(f"{path}: loads modules by name ({', '.join(sorted(calls))})")
        # Written as a module alone, or as the module and the attribute loaded from it.
        listed = {_split(t) for e in entries for t in e.targets}
        covered = listed | {(module, "") for module, _ in listed} | {_split(n) for n, _ in NOT_LOADS.get(path, ())}
        unlisted += [f"{path}: {written!r}" for written, split in names if split not in covered]
    assert not unlisted, "not in tests/host/loaded_by_name.py: " + "; ".join(unlisted)


_LOAD_CALLS = {"import_module", "__import__", "find_spec", "symbol_by_name", "instantiate", "import_from_cwd"}
_NAME = re.compile(r"(orchestrator|workers|agent_runner)(\.\w+)+(:\w+)?")


def _is_module(name: str) -> bool:
    parts = name.split(".")
    base = ROOT / ("container" if parts[0] == "agent_runner" else "") / Path(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _split(name: str) -> tuple[str, str]:
    """``pkg.module.attr`` or ``pkg.module:attr`` as (the longest module of ours it starts with,
    the rest); the module is ("", name) when only a top-level package matches."""
    parts = name.replace(":", ".").split(".")
    for end in range(len(parts), 1, -1):
        if _is_module(".".join(parts[:end])):
            return ".".join(parts[:end]), ".".join(parts[end:])
    return "", name


def _names_written() -> list[tuple[str, set[str], list[tuple[str, tuple[str, str]]]]]:
    """For each host file: the load-by-name calls it makes, and the strings it writes that name
    a module of ours below a top-level package (with what follows it: an attribute)."""
    found = []
    for top in ("orchestrator", "workers"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            calls: set[str] = set()
            names: list[tuple[str, tuple[str, str]]] = []
            tree = ast.parse(path.read_text(), rel)
            logger_names: set[int] = set()  # getLogger("orchestrator.store.migrations"): a name, not a load
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    func = node.func
                    called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                    if called in _LOAD_CALLS:
                        calls.add(called)
                    elif called == "getLogger":
                        logger_names.update(id(arg) for arg in node.args)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in logger_names:
                    split = _split(node.value) if _NAME.fullmatch(node.value) else ("", "")
                    if split[0]:
                        names.append((node.value, split))
            if calls or names:
                found.append((rel, calls, names))
    return found


def _mapped_paths() -> list[str]:
    section = DOC.read_text().split("## The house: rooms and modules", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)


def _code_files() -> set[str]:
    files = set()
    for top in ("orchestrator", "workers", "container/agent_runner"):
        for p in (ROOT / top).rglob("*.py"):
            rel = p.relative_to(ROOT).as_posix()
            if "/migrations/versions/" in rel or (p.name == "__init__.py" and rel != "orchestrator/__init__.py"):
                continue
            files.add(rel)
    return files


def test_the_module_map_is_the_tree() -> None:
    mapped = _mapped_paths()
    assert mapped, "docs/architecture.md has no module tables under 'The house: rooms and modules'"
    missing_on_disk = [p for p in mapped if not (ROOT / p.rstrip("/")).exists()]
    assert not missing_on_disk, f"the map names files that do not exist: {missing_on_disk}"
    # A folder row covers its files only below a room (migrations/, providers/,
    # tools/): a room's own modules each need a row of their own.
    rooms = {"orchestrator/", "workers/", "container/agent_runner/"} | {
        f"orchestrator/{d.name}/" for d in (ROOT / "orchestrator").iterdir() if (d / "__init__.py").exists()
    }
    folders = [p for p in mapped if p.endswith("/") and p not in rooms]
    unmapped = sorted(f for f in _code_files() if f not in mapped and not any(f.startswith(d) for d in folders))
    assert not unmapped, f"modules missing from docs/architecture.md: {unmapped}"
