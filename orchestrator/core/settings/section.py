"""What every section of the settings shares: its variables' names and a ``repr`` that
shows no secret.

A section is a room's settings (``settings.gateway``, ``settings.slack``, ...).  Its fields
are read from the variables of today's flat names: ``ORCHESTRATOR_`` + :attr:`Section.prefix`
+ the field's name (``gateway.max_request_bytes`` is ``ORCHESTRATOR_GATEWAY_MAX_REQUEST_BYTES``),
except the fields of :attr:`Section.unprefixed`, whose variable is ``ORCHESTRATOR_`` + their
name (``files.public_base_url`` is ``ORCHESTRATOR_PUBLIC_BASE_URL``).  Those flat names are
also what ``Settings.load`` and ``Settings.replace`` take as keywords.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from orchestrator.core.settings.secrets import masked


class Section(msgspec.Struct, kw_only=True):
    prefix: ClassVar[str] = ""
    unprefixed: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def flat_names(cls) -> dict[str, str]:
        """Each field's flat name (its variable's, lower case, without ``ORCHESTRATOR_``)."""
        return {
            f.name: f.name if f.name in cls.unprefixed else cls.prefix + f.name for f in msgspec.structs.fields(cls)
        }

    def __repr__(self) -> str:
        # Settings end up in tracebacks, debug prints and error reports: the secrets never do.
        shown = (f"{field}={masked(flat, getattr(self, field))!r}" for field, flat in self.flat_names().items())
        return f"{type(self).__name__}({', '.join(shown)})"
