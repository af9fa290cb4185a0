"""What every protocol Struct shares: unknown fields refused, ``to_json`` and ``replace``.

Also the names both sides use for JSON whose keys are open (:data:`JsonObject`) and for
a document that does not fit the protocol (:data:`ProtocolError`).  msgspec, not
pydantic: every cold run starts a fresh interpreter in a fresh container, and importing
pydantic and building these models cost about 230 ms of that start (msgspec: ~15 ms;
docs/performance.md).  Structs validate when decoded (``decode_input``, ``parse_event``),
not when constructed in code.
"""

from __future__ import annotations

from typing import Any, TypeAlias, TypeVar

import msgspec

# A JSON object whose keys are open: a message's metadata (legacy keys and
# extras ride along), a tool call's input (each tool reads its own), an
# envelope on the wire (checked by the host on its own, see ToolResultEvent).
# Everything with a fixed set of keys has a Struct (or a TypedDict) of its own.
JsonObject: TypeAlias = dict[str, Any]

# Raised by the protocol's decoders on malformed JSON or a document that does not
# fit the model (msgspec.ValidationError is a DecodeError).
ProtocolError = msgspec.DecodeError

_S = TypeVar("_S", bound="Model")
_F = TypeVar("_F", bound="FrozenModel")


class Model(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    # Unknown fields are a protocol error, not something to silently drop.

    def to_json(self) -> bytes:
        return ENCODER.encode(self)

    def replace(self: _S, **changes: Any) -> _S:
        return msgspec.structs.replace(self, **changes)


class FrozenModel(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    # Model, immutable.  A root of its own, not a subclass of Model: msgspec
    # would allow that, but type checkers hold Structs to the dataclass rule
    # (a frozen class under a mutable one is an error).  Its subclasses say
    # frozen=True again for the same reason (msgspec inherits it anyway).

    def to_json(self) -> bytes:
        return ENCODER.encode(self)

    def replace(self: _F, **changes: Any) -> _F:
        return msgspec.structs.replace(self, **changes)


ENCODER = msgspec.json.Encoder()
