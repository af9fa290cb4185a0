"""No production module over 600 lines: a module that big does several jobs, and the
next feature makes it bigger (docs/architecture.md, "Rooms and modules").  Migrations are
history, kept as written."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 600


def oversized(base: Path, rooms: list[str]) -> dict[str, int]:
    """The modules under ``base``'s ``rooms`` over :data:`LIMIT` lines, by path: their lines."""
    found = {}
    for room in rooms:
        for path in sorted((base / room).rglob("*.py")):
            if "migrations" in path.parts or "__pycache__" in path.parts:
                continue
            lines = path.read_text(encoding="utf-8").count("\n")
            if lines > LIMIT:
                found[str(path.relative_to(base))] = lines
    return found


def test_no_production_module_is_over_600_lines() -> None:
    assert oversized(ROOT, ["orchestrator", "workers", "container"]) == {}


def test_a_long_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "room" / "migrations").mkdir(parents=True)
    (tmp_path / "room" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "room" / "short.py").write_text("x = 1\n" * LIMIT)
    (tmp_path / "room" / "migrations" / "old.py").write_text("x = 1\n" * (LIMIT * 2))
    assert oversized(tmp_path, ["room"]) == {"room/long.py": LIMIT + 1}
