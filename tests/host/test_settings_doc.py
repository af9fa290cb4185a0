"""docs/settings.md is made from the settings' definitions, and the defaults other pages
quote are the settings' own: both fail here when they drift."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.core.settings.reference import reference
from orchestrator.core.settings.whole import ENV_INDEX, Settings

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "settings.md"
# "`ORCHESTRATOR_DEAD_HOST_S` (120 s)", "`ORCHESTRATOR_MAX_RUN_EVENTS` (2,000)", "(`0.05` s)":
# a variable followed by a parenthesis that opens with a quantity.
QUOTED = re.compile(
    r"`((?:ORCHESTRATOR|OTEL)_[A-Z0-9_]+)`,? \((`?)(\d[\d,]*(?:\.\d+)?)\2 ?(ms|s|h|KiB|MiB|GiB)?(?=[;,)]| the default)"
)
UNITS = {None: 1.0, "s": 1.0, "ms": 0.001, "h": 3600.0, "KiB": 1024.0, "MiB": 1024.0**2, "GiB": 1024.0**3}


def test_the_settings_page_is_made_from_the_definitions() -> None:
    made = reference(Settings, ENV_INDEX)
    assert PAGE.read_text(encoding="utf-8") == made, "docs/settings.md drifted: run `python scripts/settings_doc.py`"


def test_every_variable_is_on_the_page_once() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for flat in ENV_INDEX.places:
        variable = flat.upper() if flat.upper() in ENV_INDEX.otel else f"ORCHESTRATOR_{flat.upper()}"
        assert text.count(f"| `{variable}` |") == 1, variable


def quoted_defaults(text: str) -> list[tuple[str, float, object]]:
    """Each quoted default in ``text`` that is not the setting's: (variable, quoted, default)."""
    wrong = []
    defaults = Settings.load(environ={}, env_file=None)
    for variable, _, number, unit in QUOTED.findall(text):
        flat = variable.removeprefix("ORCHESTRATOR_").lower()
        if flat not in ENV_INDEX.places:
            continue
        default = defaults.value_of(flat)
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            continue
        quoted = float(number.replace(",", "")) * UNITS[unit or None]
        if abs(quoted - float(default)) > 1e-9:
            wrong.append((variable, quoted, default))
    return wrong


@pytest.mark.parametrize("page", sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"]), ids=lambda p: p.name)
def test_a_quoted_default_is_the_settings_own(page: Path) -> None:
    assert quoted_defaults(page.read_text(encoding="utf-8")) == []


def test_a_wrong_quoted_default_is_found() -> None:
    text = "every `ORCHESTRATOR_RECOVERY_INTERVAL_S` (2 s; one small read) and `ORCHESTRATOR_MAX_RUN_EVENTS` (2,000)"
    assert quoted_defaults(text) == [("ORCHESTRATOR_RECOVERY_INTERVAL_S", 2.0, 0.5)]
    assert quoted_defaults("`ORCHESTRATOR_FILE_MAX_BYTES` (25 MiB) and `ORCHESTRATOR_QUESTION_TTL_S` (24 h)") == []
