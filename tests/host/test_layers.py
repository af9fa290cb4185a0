"""The house keeps its floors: the layer contract holds and the map in the docs is the tree.

``lint-imports`` reads every import (function-level ones too) and checks the
contracts in ``pyproject.toml``: a room imports only rooms below it, the
agent runner imports nothing of the host, and no room has a cycle.  The
second test holds ``docs/architecture.md``'s module tables against the files.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def test_the_layer_contracts_hold() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a test dependency: pip install -e '.[test]'"
    res = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout, res.stdout[-2000:]


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
