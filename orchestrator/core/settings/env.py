"""Reading the settings from the environment (``Settings.load``): ``ORCHESTRATOR_*``
variables, OpenTelemetry's standard ``OTEL_*`` ones by their own names, an optional
``.env`` file; converted by msgspec to the declared types and bounds, with an error that
names the variable and its value.  The one reader of the environment.

Variables keep their flat names whatever section reads them (``section.py``): the
:class:`EnvIndex` maps each flat name to its section and field, and back."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args, get_origin

import msgspec

from orchestrator.core.errors import SettingsError
from orchestrator.core.settings.section import Section

ENV_PREFIX = "ORCHESTRATOR_"
# Booleans the way people write them in an environment file (msgspec alone
# takes true/false/1/0).
_BOOL_WORDS = {"yes": True, "on": True, "y": True, "t": True, "no": False, "off": False, "n": False, "f": False}

S = TypeVar("S", bound=msgspec.Struct)


@dataclass(frozen=True)
class Place:
    """Where a flat name lives: ``section`` (None: the settings' own fields) and ``field``."""

    section: str | None
    field: str
    boolean: bool


class EnvIndex:
    """The flat names of a settings class (a Struct of fields and sections), both ways."""

    def __init__(self, cls: type[msgspec.Struct]) -> None:
        self.places: dict[str, Place] = {}
        self.sections: dict[str, type[Section]] = {}
        for f in msgspec.structs.fields(cls):
            kind = _bare(f.type)
            if isinstance(kind, type) and issubclass(kind, Section):
                self.sections[f.name] = kind
                types = {g.name: g.type for g in msgspec.structs.fields(kind)}
                for field, flat in kind.flat_names().items():
                    self.places[flat] = Place(f.name, field, _bare(types[field]) is bool)
            else:
                self.places[f.name] = Place(None, f.name, kind is bool)
        self.flat = {(p.section, p.field): name for name, p in self.places.items()}
        # OpenTelemetry's standard variables this object reads (by their own names: an
        # operator's collector set-up uses them for every service).  The SDK reads the rest of
        # the standard's variables itself (OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION,
        # certificates, OTEL_BSP_*, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER): they tune
        # how the SDK exports, not what this program does, and their meaning is the
        # specification's, which a copy here could only drift from (orchestrator/core/tracing.py).
        self.otel = frozenset(name.upper() for name in self.places if name.startswith("otel_"))

    def nest(self, flat: Mapping[str, object]) -> dict[str, object]:
        """``flat`` values (by flat name, or a whole section by its name) as the settings'
        nested shape."""
        raw: dict[str, Any] = {}
        for name, value in flat.items():
            place = self.places.get(name)
            if place is None and name in self.sections:
                raw[name] = value
            elif place is None:
                raise SettingsError(f"there is no setting {name!r} ({ENV_PREFIX}{name.upper()})")
            elif place.section is None:
                raw[name] = value
            else:
                raw.setdefault(place.section, {})[place.field] = value
        return raw

    def variable(self, path: str) -> str:
        """The variable of a msgspec error's path (``gateway.max_request_bytes``)."""
        section, _, field = path.rpartition(".")
        name = self.flat.get((section or None, field), path.replace(".", "_"))
        return name.upper() if name.upper() in self.otel else ENV_PREFIX + name.upper()


def _bare(kind: Any) -> Any:
    return get_args(kind)[0] if get_origin(kind) is Annotated else kind


def read_settings(
    cls: type[S],
    index: EnvIndex,
    *,
    environ: Mapping[str, str] | None,
    env_file: str | Path | None,
    values: Mapping[str, Any],
) -> S:
    """``cls`` from the ``.env`` file (None: none), then ``environ`` (None: the process
    environment), then ``values`` given in code by flat name, later sources winning."""
    flat: dict[str, object] = {}
    sources: list[Mapping[str, str | None]] = []
    if env_file is not None and Path(env_file).is_file():
        from dotenv import dotenv_values

        sources.append(dotenv_values(env_file, encoding="utf-8"))
    sources.append(os.environ if environ is None else environ)
    for source in sources:
        for key, value in source.items():
            if value is not None and key.upper() in index.otel:
                flat[key.lower()] = value  # the standard's own name, not ORCHESTRATOR_OTEL_...
            elif value is not None and key.upper().startswith(ENV_PREFIX):
                name = key[len(ENV_PREFIX) :].lower()
                place = index.places.get(name)
                if place is not None and name.upper() not in index.otel:
                    flat[name] = _BOOL_WORDS.get(value.strip().lower(), value) if place.boolean else value
    flat.update(values)
    raw = index.nest(flat)
    try:
        return msgspec.convert(raw, cls, strict=False, dec_hook=_decode_path)
    except msgspec.ValidationError as exc:
        raise SettingsError(_config_problem(str(exc), flat, index)) from exc


def _decode_path(type_: type, value: Any) -> Any:
    # msgspec has no Path type of its own.
    if type_ is Path and isinstance(value, (str, os.PathLike)):
        return Path(value)
    raise NotImplementedError(f"no conversion to {type_!r}")


def _config_problem(message: str, flat: Mapping[str, object], index: EnvIndex) -> str:
    # msgspec says "Expected `int` >= 1 - at `$.provider.max_tokens`": name the variable and its value.
    what, _, where = message.partition(" - at `$.")
    path = where.rstrip("`")
    if not path:
        return message
    if path in index.sections:
        return what  # a section's own check (its __post_init__), which names its variables
    what = what.replace("Expected", "expected", 1)
    variable = index.variable(path)
    name = variable.removeprefix(ENV_PREFIX).lower()
    return f"{variable}={flat[name]!r}: {what}" if name in flat else f"{variable}: {what}"
