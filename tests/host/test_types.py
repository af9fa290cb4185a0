"""The code type-checks: mypy, strict, over the host, the workers and the agent runner.

The configuration is ``[tool.mypy]`` in ``pyproject.toml``; mypy keeps its
cache in ``.mypy_cache`` at the repository root (a cold run takes about a
minute, a warm one seconds).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_clean() -> None:
    assert importlib.util.find_spec("mypy"), "mypy is a test dependency: pip install -e '.[test]'"
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-8000:] + res.stderr[-2000:]
