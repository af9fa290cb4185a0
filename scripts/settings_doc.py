"""Write docs/settings.md from the settings' definitions (orchestrator/core/settings/)."""

from pathlib import Path

from orchestrator.core.settings.reference import reference
from orchestrator.core.settings.whole import ENV_INDEX, Settings

page = Path(__file__).resolve().parents[1] / "docs" / "settings.md"
page.write_text(reference(Settings, ENV_INDEX), encoding="utf-8")
print(f"wrote {page}")
