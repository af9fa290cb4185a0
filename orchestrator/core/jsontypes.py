"""The names for JSON values: an object whose keys are open, an integer, a boolean.

Where the keys are known the code says so (a pydantic model, a msgspec
Struct, a ``TypedDict``); :data:`JsonObject` is for what truly is open.  The
runner's ``agent_runner.protocol.JsonObject`` is the same alias on the
container's side (the runner imports nothing of the host).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

from pydantic import BeforeValidator, Strict

# Open on purpose: a message's metadata (legacy keys, envelope extras,
# whatever a client or an import sent), a channel's own config, a group's
# container_config as stored (its schema, ContainerConfig, lives in the
# sandbox room, a floor above the store that keeps it).
JsonObject: TypeAlias = dict[str, Any]


def _whole_number(value: object) -> object:
    # JSON has one number type: 3.0 is the integer 3 (as JSON Schema's "integer" says),
    # while true and "3" are no integers at all (pydantic's lax mode would take both).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer in a request body, as JSON and the API's OpenAPI document mean it: a strict int
# (the model's strict config, or Strict()) that takes a whole float.  Bounds go before it,
# ``Annotated[int, Field(ge=1), WHOLE_NUMBER]``: bounds put on such a type from outside reach
# the document as "ge", not JSON Schema's "minimum".
WHOLE_NUMBER = BeforeValidator(_whole_number)
# A boolean in a request body: true or false, not 0, 1 or "yes".
JsonBool: TypeAlias = Annotated[bool, Strict()]
