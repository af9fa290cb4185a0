"""Markers for what a test needs, given at collection so that nobody has to remember them.

``docker``, ``browser``, ``postgres``, ``redis`` and ``integration`` (registered in
pyproject.toml's ``[tool.pytest.ini_options]``; ``./scripts/test.sh --quick`` runs the tests
with none of them).  A test gets a marker from:

* where it lives: everything under ``tests/integration/`` is ``integration``;
* the fixtures it uses (the whole closure, so a fixture built on ``stack`` counts):
  :data:`FIXTURES`;
* its parameters: ``db_backend=postgresql`` (the ``[postgresql]`` half of a database test)
  is ``postgres``; ``stack=fleet`` and ``broker=redis`` are ``postgres``/``redis``;
* the service probes it calls, found in the code of the test, of its fixtures and of the
  helpers of ``tests/`` they call, followed through calls (:data:`PROBES`).  A test that
  probes Redis itself (``require_service(redis_available(), ...)``) is ``redis`` though no
  fixture says so.

A marker a test writes itself (``@pytest.mark.docker``) is kept.  The quick tier is checked
by running it with the services pointed at closed ports under ``CI=true``, where a test whose
service is missing fails: a failure there is a missed marker (docs/testing.md).
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

NEEDS = ("docker", "browser", "postgres", "redis", "integration")
# The quick tier: what needs none of them.
QUICK = " and ".join(f"not {name}" for name in NEEDS)

INTEGRATION_DIR = Path(__file__).parent / "integration"

# Fixtures that need a service, by name (wherever they are defined).
FIXTURES: dict[str, tuple[str, ...]] = {
    # tests/integration/conftest.py: the images are built on the engine; a stack's workers start containers.
    "agent_image": ("docker",),
    "claude_code_image": ("docker",),
    "faulty_image": ("docker",),
    "stack": ("docker",),
    # tests/host/test_database_faults.py: a PostgreSQL cluster of its own, from the server's binaries.
    "private_pg": ("postgres",),
    # tests/web_browser.py: headless Chromium.
    "browser": ("browser",),
    "page": ("browser",),
}

# Parameter values that need a service, by parameter name.
PARAMS: dict[str, dict[str, tuple[str, ...]]] = {
    "db_backend": {"postgresql": ("postgres",)},
    "stack": {"fleet": ("postgres", "redis")},
    "broker": {"redis": ("redis",)},
}

# Fixtures whose needs follow their parameter (above), not their code (which serves every value).
BY_PARAM = frozenset({"database_url", "stack"})

# Names whose use means a service: the probes of tests/conftest.py and tests/web_browser.py,
# and docker-py's ``from_env`` (it asks the engine its API version at once).
PROBES: dict[str, tuple[str, ...]] = {
    "docker_available": ("docker",),
    "from_env": ("docker",),
    "redis_available": ("redis",),
    "pg_available": ("postgres",),
    "fresh_pg_database": ("postgres",),
    "chromium_path": ("browser",),
}


def _code_names(code: types.CodeType) -> set[str]:
    """The global and attribute names a code object (and the functions nested in it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _is_ours(obj: Any) -> bool:
    """Defined in ``tests/`` or ``fakes/`` (a module's own name for a module)."""
    name = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return (name or "").split(".")[0] in ("tests", "fakes")


def _codes(obj: Any) -> Iterable[tuple[types.CodeType, dict[str, Any]]]:
    """The code objects of a function, or of a class's methods, with their globals."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(obj, types.FunctionType):
        yield obj.__code__, obj.__globals__
    elif isinstance(obj, type):
        for member in vars(obj).values():
            member = getattr(member, "__func__", member)
            if isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType):
                yield member.__code__, member.__globals__


def _needs_of(obj: Any, in_progress: set[types.CodeType] | None = None) -> set[str]:
    """The services ``obj``'s code probes, following the helpers of ``tests/`` and ``fakes/`` it names (each
    code object read once; in a cycle of helpers, the one met again is not followed)."""
    in_progress = set() if in_progress is None else in_progress
    needs: set[str] = set()
    for code, glob in _codes(obj):
        cached = _CACHE.get(code)
        if cached is not None:
            needs |= cached
            continue
        if code in in_progress:
            continue
        in_progress.add(code)
        found: set[str] = set()
        names = _code_names(code)
        # A helper named directly, or as an attribute of a module of tests/ (``quota_support.x``).
        scopes = [glob] + [vars(m) for m in map(glob.get, names) if isinstance(m, types.ModuleType) and _is_ours(m)]
        for name in names:
            found.update(PROBES.get(name, ()))
            for scope in scopes:
                target = scope.get(name)
                if _is_ours(target) and (inspect.isfunction(target) or inspect.isclass(target)):
                    found |= _needs_of(target, in_progress)
        in_progress.discard(code)
        _CACHE[code] = frozenset(found)
        needs |= found
    return needs


_CACHE: dict[types.CodeType, frozenset[str]] = {}


def needs(item: pytest.Item) -> set[str]:
    """What ``item`` needs (the markers :func:`apply` gives it)."""
    found: set[str] = set()
    if Path(str(item.path)).is_relative_to(INTEGRATION_DIR):
        found.add("integration")
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    names: list[str] = list(fixtureinfo.names_closure) if fixtureinfo is not None else []
    for name in names:
        found.update(FIXTURES.get(name, ()))
        if name in BY_PARAM:
            continue
        for fixturedef in fixtureinfo.name2fixturedefs.get(name, ()) if fixtureinfo is not None else ():
            if _is_ours(fixturedef.func):
                found |= _needs_of(fixturedef.func)
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        for param, value in callspec.params.items():
            if isinstance(value, str):
                found.update(PARAMS.get(param, {}).get(value, ()))
    function = getattr(item, "function", None)
    if function is not None:
        found |= _needs_of(function)
    return found


def apply(items: list[pytest.Item]) -> None:
    for item in items:
        for name in sorted(needs(item)):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)
