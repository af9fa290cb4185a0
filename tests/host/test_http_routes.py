"""The API's routes live in their topic modules (orchestrator/http/routes/) and the app only
composes them: no route is a closure, the app module imports no SQLAlchemy, and the channels
that take messages over HTTP import no FastAPI (the HTTP face mounts their routes)."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

from fastapi.routing import APIRoute

import orchestrator.http.routes as routes_package

ROOT = Path(__file__).resolve().parents[2]


def _imported(path: Path) -> set[str]:
    """Every module ``path`` imports (function-level imports too), by its full name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_route_is_a_module_level_function_of_its_topic() -> None:
    topics = [
        importlib.import_module(f"{routes_package.__name__}.{m.name}")
        for m in pkgutil.iter_modules(routes_package.__path__)
    ]
    routes = [route for topic in topics for route in topic.router.routes if isinstance(route, APIRoute)]
    assert len(routes) > 20
    for route in routes:
        assert route.endpoint.__module__.startswith("orchestrator.http.routes."), route.path
        assert "<locals>" not in route.endpoint.__qualname__, route.path


def test_the_app_module_imports_no_sqlalchemy() -> None:
    assert not {m for m in _imported(ROOT / "orchestrator/http/api.py") if m.split(".")[0] == "sqlalchemy"}


def test_the_channels_taking_messages_over_http_import_no_fastapi() -> None:
    for name in ("webhook.py", "slack_inbound.py"):
        imported = _imported(ROOT / "orchestrator/channels" / name)
        assert not {m for m in imported if m.split(".")[0] in ("fastapi", "starlette")}, name
