"""The settings' reference, made from their definitions: each section with its variables,
defaults, bounds and one line of meaning (docs/settings.md is this text;
tests/host/test_settings_doc.py fails when it drifts, and ``scripts/settings_doc.py``
writes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from msgspec import inspect

from orchestrator.core.settings.env import ENV_PREFIX, EnvIndex

HEADER = """# Settings

Every setting is an environment variable (or a line of a `.env` file in the
working directory), read once by `Settings.load`
([`orchestrator/core/settings/`](../orchestrator/core/settings/__init__.py)): the only
reader of the environment. Each room's settings are a section of their own
(`settings.gateway`, `settings.slack`, ...), and a component takes its section. The
variables' names are flat: `ORCHESTRATOR_` and the setting's name, whatever section
holds it; OpenTelemetry's are its standard `OTEL_*` names. A value out of its bounds
stops the process with the variable, its value and what is wrong.

This page is made from the definitions (`python scripts/settings_doc.py` writes it;
`tests/host/test_settings_doc.py` fails when it drifts). A new setting goes into its
room's section (`orchestrator/core/settings/<room>.py`) with its bounds and a one-line
`description`; a default another page quotes is checked against the definition too.
"""


def reference(cls: type[msgspec.Struct], index: EnvIndex) -> str:
    """The whole page for the settings class ``cls``."""
    own = inspect.type_info(cls)
    assert isinstance(own, inspect.StructType)
    parts = [HEADER, "## The installation\n", *_table(own, None, index)]
    for field in own.fields:
        section = _struct(field.type)
        if section is None:
            continue
        doc = " ".join((section.cls.__doc__ or "").split())
        parts += [f"\n## `{field.name}`\n", f"{doc}\n" if doc else "", *_table(section, field.name, index)]
    return "\n".join(p for p in parts if p).rstrip("\n") + "\n"


def _struct(kind: inspect.Type) -> inspect.StructType | None:
    if isinstance(kind, inspect.Metadata):
        kind = kind.type
    return kind if isinstance(kind, inspect.StructType) else None


def _table(struct: inspect.StructType, section: str | None, index: EnvIndex) -> list[str]:
    rows = ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for field in struct.fields:
        if _struct(field.type) is not None:
            continue
        flat = index.flat[(section, field.name)]
        variable = flat.upper() if flat.upper() in index.otel else ENV_PREFIX + flat.upper()
        schema = field.type.extra_json_schema if isinstance(field.type, inspect.Metadata) else None
        meaning = str((schema or {}).get("description", ""))
        kind = field.type.type if isinstance(field.type, inspect.Metadata) else field.type
        rows.append(f"| `{variable}` | {_default(field.default)} | {_allowed(kind)} | {_cell(meaning)} |")
    return rows


def _default(value: Any) -> str:
    if value is msgspec.NODEFAULT:
        return ""
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value is None or value == "":
        return "(empty)"
    return f"`{value}`"


def _allowed(kind: inspect.Type) -> str:
    if isinstance(kind, inspect.LiteralType):
        return ", ".join(f"`{v}`" for v in kind.values)
    if isinstance(kind, inspect.UnionType):
        return " or ".join(_allowed(t) for t in kind.types if not isinstance(t, inspect.NoneType))
    if isinstance(kind, inspect.BoolType):
        return "true / false"
    if isinstance(kind, (inspect.IntType, inspect.FloatType)):
        name = "integer" if isinstance(kind, inspect.IntType) else "number"
        bounds = [
            f"{sign} {_number(v)}"
            for sign, v in ((">", kind.gt), ("≥", kind.ge), ("<", kind.lt), ("≤", kind.le))
            if v is not None
        ]
        return f"{name} {', '.join(bounds)}".strip()
    if isinstance(kind, inspect.StrType):
        return f"text matching `{kind.pattern}`" if kind.pattern else "text"
    if isinstance(kind, inspect.CustomType):
        return "a path" if kind.cls is Path else kind.cls.__name__
    return type(kind).__name__.removesuffix("Type").lower()


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
