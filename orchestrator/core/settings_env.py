"""Reading the settings from the environment (``Settings.load``): ``ORCHESTRATOR_*``
variables, OpenTelemetry's standard ``OTEL_*`` ones by their own names, an optional
``.env`` file; converted by msgspec to the declared types and bounds, with an error that
names the variable and its value.  The one reader of the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from orchestrator.core.errors import SettingsError

ENV_PREFIX = "ORCHESTRATOR_"
# Booleans the way people write them in an environment file (msgspec alone
# takes true/false/1/0).
_BOOL_WORDS = {"yes": True, "on": True, "y": True, "t": True, "no": False, "off": False, "n": False, "f": False}

S = TypeVar("S", bound=msgspec.Struct)


def read_settings(
    cls: type[S], *, environ: Mapping[str, str] | None, env_file: str | Path | None, values: Mapping[str, Any]
) -> S:
    """``cls`` from the ``.env`` file (None: none), then ``environ`` (None: the process
    environment), then ``values`` given in code, later sources winning."""
    fields = msgspec.structs.fields(cls)
    names = frozenset(f.name for f in fields)
    # OpenTelemetry's standard variables this object reads (by their own names: an operator's
    # collector set-up uses them for every service).  The SDK reads the rest of the standard's
    # variables itself (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, certificates,
    # OTEL_BSP_*, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER): they tune how the SDK
    # exports, not what this program does, and their meaning is the specification's, which
    # a copy here could only drift from (orchestrator/core/tracing.py).
    otel = frozenset(f.name.upper() for f in fields if f.name.startswith("otel_"))
    booleans = frozenset(f.name for f in fields if f.type is bool)
    raw: dict[str, object] = {}
    sources: list[Mapping[str, str | None]] = []
    if env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values

        sources.append(dotenv_values(env_file, encoding="utf-8"))
    sources.append(os.environ if environ is None else environ)
    for source in sources:
        for key, value in source.items():
            if value is not None and key.upper() in otel:
                raw[key.lower()] = value  # the standard's own name, not ORCHESTRATOR_OTEL_...
            elif value is not None and key.upper().startswith(ENV_PREFIX):
                name = key[len(ENV_PREFIX) :].lower()
                if name in names and name.upper() not in otel:
                    raw[name] = _BOOL_WORDS.get(value.strip().lower(), value) if name in booleans else value
    raw.update(values)
    try:
        return msgspec.convert(raw, cls, strict=False, dec_hook=_decode_path)
    except msgspec.ValidationError as exc:
        raise SettingsError(_config_problem(str(exc), raw)) from exc


def _decode_path(type_: type, value: Any) -> Any:
    # msgspec has no Path type of its own.
    if type_ is Path and isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise NotImplementedError(f"no conversion to {type_!r}")


def _config_problem(message: str, raw: Mapping[str, object]) -> str:
    # msgspec says "Expected `int` >= 1 - at `$.max_tokens`": name the variable and its value.
    what, _, where = message.partition(" - at `$.")
    field = where.rstrip("`")
    if not field:
        return message
    what = what.replace("Expected", "expected", 1)
    return (
        f"{ENV_PREFIX}{field.upper()}={raw[field]!r}: {what}"
        if field in raw
        else f"{ENV_PREFIX}{field.upper()}: {what}"
    )
