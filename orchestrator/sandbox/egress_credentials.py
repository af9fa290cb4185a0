"""Brokered credentials: secrets the egress proxy adds to a group's requests to their hosts,
so they never enter the sandbox.

The installation names them in ``ORCHESTRATOR_EGRESS_CREDENTIALS``, a JSON list::

    [{"name": "github", "hosts": ["github.com", "api.github.com"],
      "header": "Authorization", "value": "Bearer ghp_...",
      "methods": ["GET", "HEAD"], "path_prefixes": ["/repos/acme/"]}]

and a group's network policy names the ones it gets (``credentials: ["github"]``;
``--network allowlist:...,credential:github``); their hosts are then on its allowlist.  A
request to such a host is intercepted (TLS ended by the proxy with a certificate of the
installation's CA, ``sandbox/egress_ca.py``); the header is set (replacing any the sandbox
sent), and a request outside the credential's methods or path prefixes is refused: its path
normalised first, once (``sandbox/request_paths.py``: a dot segment, an encoded slash, and the
like refused), then held to the prefixes by whole segments, and the normalised path is the one
sent upstream.  The prefixes are normalised the same way when the setting is read.  The
values are secrets like the other secret settings: masked in every log line and message,
never in a container's input, environment, files or output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from orchestrator.core.errors import SettingsError
from orchestrator.sandbox.request_paths import PathRefused, origin_target, path_under

NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
HOST_PATTERN = r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_HEADER = re.compile(r"^[A-Za-z0-9-]{1,64}$")


class BrokeredCredential(BaseModel):
    """One secret bound to hosts (see the module's doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    hosts: Annotated[list[Annotated[str, Field(pattern=HOST_PATTERN)]], Field(min_length=1, max_length=32)]
    header: Annotated[str, Field(pattern=_HEADER.pattern)] = "Authorization"
    value: Annotated[str, Field(min_length=1, max_length=8192, pattern=r"^[^\r\n\x00]*$")]
    methods: list[str] | None = None
    path_prefixes: list[Annotated[str, Field(pattern=r"^/[^\s]*$")]] | None = None

    @field_validator("path_prefixes")
    @classmethod
    def _normal_prefixes(cls, prefixes: list[str] | None) -> list[str] | None:
        # In the spelling a request's path is compared in (a prefix with %7E matches ~).
        if prefixes is None:
            return None
        out: list[str] = []
        for prefix in prefixes:
            try:
                normal = origin_target(prefix)
            except PathRefused as exc:
                raise ValueError(f"the path prefix {prefix!r}: {exc}") from None
            if normal.query is not None:
                raise ValueError(f"the path prefix {prefix!r} holds a query (?)")
            out.append(normal.path)
        return out

    def refusal(self, method: str, path: str) -> str | None:
        """Why a request may not carry this credential (None: it may).  ``path``: the request's,
        as :func:`~orchestrator.sandbox.request_paths.origin_target` normalised it (its query,
        if given, is not looked at); a prefix holds it by whole segments
        (:func:`~orchestrator.sandbox.request_paths.path_under`)."""
        if self.methods is not None and method.upper() not in self.methods:
            return f"the credential {self.name!r} is for {', '.join(self.methods)} only, not {method}"
        bare = path.split("?", 1)[0]
        if self.path_prefixes is not None and not any(path_under(bare, p) for p in self.path_prefixes):
            return f"the credential {self.name!r} is for paths under {', '.join(self.path_prefixes)} only"
        return None


_CREDENTIALS = TypeAdapter(list[BrokeredCredential])


def parse_credentials(text: str) -> list[BrokeredCredential]:
    """ORCHESTRATOR_EGRESS_CREDENTIALS as typed credentials; SettingsError naming the problem
    (never the values)."""
    if not text.strip():
        return []
    try:
        found = _CREDENTIALS.validate_python(json.loads(text))
    except json.JSONDecodeError as exc:
        raise SettingsError(f"ORCHESTRATOR_EGRESS_CREDENTIALS is not JSON: {exc.msg} at {exc.pos}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        # The error's input may be the secret itself: only where it is and what is wrong.
        raise SettingsError(f"ORCHESTRATOR_EGRESS_CREDENTIALS[{where}]: {first['msg']}") from None
    names = [c.name for c in found]
    if len(set(names)) != len(names):
        raise SettingsError("ORCHESTRATOR_EGRESS_CREDENTIALS names a credential twice")
    return found


def brokered_hosts(credentials: Sequence[BrokeredCredential], names: Sequence[str]) -> dict[str, BrokeredCredential]:
    """Host -> the credential a group with ``names`` gets for it (a host named by two: the first)."""
    chosen = [c for c in credentials if c.name in names]
    out: dict[str, BrokeredCredential] = {}
    for credential in chosen:
        for host in credential.hosts:
            out.setdefault(host, credential)
    return out
