"""The name for a JSON object whose keys are open.

Where the keys are known the code says so (a pydantic model, a msgspec
Struct, a ``TypedDict``); :data:`JsonObject` is for what truly is open.  The
runner's ``agent_runner.protocol.JsonObject`` is the same alias on the
container's side (the runner imports nothing of the host).
"""

from __future__ import annotations

from typing import Any, TypeAlias

# Open on purpose: a message's metadata (legacy keys, envelope extras,
# whatever a client or an import sent), a channel's own config, a group's
# container_config as stored (its schema, ContainerConfig, lives in the
# sandbox room, a floor above the store that keeps it).
JsonObject: TypeAlias = dict[str, Any]
