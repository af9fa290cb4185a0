"""The code passes the project's linter (pyflakes errors, import order, bugbear)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_is_clean() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "orchestrator", "workers", "container", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_code_is_formatted() -> None:
    """``ruff format --check``: one layout, so diffs show changes, not re-wrapping."""
    res = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr
